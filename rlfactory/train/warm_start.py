"""After `rlfactory sft`: how close the warm-started model comes to its demonstrator on held-out rows.

The model rolls out a few test rows greedily (the run's own engine and tools) and its tool calls
are compared with the calls the env's solver makes on the same rows. Three rates tell where a warm
start falls short, each with what usually helps:

- format: trajectories that end in an answer, no turn malformed (status `ok`, no `malformed` call);
- calls matched: the demonstrator's calls that the model also made, by tool name and arguments
  (and by name alone: right tool, wrong arguments means the model does not copy yet);
- calls succeeded: the model's own tool calls that came back `ok`.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from rlfactory.tools.base import ToolCall
from rlfactory.trajectory import Trajectory
from rlfactory.train.sft import demo_calls

if TYPE_CHECKING:
    from rlfactory.envs.base import Env
    from rlfactory.protocols import Rollouts

LOW = 0.5
"""A rate under this gets advice."""


@dataclass
class WarmStartCheck:
    """The warm start against its demonstrator on `rows` held-out rows (rates in [0, 1])."""

    rows: int
    format_rate: float
    demo_calls: int
    """The demonstrator's tool calls on those rows (rows it cannot solve left out)."""
    matched_calls: float
    """Of the demonstrator's calls, the share the model made too, with the same name and arguments."""
    matched_names: float
    """The same, by tool name alone."""
    model_calls: int
    call_success: float
    """Of the model's own tool calls, the share whose status is ok."""
    top_error: str | None = None
    """The most common error text of the model's failed tool calls."""
    advice: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line with the three rates."""
        calls = (f"demonstrator's calls matched {self.matched_calls:.0%} by name and arguments "
                 f"({self.matched_names:.0%} by name; {self.demo_calls} calls)" if self.demo_calls
                 else "the demonstrator makes no tool calls on these rows")
        own = (f"its own tool calls succeeded {self.call_success:.0%} ({self.model_calls} calls)" if self.model_calls
               else "it made no tool calls")
        return f"format {self.format_rate:.0%}; {calls}; {own}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def _key(call: Any) -> tuple[str, str]:
    args = call.arguments if isinstance(call.arguments, dict) else {"_raw": call.arguments}
    return str(call.name), json.dumps(args, sort_keys=True, default=str)


def _matched(wanted: Sequence[ToolCall], made: Sequence[Any], by_name: bool) -> int:
    """How many of `wanted` appear among `made` (each made call counted once)."""
    pool = Counter(_key(c)[0] if by_name else _key(c) for c in made)
    hits = 0
    for call in wanted:
        k = _key(call)[0] if by_name else _key(call)
        if pool[k] > 0:
            pool[k] -= 1
            hits += 1
    return hits


def compare(trajs: Sequence[Trajectory], demonstrated: Sequence[Sequence[ToolCall] | None]) -> WarmStartCheck:
    """The check of `trajs` (one per row) against the demonstrator's calls on the same rows (None
    where the solver could not solve the row)."""
    ok = [t.status == "ok" and not any(c.status == "malformed" for c in t.tool_calls) for t in trajs]
    wanted = total = names = 0
    for t, calls in zip(trajs, demonstrated):
        if calls is None:
            continue
        made = [c for c in t.tool_calls if c.name]
        wanted += len(calls)
        total += _matched(calls, made, by_name=False)
        names += _matched(calls, made, by_name=True)
    own = [c for t in trajs for c in t.tool_calls if c.name]
    errors = Counter((c.error or c.status).strip().splitlines()[0][:160] for c in own if c.status != "ok")
    check = WarmStartCheck(
        rows=len(trajs),
        format_rate=sum(ok) / len(trajs) if trajs else 0.0,
        demo_calls=wanted,
        matched_calls=total / wanted if wanted else 0.0,
        matched_names=names / wanted if wanted else 0.0,
        model_calls=len(own),
        call_success=sum(c.status == "ok" for c in own) / len(own) if own else 0.0,
        top_error=errors.most_common(1)[0][0] if errors else None,
    )
    check.advice = advice_for(check)
    return check


def advice_for(check: WarmStartCheck) -> list[str]:
    """What usually helps, for each rate under LOW."""
    out = []
    if check.format_rate < LOW:
        out.append(f"only {check.format_rate:.0%} of the answers parse: train longer (sft.steps) on more "
                   "demonstrations (sft.demos); GRPO gets no reward from answers it cannot read")
    if check.demo_calls and check.matched_names < LOW:
        out.append(f"the model calls the demonstrator's tools only {check.matched_names:.0%} of the time: more "
                   "sft.steps, or a bigger model (tiny:10m, smollm2:135m)")
    elif check.demo_calls and check.matched_calls < LOW:
        out.append(f"it picks the right tools ({check.matched_names:.0%}) but copies their arguments only "
                   f"{check.matched_calls:.0%} of the time: start from a model that already copies (model.path: "
                   "tiny:1m-copy, tiny:1m pretrained on generic copy text; or smollm2:135m), or try a full-text "
                   "warm start (sft.full_text_steps)")
    if check.model_calls and check.call_success < LOW:
        out.append(f"only {check.call_success:.0%} of its tool calls succeed; the most common error: "
                   f"{check.top_error!r}")
    return out


async def check_warm_start(engine: Rollouts, env: Env, rows: list[dict[str, Any]]) -> WarmStartCheck:
    """Roll `rows` out greedily with `engine` (one sample each) and compare with `env.solve`."""
    from rlfactory.train.evaluate import sampling_override

    with sampling_override(engine, greedy=True):
        trajs = await engine.run(rows, 1)
    demonstrated: list[Sequence[ToolCall] | None] = []
    for row in rows:
        try:
            demonstrated.append(demo_calls(env.solve(row)))
        except (ValueError, RuntimeError, NotImplementedError):  # the solver's "cannot do this row"
            demonstrated.append(None)
    return compare(trajs, demonstrated)
