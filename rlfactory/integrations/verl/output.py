"""A finished rlfactory Trajectory as the fields of verl's `AgentLoopOutput`.

    prompt_ids        the trajectory's prompt segment
    response_ids      everything after it: model and observation tokens, as they were sampled and
                      rendered (prompt_ids + response_ids == trajectory.input_ids)
    response_mask     1 on model tokens, 0 on observation tokens (== trajectory.loss_mask after the
                      prompt); all 0 for an `infra_error` trajectory when `mask_infra_errors`
    response_logprobs the server's logprob of each model token, 0.0 on observation tokens; None
                      when verl did not ask for logprobs (`calculate_log_probs: false`)
    num_turns         verl's count: the user turn + every model turn + every tool turn
    metrics           verl's AgentLoopMetrics: seconds spent generating and in tools, preemptions
    extra_fields      rlfactory_status, rlfactory_error, rlfactory_turns, rlfactory_tool_calls
                      (name, status, latency_s, cached, turn per call), rlfactory_tool_statuses
                      (status -> count), rlfactory_request_id (the sticky id sent to verl's
                      server on every turn); with `score`, rlfactory_reward_terms; with
                      `keep_trajectory`, rlfactory_trajectory (JSON)

verl turns each `extra_fields` key into a column of the batch's non_tensor_batch (a reward
function reads them there).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rlfactory.trajectory import Trajectory


@dataclass
class AgentLoopFields:
    """The keyword arguments of verl's `AgentLoopOutput(...)`, without verl's classes."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None
    num_turns: int
    metrics: dict[str, float]
    extra_fields: dict[str, Any] = field(default_factory=dict)
    reward_score: float | None = None

    def as_kwargs(self) -> dict[str, Any]:
        kwargs = dict(self.__dict__)
        if kwargs["reward_score"] is None:
            del kwargs["reward_score"]  # left unset, so verl's reward function scores it
        return kwargs


def trajectory_fields(traj: Trajectory, *, generate_s: float, num_preempted: int | None, with_logprobs: bool,
                      mask_infra_errors: bool = True, keep_trajectory: bool = False) -> AgentLoopFields:
    """The AgentLoopOutput fields of `traj` (see the module doc). `generate_s`: seconds spent in
    the server's generate calls; `num_preempted`: their preemptions (None: not reported)."""
    prompt_len = traj.prompt_len
    ids = traj.input_ids
    mask = traj.loss_mask[prompt_len:]
    if traj.status == "infra_error" and mask_infra_errors:
        mask = [0] * len(mask)
    logprobs = traj.sampler_logprobs if with_logprobs else None
    observations = sum(1 for s in traj.segments if s.role == "observation")
    return AgentLoopFields(
        prompt_ids=ids[:prompt_len],
        response_ids=ids[prompt_len:],
        response_mask=mask,
        response_logprobs=logprobs,
        num_turns=1 + traj.turns + observations,
        metrics={"generate_sequences": generate_s, "tool_calls": float(traj.metrics.get("tool_s", 0.0)),
                 "num_preempted": -1 if num_preempted is None else num_preempted},
        extra_fields=status_fields(traj, keep_trajectory),
    )


def status_fields(traj: Trajectory, keep_trajectory: bool = False) -> dict[str, Any]:
    """rlfactory's record of the trajectory, for verl's `extra_fields`."""
    calls = [{"name": c.name, "status": c.status, "latency_s": c.latency_s, "cached": c.cached, "turn": c.turn}
             for c in traj.tool_calls]
    out: dict[str, Any] = {
        "rlfactory_status": traj.status,
        "rlfactory_error": traj.error,
        "rlfactory_turns": traj.turns,
        "rlfactory_tool_calls": calls,
        "rlfactory_tool_statuses": dict(Counter(c.status for c in traj.tool_calls)),
    }
    if keep_trajectory:
        out["rlfactory_trajectory"] = traj.to_json()
    return out
