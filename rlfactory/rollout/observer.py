"""Observer hooks on a rollout: what a live view (the studio's playground, the gateway) watches as
each trajectory happens, without wrapping the generator or the env.

`RolloutEngine.run(..., observer=RolloutObserver(...))` passes one observer to every trajectory of
that call; `rollout_one` (episode.py) calls it at fixed points of a turn. Without one (the default,
training) a turn pays one `is None` test per point. A callback runs on the event loop between the
trajectory's own steps: it must not block, and what it raises propagates like a generator's error.
Callbacks read the trajectory; they must not change it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rlfactory.protocols import GenRequest, GenResult
from rlfactory.tools.base import ToolCall, ToolResult
from rlfactory.trajectory import Trajectory


def _nothing(*_args: object) -> None:
    return None


@dataclass(frozen=True)
class RolloutObserver:
    """Callbacks on one rollout's trajectories; each defaults to doing nothing. Per model turn they
    come in this order: turn_started, tokens_generated, [tools_started, tool_results | user_turn],
    turn_ended."""

    turn_started: Callable[[Trajectory, GenRequest], None] = _nothing
    """Before a model turn is generated. `traj.turns` counts the turns before it; `traj.segments[-1]`
    is what the turn continues from (the prompt for the first turn, else the observation just
    appended); `request.prompt_ids` is the whole context (under `rollout.context` other than keep,
    the rewritten one the model sees: `traj.branches` says where it differs from the segments)."""
    tokens_generated: Callable[[Trajectory, GenResult], None] = _nothing
    """The turn's tokens as sampled (ids, logprobs, text, finish reason), once recorded:
    `traj.segments[-1]` is its model segment and `traj.turns` counts it."""
    tools_started: Callable[[Trajectory, list[ToolCall]], None] = _nothing
    """The calls the turn runs, before the env runs them (not called when the turn runs no tools)."""
    tool_results: Callable[[Trajectory, list[ToolCall], list[ToolResult]], None] = _nothing
    """What the env returned for those calls, in order, with valid text (as the model will read
    them); also when the tool layer failed the turn. Not called when the env's step raised."""
    user_turn: Callable[[Trajectory, str], None] = _nothing
    """The env's next user message (`Env.next_user_turn`) after the model answered, before it is
    rendered and appended; the turn's observation is then that user turn."""
    turn_ended: Callable[[Trajectory], None] = _nothing
    """Once for every turn_started: after its observation is appended (the trajectory goes on), or
    when the trajectory ended during the turn (`traj.status` and `traj.error` are then final), or
    when an error propagates out of the turn."""
