"""Process rewards: terms that score each model turn, beside the outcome reward.

A turn term is a plain function of the trajectory and one turn, like a rule term:

    @turn_term("short_query")
    def short_query(trajectory, turn, max_words: int = 8) -> float | None:
        queries = [c.arguments.get("query", "") for c in turn.calls if c.name == "search"]
        return None if not queries else float(all(len(q.split()) <= max_words for q in queries))

It returns a float, or None when it does not apply to that turn (an answer turn for a tool term):
a turn's reward is the weighted sum of the terms that applied. Besides `trajectory` and `turn`
(a `Turn`), a term may declare `references` (the row's acceptable answers) and its options.

Built-in terms: `tool_success`, `retrieval_hit` (search env), `code_ran` (code env), `sql_ran`
(SQL env); `JudgeTurnReward` asks a model judge about each turn in context. `WithTurnRewards` puts
them beside an outcome reward: its `RewardScore.turns` holds one score per model turn, which
`apply_turn_scores` writes onto the trajectory's model segments (`Segment.reward`,
`Segment.reward_terms`). The outcome total is unchanged by them.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

from rlfactory.registry import Registry
from rlfactory.rewards.base import Reward, RewardScore, require_scorable, score_many
from rlfactory.rewards.rule import term_error
from rlfactory.rewards.text import normalize_answer, question_of, references_of
from rlfactory.tools.base import OK
from rlfactory.trajectory import Segment, ToolCallRecord, Trajectory

STEP = "step"
"""The term the rollout records from `ToolResult.reward` (env step rewards and tool scores)."""


@dataclass(frozen=True)
class Turn:
    """One model turn of a trajectory, as a turn term sees it."""

    index: int
    """1-based, as `ToolCallRecord.turn`."""
    segment: Segment
    """The model segment (its text, ids and logprobs)."""
    calls: tuple[ToolCallRecord, ...]
    """The tool calls the turn made (malformed and not-run ones included)."""
    observation: Segment | None
    """What the model read after the turn (tool results); None after its last turn."""
    context: str
    """The text before the turn: the prompt and the earlier turns and observations."""


def turns_of(trajectory: Trajectory) -> list[Turn]:
    """The trajectory's model turns in order."""
    out: list[Turn] = []
    before: list[str] = []
    segs = trajectory.segments
    for i, seg in enumerate(segs):
        if seg.role == "model":
            k = len(out) + 1
            nxt = segs[i + 1] if i + 1 < len(segs) and segs[i + 1].role == "observation" else None
            calls = tuple(c for c in trajectory.tool_calls if c.turn == k)
            out.append(Turn(k, seg, calls, nxt, "".join(before)))
        before.append(seg.text)
    return out


# --- the registry ----------------------------------------------------------------------------------

TurnTermFn = Callable[..., "float | None"]


@dataclass(frozen=True)
class _TurnTerm:
    fn: TurnTermFn
    params: frozenset[str]
    var_kw: bool


def _describe(fn: TurnTermFn, name: str) -> _TurnTerm:
    params = list(inspect.signature(fn).parameters.values())[2:]
    named = frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return _TurnTerm(fn, named, any(p.kind is p.VAR_KEYWORD for p in params))


_TURN_TERMS: Registry[_TurnTerm] = Registry("turn term", adopt=_describe)


def turn_term(name: str) -> Callable[[TurnTermFn], TurnTermFn]:
    """Decorator: register `fn(trajectory, turn, **wanted) -> float | None` as the turn term `name`."""
    if name == STEP:
        raise ValueError(f"turn term name {STEP!r} is reserved for the rollout's step rewards (ToolResult.reward)")
    return _TURN_TERMS.register(name)


def turn_term_of(name: str) -> _TurnTerm:
    """The turn term `name`: registered, or for `module:function` that function (imported,
    registered). An unknown name is a ConfigError with the closest and the known names."""
    return _TURN_TERMS.lookup(name)


def get_turn_term(name: str) -> TurnTermFn:
    """The function of the turn term `name` (see `turn_term_of`)."""
    return turn_term_of(name).fn


def list_turn_terms() -> list[str]:
    return _TURN_TERMS.names()


# --- scoring -----------------------------------------------------------------------------------


class TurnScorer(Protocol):
    async def score_turns_many(self, trajectories: Sequence[Trajectory]) -> list[list[RewardScore]]:
        """For each trajectory, one score per model turn (terms raw; total weighted)."""
        ...


class TurnRuleReward:
    """Weighted turn terms: a turn's total = sum(weight[t] * term_t(trajectory, turn)) over the
    terms that applied (returned a value); its `terms` hold those raw values."""

    def __init__(self, weights: Mapping[str, float], options: Mapping[str, Mapping[str, Any]] | None = None,
                 references: Callable[[Trajectory], list[str]] = references_of) -> None:
        if not weights:
            raise ValueError("TurnRuleReward needs at least one turn term weight")
        self.weights = dict(weights)
        for name in self.weights:
            get_turn_term(name)  # a typo fails at start-up
        self.options = {k: dict(v) for k, v in (options or {}).items()}
        unknown = set(self.options) - set(self.weights)
        if unknown:
            raise ValueError(f"reward.turn_options given for turn terms without a weight: {', '.join(sorted(unknown))}")
        for name, opts in self.options.items():
            term = turn_term_of(name)
            bad = set(opts) - term.params
            if bad and not term.var_kw:
                raise ValueError(f"turn term {name!r} takes no option(s) {', '.join(sorted(bad))}")
        self.references = references

    def _kwargs(self, name: str, references: list[str]) -> dict[str, Any]:
        term = turn_term_of(name)
        given = {"references": references, **self.options.get(name, {})}
        return given if term.var_kw else {k: v for k, v in given.items() if k in term.params}

    async def score_turns(self, trajectory: Trajectory) -> list[RewardScore]:
        refs = self.references(trajectory)
        out = []
        for turn in turns_of(trajectory):
            terms: dict[str, float] = {}
            for name in self.weights:
                try:
                    value = turn_term_of(name).fn(trajectory, turn, **self._kwargs(name, refs))
                    if inspect.isawaitable(value):
                        value = await value
                    if value is not None:
                        terms[name] = finite(value)
                except Exception as e:  # the user's term: name it and the row in one line
                    raise term_error(f"{name} (turn {turn.index})", e, trajectory) from e
            out.append(RewardScore(sum(self.weights[n] * v for n, v in terms.items()), terms))
        return out

    async def score_turns_many(self, trajectories: Sequence[Trajectory]) -> list[list[RewardScore]]:
        return list(await asyncio.gather(*(self.score_turns(t) for t in trajectories)))


def finite(value: Any) -> float:
    """`value` as a float; a ValueError for what is not a finite number (it would reach the advantages)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"returned {value!r:.100}, not a finite number or None")
    return float(value)


def merge_turn_scores(parts: Sequence[list[RewardScore]]) -> list[RewardScore]:
    """Per turn: the totals summed and the terms joined over the scorers' lists (same length)."""
    n = max((len(p) for p in parts), default=0)
    out = []
    for k in range(n):
        terms: dict[str, float] = {}
        total = 0.0
        for p in parts:
            if k < len(p):
                total += p[k].total
                terms.update(p[k].terms)
        out.append(RewardScore(total, terms))
    return out


class WithTurnRewards:
    """The outcome reward `outcome` (its total and terms unchanged) plus per-turn scores from
    `scorers`, in `RewardScore.turns` (one per model turn)."""

    def __init__(self, outcome: Reward, scorers: Sequence[TurnScorer]) -> None:
        if not scorers:
            raise ValueError("WithTurnRewards needs at least one turn scorer")
        self.outcome, self.scorers = outcome, list(scorers)

    async def score_many(self, trajectories: list[Trajectory]) -> list[RewardScore]:
        for t in trajectories:
            require_scorable(t)
        outcome, *per_scorer = await asyncio.gather(score_many(self.outcome, trajectories),
                                                    *(s.score_turns_many(trajectories) for s in self.scorers))
        return [RewardScore(o.total, o.terms, turns=merge_turn_scores([p[i] for p in per_scorer]))
                for i, o in enumerate(outcome)]

    async def score(self, trajectory: Trajectory) -> RewardScore:
        return (await self.score_many([trajectory]))[0]


def apply_turn_scores(trajectory: Trajectory, turns: Sequence[RewardScore]) -> None:
    """Write per-turn scores onto the model segments: each segment's `reward_terms` become the
    rollout's `step` term (kept) plus the scored terms, and `reward` their total (None for a turn
    that nothing scored). Scoring the same trajectory again gives the same numbers."""
    for seg, score in zip(trajectory.turn_segments(), turns):
        step = (seg.reward_terms or {}).get(STEP)
        terms = ({STEP: step} if step is not None else {}) | dict(score.terms)
        seg.reward_terms = terms or None
        seg.reward = (step or 0.0) + score.total if terms else None


# --- built-in turn terms ---------------------------------------------------------------------------


def _calls_ran(turn: Turn, tool: str | None) -> float | None:
    calls = [c for c in turn.calls if tool is None or c.name == tool]
    return None if not calls else float(all(c.status == OK for c in calls))


@turn_term("tool_success")
def tool_success_term(trajectory: Trajectory, turn: Turn) -> float | None:
    """1.0 when every tool call of the turn parsed and returned ok, 0.0 when one did not (malformed,
    an error, a timeout...); None for a turn without tool calls (an answer)."""
    return _calls_ran(turn, None)


@turn_term("retrieval_hit")
def retrieval_hit_term(trajectory: Trajectory, turn: Turn, references: Sequence[str] = (),
                       tool: str = "search") -> float | None:
    """Search env: 1.0 when the turn called `tool` and the results it read contain a reference
    answer (whole words, after Search-R1's normalisation), else 0.0; None for a turn without such a
    call."""
    if not any(c.name == tool for c in turn.calls):
        return None
    seen = f" {normalize_answer(turn.observation.text)} " if turn.observation is not None else ""
    return float(any((ref := normalize_answer(str(r))) and f" {ref} " in seen for r in references))


@turn_term("code_ran")
def code_ran_term(trajectory: Trajectory, turn: Turn, tool: str = "python") -> float | None:
    """Code env: 1.0 when the turn's `tool` calls all ran without error (exit 0, in time), else 0.0;
    None for a turn that ran no code."""
    return _calls_ran(turn, tool)


@turn_term("sql_ran")
def sql_ran_term(trajectory: Trajectory, turn: Turn, tool: str = "sql") -> float | None:
    """SQL env: 1.0 when the turn's `tool` queries all executed, else 0.0; None for a turn without one."""
    return _calls_ran(turn, tool)


# --- a model judge per turn ------------------------------------------------------------------------

DEFAULT_TURN_TEMPLATE = """You are grading one step of an assistant that uses tools to answer a question.

Question: {question}
Reference answer: {reference}

What happened before this step:
{context}

The step:
{turn}

What the tools returned:
{observation}

Does this step make progress toward the reference answer? Reply with just "yes" or "no"."""
"""Fields: {question}, {reference}, {context} (the text before the turn), {turn} (the turn's own
text), {observation} (the tool results after it, or "(none)"). Literal braces must be doubled."""


class Verdicts(Protocol):
    async def verdicts(self, prompts: list[str]) -> list[Any]:
        """One verdict (with `.score`: float or None) per prompt (rlfactory.rewards.judge.JudgeReward)."""
        ...


class JudgeTurnReward:
    """A judge's verdict on each turn in context, as the turn term `judge` (weighted by `weight`).
    Prompts of all the turns of a batch go to the judge together (its batching and cache apply);
    an unparseable reply scores the judge's fallback."""

    def __init__(self, judge: Verdicts, template: str = DEFAULT_TURN_TEMPLATE, weight: float = 1.0,
                 fallback: float = 0.0, max_context_chars: int = 4000) -> None:
        self.judge, self.template, self.weight = judge, template, float(weight)
        self.fallback, self.max_context_chars = fallback, max_context_chars

    def build_prompt(self, trajectory: Trajectory, turn: Turn) -> str:
        return self.template.format_map({
            "question": question_of(trajectory),
            "reference": " | ".join(references_of(trajectory)),
            "context": turn.context[-self.max_context_chars:],
            "turn": turn.segment.text,
            "observation": turn.observation.text if turn.observation is not None else "(none)",
        })

    async def score_turns_many(self, trajectories: Sequence[Trajectory]) -> list[list[RewardScore]]:
        per = [turns_of(t) for t in trajectories]
        prompts = [self.build_prompt(t, turn) for t, turns in zip(trajectories, per) for turn in turns]
        verdicts = iter(await self.judge.verdicts(prompts))
        out = []
        for turns in per:
            scores = []
            for _ in turns:
                v = next(verdicts)
                value = self.fallback if v.score is None else float(v.score)
                scores.append(RewardScore(self.weight * value, {"judge": value}))
            out.append(scores)
        return out
