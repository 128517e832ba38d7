"""Evaluation: roll out a split, score it, report per question and on average."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Iterator

from rlfactory.protocols import Rollouts
from rlfactory.rewards.base import HasParts, ReadsAnswers, score_all
from rlfactory.trajectory import Trajectory
from rlfactory.train.metrics import accuracy_of, trajectory_metrics

if TYPE_CHECKING:
    from rlfactory.rewards.base import Reward


@contextlib.contextmanager
def sampling_override(engine: Rollouts, greedy: bool) -> Iterator[None]:
    """Make `engine` sample greedily for the duration (when `greedy`)."""
    old = engine.sampling
    if greedy and old is not None:
        engine.sampling = old.model_copy(update={"greedy": True})
    try:
        yield
    finally:
        if old is not None:
            engine.sampling = old


def answer_extractor_of(reward: Reward | None) -> Callable[[Trajectory], str | None]:
    """How `reward` reads the final answer (a rule part's extractor, also inside a composed reward);
    Search-R1's last `<answer>...</answer>` otherwise."""
    from rlfactory.rewards.text import tagged_answer

    parts = [reward]
    while parts:
        part = parts.pop(0)
        if isinstance(part, ReadsAnswers) and callable(part.answer_extractor):
            return part.answer_extractor
        if isinstance(part, HasParts):
            parts += [r for r, _ in part.parts.values()]
    return tagged_answer("answer")


def _question(row: dict[str, Any], index: int) -> dict[str, Any]:
    out: dict[str, Any] = {"id": row.get("id", index)}
    for key in ("question", "prompt", "query"):
        if isinstance(row.get(key), str):
            out["question"] = row[key]
            break
    return out


async def evaluate(engine: Rollouts, reward: Reward | None, rows: list[dict[str, Any]], *, n: int = 1, greedy: bool = True,
                   policy_version: int = 0) -> dict[str, Any]:
    """Roll out `rows` (n samples each), score, and report.

    Returns {"averages": {accuracy, reward/mean, reward/<term>, traj/tool_calls, traj/turns,
    status/<s>, questions}, "questions": [{id, question, accuracy, reward, reward_terms,
    tool_calls, calls (per sample: [{name, arguments, status}]), turns, statuses, answer, output}]} (per
    question: means over its n samples; `answer` is the first sample's answer as the reward extracts
    it, None when it gave none, and `output` that sample's whole model text).
    """
    if not rows:
        return {"averages": {"questions": 0.0}, "questions": []}
    with sampling_override(engine, greedy):
        trajs: list[Trajectory] = await engine.run(rows, n, policy_version=policy_version)
    for t, s in zip(trajs, await score_all(reward, trajs)):
        if s is not None:
            t.reward, t.reward_terms = float(s.total), dict(s.terms)
    by_group: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_group.setdefault(t.group, []).append(t)
    questions = []
    extract = answer_extractor_of(reward)
    for i, (row, group) in enumerate(zip(rows, by_group.values())):  # the engine's groups come in row order
        scored = [t for t in group if t.reward is not None]
        accs = [a for t in scored if (a := accuracy_of(t)) is not None]
        terms = sorted({k for t in scored for k in t.reward_terms})
        questions.append({
            **_question(row, i),
            "accuracy": sum(accs) / len(accs) if accs else None,
            "reward": sum(t.reward for t in scored) / len(scored) if scored else None,
            "reward_terms": {k: sum(t.reward_terms.get(k, 0.0) for t in scored) / len(scored) for k in terms},
            "tool_calls": sum(len(t.tool_calls) for t in group) / len(group),
            "calls": [[{"name": c.name, "arguments": c.arguments, "status": c.status} for c in t.tool_calls]
                      for t in group],
            "turns": sum(t.turns for t in group) / len(group),
            "statuses": [t.status for t in group],
            "answer": extract(group[0]) if group else None,
            "output": group[0].model_text() if group else "",
        })
    averages = trajectory_metrics(trajs)
    averages["questions"] = float(len(rows))
    return {"averages": averages, "questions": questions}
