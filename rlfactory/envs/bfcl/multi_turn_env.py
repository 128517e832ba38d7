"""The `bfcl_multi_turn` env: BFCL's multi-turn categories as multi-turn rollouts on BFCL's own
executable backends (file system, messaging, trading, travel, vehicle, ...).

One trajectory is one BFCL entry: the first user turn opens it; each time the model answers (a turn
without tool calls) the env gives BFCL's next user turn (`next_user_turn`), until the entry's turns
are done. The model's calls run on backend instances of that trajectory's own, made and driven by
bfcl-eval's `execute_multi_turn_func_call` (its `_load_scenario` of the entry's initial config,
long-context scenarios for `multi_turn_long_context`), so state carries across turns as BFCL's
inference does. The reward `correct` is BFCL's state and response checks at the end
(`check_multi_turn`: its `multi_turn_checker` replays the ground truth on fresh instances).

As BFCL's FC inference, with three differences the engine's contract asks for:
- `multi_turn_miss_func`: at the turn BFCL names (`missed_function`), the held-out functions become
  available. BFCL recompiles its tool list; a prompt already rendered cannot change, so the user
  turn shows them instead, as BFCL's prompting style does (`DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING`
  with the functions as JSON-schema tools).
- A call that does not parse is an error observation the model may recover from (BFCL ends the
  user turn there); every model turn counts as a step of BFCL's per-turn limit
  (`MAXIMUM_STEP_LIMIT`, 20), past which the trajectory ends `truncated` (BFCL's force-quit).
- Only functions of the entry run, with identifier argument names: bfcl-eval `eval`s a call string,
  so anything else (a name like `__import__('os').system`) is refused as an error observation.

bfcl-eval keeps backend instances in a module's globals named by model, entry and class. Each
trajectory runs under a model name of its own and its instances are removed when it ends (its last
user turn answered, the env ending it, or, for any other end, when its task is gone).
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any

from rlfactory.chat.base import ParseResult, ToolCalls
from rlfactory.envs.base import Env, Message
from rlfactory.envs.bfcl.data import openai_tools
from rlfactory.envs.bfcl.multi_turn import check_multi_turn, load_multi_turn, to_call_strings
from rlfactory.envs.bfcl.package import MODEL_NAME, bfcl
from rlfactory.envs.registry import register_env
from rlfactory.rewards.base import RewardScore
from rlfactory.tools.base import OK, ToolCall, ToolResult
from rlfactory.trajectory import Status, Trajectory

MULTI_TURN_CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")


@dataclass
class _Episode:
    """One trajectory's conversation: where it is, and the name its backend instances live under."""

    trajectory: Trajectory
    name: str = field(default_factory=lambda: f"{MODEL_NAME}_{uuid.uuid4().hex}")
    user_turn: int = 0
    """BFCL's turn index the model is answering."""
    steps: int = 0
    """Model turns with calls in this user turn."""


def _forget_instances(name: str) -> None:
    """Remove the backend instances bfcl-eval keeps in its module globals under model `name`."""
    space = vars(bfcl().multi_turn)["execute_multi_turn_func_call"].__globals__
    for key in [k for k in space if k.startswith(name)]:
        del space[key]


def calls_per_turn(trajectory: Trajectory) -> list[list[list[str]]]:
    """The calls that ran, per BFCL turn, per step, as BFCL's call strings. A model turn without
    any call record is an answer: it closes its user turn (a new one follows unless it was the
    last model turn). Calls that were not run (refused, over the per-turn limit) are left out."""
    by_turn: dict[int, list[Any]] = {}
    for record in trajectory.tool_calls:
        by_turn.setdefault(record.turn, []).append(record)
    turns: list[list[list[str]]] = [[]]
    for k in range(1, trajectory.turns + 1):
        records = by_turn.get(k)
        if records is None:
            if k < trajectory.turns:
                turns.append([])
            continue
        ran = [{r.name: r.arguments} for r in records if r.status == OK]
        turns[-1].append(to_call_strings(ran) if ran else [])
    return turns


class BfclMultiTurnReward:
    """`correct`: 1.0 when BFCL's state and response checkers accept the trajectory's calls."""

    async def score(self, trajectory: Trajectory) -> RewardScore:
        correct = float(check_multi_turn(trajectory.info, calls_per_turn(trajectory)).valid)
        return RewardScore(correct, {"correct": correct})


@register_env("bfcl_multi_turn")
class BfclMultiTurnEnv(Env):
    """Options: `test_categories` / `train_categories` (lists or comma-separated multi-turn
    categories; test: the four, train: none: BFCL has no live multi-turn set), `limit` (entries
    per category; None: all), `steps_per_turn` (BFCL's MAXIMUM_STEP_LIMIT unless set), `family`
    (unused)."""

    name = "bfcl_multi_turn"
    max_turns = 64
    """Model turns over the whole conversation (4-6 user turns of a few steps each)."""

    def __init__(self, *, test_categories: Any = MULTI_TURN_CATEGORIES, train_categories: Any = (),
                 limit: int | None = None, steps_per_turn: int | None = None, family: str | None = None,
                 prompt_style: str = "tools", **options: Any) -> None:
        super().__init__(**options)
        if options:
            raise TypeError(f"bfcl_multi_turn env: unknown option(s) {', '.join(sorted(options))}")
        if prompt_style != "tools":
            raise ValueError("bfcl_multi_turn env: only prompt_style 'tools' (the model's chat template with "
                             f"the functions as tools) is supported, not {prompt_style!r}")
        self.splits = {"test": _categories(test_categories), "train": _categories(train_categories)}
        self.limit = limit
        self.steps_per_turn = int(steps_per_turn or bfcl().prompts.MAXIMUM_STEP_LIMIT)
        self._episodes: weakref.WeakKeyDictionary[asyncio.Task[Any], _Episode] = weakref.WeakKeyDictionary()

    # ---- rows ------------------------------------------------------------------------------

    def load_split(self, split: str) -> list[dict[str, Any]]:
        categories = self.splits.get(split)
        if categories is None:
            try:
                categories = _categories(split)
            except ValueError as e:
                raise ValueError(f"bfcl_multi_turn env: split {split!r} is neither train, test nor a category ({e})") from None
        return [_row(r) for c in categories for r in load_multi_turn(c, self.limit)]

    def reset(self, row: dict[str, Any]) -> list[Message]:
        return copy.deepcopy(row["turns"][0])

    def info(self, row: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in row.items() if k != "tools"}  # the entry holds the functions already

    def reward(self) -> BfclMultiTurnReward:
        return BfclMultiTurnReward()

    # ---- episodes -----------------------------------------------------------------------------

    def _episode(self, trajectory: Trajectory | None) -> _Episode:
        # The engine runs each trajectory in its own task, and calls end_episode, step and
        # next_user_turn from it: the task names the trajectory whose backends a step drives.
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("bfcl_multi_turn: called outside a trajectory's rollout task")
        episode = self._episodes.get(task)
        if episode is None or (trajectory is not None and episode.trajectory is not trajectory):
            if trajectory is None:
                raise RuntimeError("bfcl_multi_turn: a step before its trajectory's first end_episode call")
            episode = self._episodes[task] = _Episode(trajectory)
            weakref.finalize(task, _forget_instances, episode.name)
        return episode

    def end_episode(self, trajectory: Trajectory, turn: ParseResult) -> Status | None:
        episode = self._episode(trajectory)
        if isinstance(turn, ToolCalls) and turn.calls:
            episode.steps += 1
            if episode.steps > self.steps_per_turn:  # BFCL force-quits the entry here
                _forget_instances(episode.name)
                trajectory.error = f"BFCL turn {episode.user_turn}: more than {self.steps_per_turn} steps"
                return "truncated"
        return None

    async def step(self, calls: list[ToolCall], runner: Any) -> list[ToolResult]:
        episode = self._episode(None)
        row = episode.trajectory.info
        allowed = {f["name"] for f in row["functions"]} | {
            f["name"] for fs in (row["entry"].get("missed_function") or {}).values() for f in fs}
        results = []
        for call in calls:
            refused = _refusal(call, allowed)
            if refused:
                results.append(ToolResult.error(refused))
                continue
            t0 = time.perf_counter()
            out, _ = bfcl().multi_turn.execute_multi_turn_func_call(
                to_call_strings([{call.name: call.arguments}]), row["entry"].get("initial_config", {}),
                row["entry"]["involved_classes"], episode.name, row["id"],
                long_context="long_context" in row["category"], is_evaL_run=False)
            results.append(ToolResult(text=str(out[0]), latency_s=time.perf_counter() - t0))
        return results

    def next_user_turn(self, trajectory: Trajectory) -> str | None:
        episode = self._episode(trajectory)
        episode.user_turn += 1
        episode.steps = 0
        turns = trajectory.info["turns"]
        if episode.user_turn >= len(turns):
            _forget_instances(episode.name)
            return None
        missed = (trajectory.info["entry"].get("missed_function") or {}).get(str(episode.user_turn))
        if missed:
            shown = "\n".join(json.dumps(t, ensure_ascii=False) for t in openai_tools(missed))
            return bfcl().prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=shown)
        return "\n\n".join(str(m["content"]) for m in turns[episode.user_turn] if m.get("role") == "user")


def _refusal(call: ToolCall, allowed: set[str]) -> str | None:
    if call.name not in allowed:
        return f"no function named {call.name!r} here"
    if not isinstance(call.arguments, dict):
        return f"{call.name}: the arguments must be an object"
    bad = [k for k in call.arguments if not (isinstance(k, str) and k.isidentifier())]
    if bad:
        return f"{call.name}: {bad[0]!r} is not an argument name"
    return None


def _categories(names: Any) -> list[str]:
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    known = list(bfcl().categories.MULTI_TURN_CATEGORY)
    aliases = {"multi_turn": list(MULTI_TURN_CATEGORIES)}
    out: list[str] = []
    for name in names:
        picked = aliases.get(name) or [f"multi_turn_{name}" if f"multi_turn_{name}" in known else name]
        for c in picked:
            if c not in known:
                raise ValueError(f"bfcl: {c!r} is not a multi-turn category; choose from {', '.join(known)}")
            if c not in out:
                out.append(c)
    return out


def _row(row: dict[str, Any]) -> dict[str, Any]:
    """A multi-turn row with what the engine renders: `tools` (the functions shown from the start,
    as JSON-schema tools) and `question` (the first user message)."""
    first = [m["content"] for m in row["turns"][0] if m.get("role") == "user"]
    return {**row, "tools": openai_tools(row["functions"]), "question": first[-1] if first else ""}
