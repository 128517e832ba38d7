"""The rlfactory side of a verl agent loop: one YAML file, validated into `VerlAgentConfig`.

verl owns the model, the sampling settings and the length limits (`actor_rollout_ref.rollout.
prompt_length` / `response_length`); this file names what rlfactory brings: the ToolManager family,
the env, its tools and the per-turn limits of the multi-turn rollout. Unknown keys are errors that
name the key and the file, as everywhere in rlfactory.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from pydantic import Field

from rlfactory.config import EnvConfig, Section, ToolsConfig, load_config


class VerlRolloutConfig(Section):
    """Per-turn limits of the rollout inside verl's agent loop. The whole trajectory's budget is
    verl's: the prompt must fit in `actor_rollout_ref.rollout.prompt_length` and everything after
    it (model and observation tokens) in `response_length`."""

    max_turns: int | None = Field(None, ge=1)
    """Model turns per trajectory; unset = the env's `max_turns`."""
    max_new_tokens: int = Field(512, ge=1)
    """Most tokens of one model turn (sent to verl's server as `max_tokens`, never more than what
    is left of `response_length`)."""
    max_observation_tokens: int = Field(512, ge=1)
    """Most tokens of one observation (one tool turn); longer tool output is cut and marked
    `[truncated]`."""


class VerlAgentConfig(Section):
    """What `rlfactory.integrations.verl.agent_loop.RLFactoryAgentLoop` runs inside verl."""

    family: str | None = None
    """ToolManager family: qwen3, llama3, searchr1 or `module:Class`; unset = guessed from verl's
    tokenizer and model type. Its token contract is checked against verl's tokenizer once per
    worker, before the first trajectory."""
    env: EnvConfig = EnvConfig(name="rlfactory.rollout.prompt_env:PromptEnv")
    """The env each dataset row is rolled out in (default: PromptEnv, the row's messages with the
    `tools:` section's tools)."""
    tools: ToolsConfig = ToolsConfig()
    """Tools besides the env's own: MCP servers and Python functions. Started once per verl agent
    loop worker, on its first trajectory, and shared by all the trajectories of that worker."""
    rollout: VerlRolloutConfig = VerlRolloutConfig()
    """Per-turn limits."""
    mask_infra_errors: bool = True
    """Give a trajectory that ended `infra_error` (the tool layer could not serve a turn) a
    response_mask of zeros, so it adds nothing to verl's loss. Its status and error are in the
    output's `extra_fields` either way."""
    score: bool = False
    """Score each trajectory with the env's own reward and hand it to verl as `reward_score` (verl
    then skips its reward function for that sample); an `infra_error` trajectory is not scored.
    Off: verl's reward function scores the response, as for any agent loop."""
    keep_trajectory: bool = False
    """Put the whole rlfactory Trajectory (JSON) in `extra_fields["rlfactory_trajectory"]`, for
    debugging and tests; it is large."""


def load_verl_agent_config(path: str | Path, overrides: Sequence[str] = ()) -> VerlAgentConfig:
    """Validate the YAML at `path` plus dotted `overrides` (e.g. `rollout.max_turns=3`), and make
    the file's folder importable (for `tools.python: [module:function]` and `env.name:
    module:Class` living next to it)."""
    cfg = load_config(VerlAgentConfig, path, list(overrides))
    folder = str(Path(path).resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return cfg
