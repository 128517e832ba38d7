"""One dataset row of a verl batch, rolled out by rlfactory's engine: `rollout_row`.

The row goes through rlfactory's own rollout loop (RolloutEngine, one trajectory), with a
VerlGenerator as its generator, the worker's env, ToolManager and ToolRunner; the Trajectory it
returns becomes verl's AgentLoopOutput fields (output.py). Nothing here imports verl.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any, Mapping

import numpy as np

from rlfactory.integrations.verl.generator import VerlGenerator
from rlfactory.integrations.verl.output import AgentLoopFields, trajectory_fields
from rlfactory.integrations.verl.worker import VerlWorker
from rlfactory.config import RolloutConfig, SamplingConfig
from rlfactory.rollout.engine import RolloutEngine
from rlfactory.trajectory import Segment, Trajectory

log = logging.getLogger("rlfactory.integrations.verl")

ROW_COLUMN = "rlfactory_row"
"""The dataset column holding the env's own row as JSON (written by rlfactory.integrations.verl.dataset)."""
VERL_COLUMNS = frozenset({"agent_name", "raw_prompt", "index", "tools_kwargs", "interaction_kwargs", "extra_info",
                          "reward_model", "data_source", "multi_modal_data", "__num_turns__", "uid"})
"""Columns of a verl batch that are verl's bookkeeping, not the env's row."""


def env_row(columns: Mapping[str, Any]) -> dict[str, Any]:
    """The env's row from the columns verl passes to `run(**row)`: the JSON in `rlfactory_row`
    when the dataset has it; else the other non-verl columns, with verl's `raw_prompt` as
    `messages` when they have neither `messages` nor `question`."""
    if ROW_COLUMN in columns:
        raw = columns[ROW_COLUMN]
        row = json.loads(raw) if isinstance(raw, (str, bytes)) else plain(raw)
        if not isinstance(row, dict):
            raise ValueError(f"column {ROW_COLUMN!r} must hold a JSON object, got {type(row).__name__}")
        return row
    row = {k: plain(v) for k, v in columns.items() if k not in VERL_COLUMNS and k != ROW_COLUMN}
    if "messages" not in row and "question" not in row and "raw_prompt" in columns:
        row["messages"] = plain(columns["raw_prompt"])
    return row


def plain(value: Any) -> Any:
    """numpy arrays and scalars (how verl's batch holds non-tensor columns) as Python values."""
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


async def rollout_row(worker: VerlWorker, server_manager: Any, sampling_params: dict[str, Any],
                      row: dict[str, Any], *, prompt_length: int, response_length: int) -> AgentLoopFields:
    """Roll out `row` (the env's row) as one trajectory and return verl's AgentLoopOutput fields.

    The trajectory's budget is verl's: a prompt longer than `prompt_length` is not rolled out (its
    last `prompt_length` tokens are returned with an empty response, status truncated); the
    response (model + observation tokens) never exceeds `response_length`, because the engine's
    `max_total_tokens` is set to prompt + response_length. A failure of verl's server ends the
    trajectory `infra_error` with an empty response rather than failing verl's whole batch.
    """
    cfg = worker.config
    generator = VerlGenerator(server_manager, sampling_params, worker.tokenizer, request_id=uuid.uuid4().hex)
    worker.trajectories += 1
    prompt_ids = worker.prompt_ids(row)
    if len(prompt_ids) > prompt_length:
        error = (f"the prompt has {len(prompt_ids)} tokens, more than actor_rollout_ref.rollout.prompt_length="
                 f"{prompt_length}; not rolled out (raise prompt_length, or lower data.max_prompt_length)")
        log.warning("rlfactory agent loop: %s", error)
        return failed(worker, prompt_ids[-prompt_length:], "truncated", error, generator)
    rollout = RolloutConfig(mode="async", max_turns=cfg.rollout.max_turns, max_new_tokens=cfg.rollout.max_new_tokens,
                            max_total_tokens=len(prompt_ids) + response_length,
                            max_observation_tokens=cfg.rollout.max_observation_tokens, reuse_kv=False)
    engine = RolloutEngine(generator, worker.tool_manager, worker.runner, worker.env, rollout, SamplingConfig(),
                           tokenizer=worker.tokenizer)
    try:
        [traj] = await engine.run([row], 1)
    except Exception as e:  # verl's server failed (or aborted the turn): this trajectory only
        error = f"the rollout failed at turn {generator.calls}: {type(e).__name__}: {e}"
        log.warning("rlfactory agent loop: trajectory %s ends infra_error: %s", generator.request_id, error,
                    exc_info=True)
        return failed(worker, prompt_ids, "infra_error", error, generator)
    if traj.segments[0].token_ids != prompt_ids:
        raise RuntimeError(f"env {cfg.env.name!r} rendered two different prompts for one row "
                           "(env.reset must be a function of the row)")
    if traj.status == "infra_error":
        worker.infra_errors += 1
        log.warning("rlfactory agent loop: trajectory %s ends infra_error: %s", generator.request_id, traj.error)
    reward_score, terms = None, None
    if worker.reward is not None and traj.status != "infra_error":
        score = await worker.reward.score(traj)
        traj.reward, traj.reward_terms = float(score.total), dict(score.terms)
        reward_score, terms = traj.reward, traj.reward_terms
    fields = trajectory_fields(traj, generate_s=generator.generate_s, num_preempted=generator.num_preempted,
                               with_logprobs=generator.wants_logprobs, mask_infra_errors=cfg.mask_infra_errors,
                               keep_trajectory=cfg.keep_trajectory)
    fields.reward_score = reward_score
    fields.extra_fields["rlfactory_request_id"] = generator.request_id
    if terms is not None:
        fields.extra_fields["rlfactory_reward_terms"] = terms
    return fields


def failed(worker: VerlWorker, prompt_ids: list[int], status: str, error: str, generator: VerlGenerator
           ) -> AgentLoopFields:
    """The fields of a trajectory that has its prompt only (it could not be rolled out)."""
    if status == "infra_error":
        worker.infra_errors += 1
    traj = Trajectory(id=generator.request_id, group=generator.request_id, status=status, error=error,
                      segments=[Segment("prompt", list(prompt_ids))])
    fields = trajectory_fields(traj, generate_s=generator.generate_s, num_preempted=generator.num_preempted,
                               with_logprobs=generator.wants_logprobs, keep_trajectory=worker.config.keep_trajectory)
    fields.extra_fields["rlfactory_request_id"] = generator.request_id
    return fields
