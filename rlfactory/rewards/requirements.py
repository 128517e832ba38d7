"""What a reward reads from the dataset rows, checked before the first step.

A rule term that compares against the reference answers (`exact_match`, `f1`, ...: any term
whose signature takes `references`) scores 0 on a row without one, silently. `check_rows` finds
the first such row and says which row, which field is missing and which fields the row has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable, Iterable

from rlfactory.rewards.text import REFERENCE_KEYS

if TYPE_CHECKING:
    from rlfactory.rewards.base import Reward
    from rlfactory.rewards.rule import RuleReward


@dataclass
class RowNeeds:
    """What of a row a reward reads: the reference answers (read by the parts named in
    `reads_references`, through the reward's `references` function)."""

    reads_references: list[str] = field(default_factory=list)
    references: Callable[[Any], list[str]] | None = None


def row_needs(reward: Reward) -> RowNeeds:
    """What `reward` (rule, judge or composed; of other rewards nothing can be told) needs."""
    from rlfactory.rewards.compose import ComposedReward
    from rlfactory.rewards.judge import JudgeReward
    from rlfactory.rewards.rule import RuleReward, term_of

    needs = RowNeeds()
    parts = [reward]
    while parts:
        part = parts.pop(0)
        if isinstance(part, ComposedReward):
            parts += [r for r, _ in part.parts.values()]
        elif isinstance(part, RuleReward):
            readers = [n for n in part.weights if "references" in term_of(n).params]
            if readers:
                needs.reads_references += readers
                needs.references = part.references
        elif isinstance(part, JudgeReward) and "{reference}" in (part.template or ""):
            needs.reads_references.append("judge")
            needs.references = part.references
    return needs


def row_problem(needs: RowNeeds, info: dict[str, Any]) -> str | None:
    """Why one row (its `Trajectory.info`) cannot be scored as configured, or None."""
    if needs.reads_references and needs.references is not None:
        refs = needs.references(SimpleNamespace(info=info, segments=[], tool_calls=[], status="ok", turns=0))
        if not [r for r in refs if str(r).strip()]:
            return (f"has no reference answer, which {', '.join(needs.reads_references)} compare(s) against: "
                    f"give it one of the fields {', '.join(REFERENCE_KEYS)} (a string or a list of strings) "
                    "or reward_model.ground_truth")
    return None


class _WatchedInfo(dict):
    """A row's info that remembers the keys read from it that it does not have."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.missing: list[Any] = []

    def __missing__(self, key: Any) -> Any:
        self.missing.append(key)
        raise KeyError(key)


def rule_rewards(reward: Reward) -> list[RuleReward]:
    """The RuleReward parts of `reward` (itself, or inside a ComposedReward)."""
    from rlfactory.rewards.compose import ComposedReward
    from rlfactory.rewards.rule import RuleReward

    out, parts = [], [reward]
    while parts:
        part = parts.pop(0)
        if isinstance(part, ComposedReward):
            parts += [r for r, _ in part.parts.values()]
        elif isinstance(part, RuleReward):
            out.append(part)
    return out


def term_reads_missing_key(reward: Reward, info: dict[str, Any], where: str) -> str | None:
    """Each rule term run once on an empty trajectory of the row `info`: a term that reads a key
    the row lacks (`trajectory.info["answer"]`) would fail on every trajectory, so it is named
    now, with the key and what the row has. Any other failure is left to scoring (a term may
    rightly need the model's text)."""
    import inspect

    from rlfactory.rewards.rule import ARGUMENTS_HINT, term_of
    from rlfactory.trajectory import Trajectory

    for rule in rule_rewards(reward):
        for name in rule.weights:
            watched = _WatchedInfo(info)
            trajectory = Trajectory(id="check", group="check", info=watched)
            try:
                kwargs = rule._kwargs(name, {"answer": None, "references": rule.references(trajectory)})
                value = term_of(name).fn(trajectory, **kwargs)
                if inspect.iscoroutine(value):
                    value.close()  # not run here: an async term is checked when it scores
            except KeyError as e:
                if watched.missing and e.args and e.args[0] in watched.missing:
                    from rlfactory.imports import where as where_in_code

                    return (f"reward term {name!r} ({where_in_code(e)}) reads trajectory.info[{e.args[0]!r}], which "
                            f"{where} has not (it has: {', '.join(map(str, info)) or 'nothing'}); {ARGUMENTS_HINT}")
            except Exception:  # noqa: BLE001 - only the missing key is judged here; scoring reports the rest
                continue
    return None


def check_rows(reward: Reward, infos: Iterable[dict[str, Any]], where: str, try_terms: bool = True) -> str | None:
    """The first problem over `infos` (one per row, as the env's `info(row)` returns them) as one
    line starting with `where` (e.g. "env 'wiki': train row"), or None when every row can be scored.
    With `try_terms`, the reward's rule terms are first tried on the first row
    (`term_reads_missing_key`): a command does that once, on its first split, since it runs the
    user's code on a trajectory the model never wrote."""
    infos = list(infos)
    if infos and try_terms:
        ident = f" (id {infos[0]['id']!r})" if "id" in infos[0] else ""
        problem = term_reads_missing_key(reward, infos[0], f"{where} 0{ident}")
        if problem:
            return problem
    needs = row_needs(reward)
    if not needs.reads_references:
        return None
    bad: list[tuple[int, dict[str, Any], str]] = []
    total = 0
    for i, info in enumerate(infos):
        total += 1
        problem = row_problem(needs, info)
        if problem is not None:
            bad.append((i, info, problem))
    if not bad:
        return None
    i, info, problem = bad[0]
    ident = f" (id {info['id']!r})" if "id" in info else ""
    return (f"{where} {i}{ident} {problem}; the row has: {', '.join(sorted(map(str, info))) or 'no fields'} "
            f"({len(bad)} of {total} rows)")
