"""The `bfcl` env: BFCL's single-turn categories as one-turn tool-calling tasks, scored by BFCL.

Each row shows the model its own functions (the row's `tools`, rendered by the model family's
chat template; or BFCL's system prompt with `prompt_style: bfcl`). The episode ends after the
first model turn: its calls are recorded on the trajectory (status `not_run`: BFCL's single-turn
categories are scored, never executed) and the reward is BFCL's AST / relevance verdict.

Splits: `test` and `train` are category lists (by default train on the `live_` categories and
report on the non-live ones); `train` also drops every entry that shares a function name or a
question with `test` (split.py), and prints how many, and takes its categories in turn; a category
name is a split of its own. Multi-turn categories are the `bfcl_multi_turn` env's (multi_turn_env.py).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rlfactory.chat.base import Answer, Malformed, ParseResult, ToolCalls
from rlfactory.envs.base import Env
from rlfactory.envs.bfcl.data import PromptStyle, load_category, resolve_categories
from rlfactory.envs.bfcl.score import Decoded, Verdict, answer_calls, check, decode_prompting
from rlfactory.envs.bfcl.shaping import shaping_terms, type_terms
from rlfactory.envs.bfcl.split import without_report
from rlfactory.envs.registry import register_env
from rlfactory.rewards.base import RewardScore
from rlfactory.tools.base import MALFORMED, NOT_RUN
from rlfactory.trajectory import Status, ToolCallRecord, Trajectory

TRAIN_CATEGORIES = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple", "live_irrelevance")
TEST_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")
NOT_RUN_NOTE = "BFCL single-turn: calls are scored, not run"


def decoded_of(trajectory: Trajectory) -> Decoded:
    """The first model turn's calls in BFCL's form (`[{name: arguments}]`), or its decode error."""
    first = [c for c in trajectory.tool_calls if c.turn == 1]
    if not first and trajectory.status == "truncated" and trajectory.info.get("prompt_style") == "bfcl":
        # cut off by max_new_tokens, the turn was never parsed; BFCL decodes whatever was written
        return decode_prompting(trajectory.model_text())
    bad = next((c for c in first if c.status == MALFORMED), None)
    if bad is not None:
        return Decoded(error=bad.error or "malformed call")
    return Decoded(calls=[{c.name: c.arguments} for c in first])


def verdict_of(trajectory: Trajectory) -> Verdict:
    """BFCL's verdict on a finished bfcl trajectory (the row is in `trajectory.info`)."""
    return check(trajectory.info, decoded_of(trajectory))


class BfclReward:
    """`correct`: 1.0 when BFCL's checker accepts the first turn's calls, else 0.0; plus the shaping
    terms `format`, `name_match`, `arg_match` (shaping.py), each weighted by `shaping` in the total,
    and `type_match` weighted by `type_shaping` (0, 0: the total is BFCL's verdict alone; accuracy
    always reads `correct`)."""

    def __init__(self, shaping: float = 0.0, type_shaping: float = 0.0) -> None:
        self.shaping = float(shaping)
        self.type_shaping = float(type_shaping)

    async def score(self, trajectory: Trajectory) -> RewardScore:
        correct = float(verdict_of(trajectory).valid)
        decoded = decoded_of(trajectory)
        terms = shaping_terms(trajectory.info, decoded)
        total = correct + self.shaping * sum(terms.values())
        if self.type_shaping:
            typed = type_terms(trajectory.info, decoded)
            terms |= typed
            total += self.type_shaping * typed["type_match"]
        return RewardScore(total, {"correct": correct, **terms})


@register_env("bfcl")
class BfclEnv(Env):
    """Options: `prompt_style` (`tools`: the model's chat template with the row's functions as tools;
    `bfcl`: BFCL's system prompt, calls written as `[f(a=1)]`, for models without tool support),
    `test_categories` / `train_categories` (lists or comma-separated; aliases `simple`, `live`,
    `non_live`, `all`), `limit` (entries per category; None: all), `test_limit` (entries per
    category of the test split; default `limit`), `shaping` (weight of each ToolRL-style shaping
    term in the reward; 0), `type_shaping` (weight of the `type_match` term: arguments of the type
    the schema declares; 0), `train_max_chars` (train on entries whose functions (as JSON) and
    question are at most this many characters; None: all), `train_limits` (a mapping from a train
    category to the most of its entries the train split keeps, the first ones, after the size
    filter: the mix GRPO's shuffled passes see; categories not named keep all), `family` (unused).
    The train split leaves out what it shares with the whole of the test categories, whatever
    `test_limit` shows, and takes the categories in turn (its first rows mix them all)."""

    name = "bfcl"
    max_turns = 1

    def __init__(self, *, prompt_style: PromptStyle = "tools", test_categories: Any = TEST_CATEGORIES,
                 train_categories: Any = TRAIN_CATEGORIES, limit: int | None = None,
                 test_limit: int | None = None, shaping: float = 0.0, type_shaping: float = 0.0,
                 train_max_chars: int | None = None,
                 train_limits: dict[str, int] | None = None, family: str | None = None,
                 **options: Any) -> None:
        super().__init__(**options)
        if options:
            raise TypeError(f"bfcl env: unknown option(s) {', '.join(sorted(options))}")
        if prompt_style not in ("tools", "bfcl"):
            raise ValueError(f"bfcl env: prompt_style must be 'tools' or 'bfcl', not {prompt_style!r}")
        self.prompt_style: PromptStyle = prompt_style
        self.splits = {"test": resolve_categories(test_categories), "train": resolve_categories(train_categories)}
        self.limit = limit
        self.test_limit = limit if test_limit is None else test_limit
        self.shaping = float(shaping)
        self.type_shaping = float(type_shaping)
        self.train_max_chars = train_max_chars
        self.train_limits = dict(train_limits or {})
        unknown = sorted(set(self.train_limits) - set(self.splits["train"]))
        if unknown:
            raise ValueError(f"bfcl env: train_limits names {', '.join(unknown)}, not a train category "
                             f"({', '.join(self.splits['train'])})")
        bad = {c: n for c, n in self.train_limits.items() if not isinstance(n, int) or isinstance(n, bool) or n < 0}
        if bad:
            raise ValueError(f"bfcl env: train_limits takes a count of entries (an integer >= 0) per category, not {bad}")
        self._loaded: dict[str, list[dict[str, Any]]] = {}

    def load_split(self, split: str) -> list[dict[str, Any]]:
        if split not in self._loaded:  # once per env: the split check prints its line once
            self._loaded[split] = self._load(split)
        return [dict(row) for row in self._loaded[split]]

    def _load(self, split: str) -> list[dict[str, Any]]:
        categories = self.splits.get(split)
        if categories is None:
            try:
                categories = resolve_categories(split)
            except ValueError as e:
                raise ValueError(f"bfcl env: split {split!r} is neither train, test nor a category ({e})") from None
        limit = self.test_limit if split == "test" else self.limit
        rows = [row for c in categories for row in load_category(c, self.prompt_style, limit)]
        if split == "train" and self.splits["test"]:
            report = [r for c in self.splits["test"] for r in load_category(c, self.prompt_style)]
            rows, line = without_report(rows, report)
            print(line, file=sys.stderr)
        if split == "train" and self.train_max_chars is not None:
            kept = [r for r in rows if _size(r) <= self.train_max_chars]
            print(f"bfcl split: {len(kept)} of {len(rows)} train entries are at most env.options.train_max_chars="
                  f"{self.train_max_chars} characters (functions and question)", file=sys.stderr)
            rows = kept
        if split == "train" and self.train_limits:
            rows = _capped(rows, self.train_limits)
            counts = {c: sum(r["category"] == c for r in rows) for c in self.splits["train"]}
            print("bfcl split: train entries by category after env.options.train_limits: "
                  + ", ".join(f"{c} {n}" for c, n in counts.items()), file=sys.stderr)
        return _interleave(rows) if split == "train" else rows

    def reset(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        return [dict(m) for m in row["messages"]]

    def reward(self) -> BfclReward:
        return BfclReward(self.shaping, self.type_shaping)

    def end_episode(self, trajectory: Trajectory, turn: ParseResult) -> Status | None:
        """One turn: record what it called (decoding a `bfcl`-style answer with BFCL's decoder), end."""
        turn_no = trajectory.turns
        if isinstance(turn, ToolCalls):
            trajectory.tool_calls += [_scored(c.name, c.arguments, turn_no) for c in turn.calls]
        elif isinstance(turn, Malformed):
            trajectory.tool_calls.append(_malformed(turn.reason, turn_no))
        elif isinstance(turn, Answer) and self.prompt_style == "bfcl":
            decoded = decode_prompting(turn.text)
            if decoded.error is not None:
                # BFCL counts an undecodable reply as "no call" (right for irrelevance, wrong elsewhere)
                trajectory.tool_calls.append(_malformed(decoded.error, turn_no))
            for call in decoded.calls:
                for name, args in call.items():
                    trajectory.tool_calls.append(_scored(name, args, turn_no))
        return "ok"

    def solve(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """The possible answer as one assistant turn (no call for irrelevance: a short refusal)."""
        truth = row.get("ground_truth")
        if any(m.get("role") == "assistant" for m in row["messages"]):  # a demonstration has one model turn
            raise ValueError(f"bfcl solver: {row['id']}: the question already holds an assistant turn")
        if not truth:
            refusal = "None of the given functions can be used for this."
            return self.reset(row) + [{"role": "assistant", "content": refusal}]
        calls = answer_calls(truth)
        verdict = check(row, Decoded(calls))
        if not verdict.valid:  # a few possible answers allow no value BFCL's checker takes
            raise ValueError(f"bfcl solver: {row['id']}: BFCL rejects the possible answer ({verdict.error_type})")
        if self.prompt_style == "tools":
            _check_schemas(row, calls)
        if self.prompt_style == "bfcl":
            return self.reset(row) + [{"role": "assistant", "content": prompting_text(calls)}]
        tool_calls = [{"type": "function", "function": {"name": name, "arguments": args}}
                      for c in calls for name, args in c.items()]
        return self.reset(row) + [{"role": "assistant", "content": "", "tool_calls": tool_calls}]


def _interleave(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows one category after another in turn (keeping each one's order), so that the first
    rows of the train split, which a warm start's demonstrations take, mix every category."""
    by_category: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_category.setdefault(row["category"], []).append(row)
    queues = list(by_category.values())
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


def _capped(rows: list[dict[str, Any]], limits: dict[str, int]) -> list[dict[str, Any]]:
    """Each category's first `limits[category]` rows (all for a category not named), in order."""
    seen: dict[str, int] = {}
    kept = []
    for row in rows:
        c = row["category"]
        seen[c] = seen.get(c, 0) + 1
        if c not in limits or seen[c] <= limits[c]:
            kept.append(row)
    return kept


def _size(row: dict[str, Any]) -> int:
    return len(json.dumps(row["functions"], ensure_ascii=False)) + len(str(row["question"]))


def _scored(name: str, arguments: Any, turn: int) -> ToolCallRecord:
    return ToolCallRecord(name, arguments, NOT_RUN, 0.0, turn=turn, error=NOT_RUN_NOTE)


def _malformed(reason: str, turn: int) -> ToolCallRecord:
    return ToolCallRecord("", None, MALFORMED, 0.0, turn=turn, error=reason[:200])


def prompting_text(calls: list[dict[str, Any]]) -> str:
    """Calls written the way BFCL's prompt asks for them: `[f(a=1, b='x'), g()]`."""
    parts = [f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})" for c in calls for name, args in c.items()]
    return "[" + ", ".join(parts) + "]"


def _check_schemas(row: dict[str, Any], calls: list[dict[str, Any]]) -> None:
    """ValueError when a call's arguments break the JSON schema the model is shown (some possible
    answers hold None for a string): such a demonstration would teach calls a validator refuses."""
    from rlfactory.tools.validation import ArgumentValidator

    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in row.get("tools") or []}
    for call in calls:
        for name, args in call.items():
            validator = ArgumentValidator.for_schema(name, schemas.get(name, {}))
            problem = validator.error(args) if validator is not None else None
            if problem is not None:
                raise ValueError(f"bfcl solver: {row['id']}: the possible answer breaks {name}'s schema: {problem}")
