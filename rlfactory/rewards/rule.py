"""Rule-based rewards: small registered term functions, summed with weights.

A term is a function of the trajectory that returns a float:

    @reward_term("mentions_paris")
    def mentions_paris(trajectory, answer=None) -> float:
        return float(answer is not None and "paris" in answer.lower())

Besides the trajectory, `RuleReward` passes the keyword arguments a term declares, from:
`answer` (the extracted final answer, or None), `references` (acceptable answers from the row),
and the term's options (`RuleReward(options={"extra_calls": {"budget": 2}})`).

Built-in terms: `format`, `exact_match`, `substring_match`, `f1`, `numeric`, `extra_calls`,
`extra_turns`, `tool_errors` (see each docstring). Penalty terms return negative counts, so the
weight is the penalty per unit: `{"extra_calls": 0.1}` costs 0.1 per call beyond the budget.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from rlfactory.config import ConfigError
from rlfactory.registry import Registry
from rlfactory.rewards.base import RewardScore, require_scorable
from rlfactory.rewards.text import (
    AnswerExtractor,
    exact_match,
    numbers_equal,
    parse_number,
    references_of,
    substring_match,
    tagged_answer,
    token_f1,
)
from rlfactory.tools.base import MALFORMED, OK
from rlfactory.trajectory import Trajectory

TermFn = Callable[..., float]


@dataclass(frozen=True)
class _Term:
    fn: TermFn
    params: frozenset[str]  # keyword parameters it accepts (besides the trajectory)
    var_kw: bool  # accepts **kwargs


def _describe(fn: TermFn) -> _Term:
    params = list(inspect.signature(fn).parameters.values())[1:]
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    names = frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return _Term(fn, names, var_kw)


_TERMS: Registry[_Term] = Registry("reward term", adopt=lambda fn, name: _describe(fn))


def reward_term(name: str) -> Callable[[TermFn], TermFn]:
    """Decorator: register `fn(trajectory, **wanted) -> float` as the rule term `name`."""
    return _TERMS.register(name)


def term_of(name: str) -> _Term:
    """The term `name`: registered, or for `module:function` that function (imported, registered).
    An unknown name is a ConfigError with the closest and the known names."""
    return _TERMS.lookup(name)


def get_term(name: str) -> TermFn:
    """The function of the term `name` (see `term_of`)."""
    return term_of(name).fn


def list_terms() -> list[str]:
    return _TERMS.names()


class RewardTermError(ConfigError):
    """A rule term raised while scoring: the message names the term (and where it is defined), the
    row, and, for a key the row lacks, the key and how a term receives the references instead."""


ARGUMENTS_HINT = ("a term receives the row's reference answers as its `references` parameter and the extracted "
                  "answer as `answer`: def term(trajectory, answer=None, references=()) -> float")


def row_label(info: Mapping[str, Any], fallback: str) -> str:
    """`row 'q3'` (by the row's id) or `trajectory 'traj-0'` when the row has no id."""
    return f"row {info['id']!r}" if isinstance(info, Mapping) and "id" in info else f"trajectory {fallback!r}"


def term_error(name: str, exc: BaseException, trajectory: Trajectory) -> RewardTermError:
    """The one-line error for term `name` raising `exc` on `trajectory`."""
    from rlfactory.imports import where

    info = trajectory.info if isinstance(trajectory.info, Mapping) else {}
    head = f"reward term {name!r} ({where(exc)}) raised {type(exc).__name__}: {exc} on {row_label(info, trajectory.id)}"
    if isinstance(exc, KeyError) and exc.args and exc.args[0] not in info:
        return RewardTermError(f"{head}, whose trajectory.info has no {exc.args[0]!r} (it has: "
                               f"{', '.join(map(str, info)) or 'nothing'}); {ARGUMENTS_HINT}")
    return RewardTermError(head)


class RuleReward:
    """Weighted sum of rule terms: total = sum(weight[t] * term_t(trajectory)).

    `terms` of the score holds each term's raw (unweighted) value. `answer_extractor` finds the
    final answer (default: the last `<answer>...</answer>`), `references` the acceptable answers
    (default: `references_of`, from info["ground_truth"] / ["answer"] / ...), `options` per-term
    keyword arguments. Sync and async term functions both work.
    """

    def __init__(
        self,
        weights: Mapping[str, float],
        answer_extractor: AnswerExtractor | None = None,
        references: Callable[[Trajectory], list[str]] = references_of,
        options: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        if not weights:
            raise ValueError("RuleReward needs at least one term weight")
        self.weights = dict(weights)
        for name in self.weights:
            get_term(name)  # fail early on a typo
        self.answer_extractor = answer_extractor or tagged_answer("answer")
        self.references = references
        self.options = {k: dict(v) for k, v in (options or {}).items()}
        unknown = set(self.options) - set(self.weights)
        if unknown:
            raise ValueError(f"options given for terms without a weight: {', '.join(sorted(unknown))}")

    def _kwargs(self, name: str, context: dict[str, Any]) -> dict[str, Any]:
        term = term_of(name)
        given = {**context, **self.options.get(name, {})}
        if term.var_kw:
            return given
        bad = set(self.options.get(name, {})) - term.params
        if bad:
            raise ValueError(f"reward term {name!r} takes no option(s) {', '.join(sorted(bad))}")
        return {k: v for k, v in given.items() if k in term.params}

    async def score(self, trajectory: Trajectory) -> RewardScore:
        require_scorable(trajectory)
        context = {"answer": self.answer_extractor(trajectory), "references": self.references(trajectory)}
        terms: dict[str, float] = {}
        for name in self.weights:
            try:
                value = term_of(name).fn(trajectory, **self._kwargs(name, context))
                if inspect.isawaitable(value):
                    value = await value
                terms[name] = float(value)
            except RewardTermError:
                raise
            except Exception as e:  # the user's term: name it and the row, once, instead of a traceback
                raise term_error(name, e, trajectory) from e
        return RewardScore(total=sum(self.weights[n] * v for n, v in terms.items()), terms=terms)


class FunctionReward:
    """A whole reward from one function `fn(trajectory) -> float | RewardScore` (sync or async)."""

    def __init__(self, fn: Callable[[Any], Any], name: str | None = None) -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "reward")

    async def score(self, trajectory: Trajectory) -> RewardScore:
        require_scorable(trajectory)
        value = self.fn(trajectory)
        if inspect.isawaitable(value):
            value = await value
        if isinstance(value, RewardScore):
            return value
        return RewardScore(total=float(value), terms={self.name: float(value)})


# --- built-in terms ------------------------------------------------------------------------------


@reward_term("format")
def format_term(trajectory: Trajectory, answer: str | None = None) -> float:
    """1.0 when a final answer was found (in the expected tags) and no tool call was malformed
    (trajectory status not `malformed`, no call recorded with status `malformed`), else 0.0."""
    if answer is None or trajectory.status == "malformed":
        return 0.0
    return 0.0 if any(c.status == MALFORMED for c in trajectory.tool_calls) else 1.0


@reward_term("exact_match")
def exact_match_term(trajectory: Trajectory, answer: str | None = None, references: Sequence[str] = ()) -> float:
    """1.0 when the answer equals a reference after Search-R1's `normalize_answer`, else 0.0."""
    return exact_match(answer, references)


@reward_term("substring_match")
def substring_match_term(trajectory: Trajectory, answer: str | None = None, references: Sequence[str] = ()) -> float:
    """1.0 when a normalised reference occurs in the normalised answer (Search-R1's sub-EM)."""
    return substring_match(answer, references)


@reward_term("f1")
def f1_term(trajectory: Trajectory, answer: str | None = None, references: Sequence[str] = ()) -> float:
    """Best token F1 (SQuAD) of the answer against the references, in [0, 1]."""
    return token_f1(answer, references)


@reward_term("numeric")
def numeric_term(
    trajectory: Trajectory, answer: str | None = None, references: Sequence[str] = (), rel_tol: float = 1e-6, abs_tol: float = 1e-9
) -> float:
    """1.0 when the answer's number equals a reference's number ("1,234" == "1234", "3.50" == "3.5")."""
    value = parse_number(answer)
    return 1.0 if any(numbers_equal(value, parse_number(r), rel_tol, abs_tol) for r in references) else 0.0


@reward_term("extra_calls")
def extra_calls_term(trajectory: Trajectory, budget: int = 0) -> float:
    """-(number of tool calls beyond `budget`); weight it with the penalty per call."""
    return -float(max(0, len(trajectory.tool_calls) - budget))


@reward_term("extra_turns")
def extra_turns_term(trajectory: Trajectory, budget: int = 1) -> float:
    """-(number of turns beyond `budget`); weight it with the penalty per turn."""
    return -float(max(0, int(trajectory.turns) - budget))


@reward_term("tool_errors")
def tool_errors_term(trajectory: Trajectory) -> float:
    """-(number of tool calls whose status is not `ok`: errors, timeouts, bad arguments...)."""
    return -float(sum(1 for c in trajectory.tool_calls if c.status != OK))
