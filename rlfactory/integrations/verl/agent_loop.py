"""`RLFactoryAgentLoop`: rlfactory's envs, MCP tools, parsers and token contract as a verl agent loop.

Name it in verl's agent-loop YAML (`actor_rollout_ref.rollout.agent.agent_loop_config_path`):

    - name: rlfactory
      _target_: rlfactory.integrations.verl.agent_loop.RLFactoryAgentLoop
      rlfactory_config: examples/verl/calculator.yaml   # a VerlAgentConfig YAML
      overrides: ["rollout.max_turns=4"]                 # optional dotted overrides

and select it per dataset row with the `agent_name` column (or for every row with
`actor_rollout_ref.rollout.agent.default_agent_loop=rlfactory`). Importing this module also
registers it under the name `rlfactory` (verl's `register`) unless an agent-loop YAML entry has
that name already; that registered entry reads its config path from the environment variable
RLFACTORY_VERL_CONFIG.

verl builds one agent loop object per sample; the env, ToolManager and started ToolRunner live
per worker (worker.py). Tested with verl 0.9.1 (see tests/integrations).
"""

from __future__ import annotations

import os
from typing import Any

try:
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, _agent_loop_registry, register
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(f"rlfactory.integrations.verl.agent_loop needs verl ({e}); install it beside rlfactory "
                      "(see the README section 'Inside verl')") from e

from rlfactory.integrations.verl.rollout import env_row, rollout_row
from rlfactory.integrations.verl.worker import get_worker

CONFIG_ENV = "RLFACTORY_VERL_CONFIG"
AGENT_NAME = "rlfactory"


class RLFactoryAgentLoop(AgentLoopBase):
    """verl's `AgentLoopBase` running one rlfactory trajectory per `run` (see the module doc)."""

    def __init__(self, *args: Any, rlfactory_config: str | None = None, overrides: Any = (), tools: Any = None,
                 name: str | None = None, **kwargs: Any) -> None:
        # `tools` (verl 0.9's own tool list) and `name` (the YAML entry's) are verl's; unused here.
        self.hf_model_type = kwargs.get("hf_model_type")
        super().__init__(*args, **kwargs)
        path = rlfactory_config or os.environ.get(CONFIG_ENV)
        if not path:
            raise ValueError(f"agent loop {name or 'rlfactory'!r}: set `rlfactory_config:` (a VerlAgentConfig YAML) "
                             f"in the agent loop YAML, or the environment variable {CONFIG_ENV}")
        self.rlfactory_config = str(path)
        self.overrides = [str(o) for o in overrides or ()]

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Roll out the row in `kwargs` (verl's batch columns) and return its AgentLoopOutput."""
        worker = await get_worker(self.rlfactory_config, self.overrides, self.tokenizer, self.hf_model_type)
        rollout = self.config.actor_rollout_ref.rollout
        fields = await rollout_row(worker, self.server_manager, sampling_params, env_row(kwargs),
                                   prompt_length=int(rollout.prompt_length),
                                   response_length=int(rollout.response_length))
        return AgentLoopOutput(**fields.as_kwargs())


# Registered only when no agent-loop YAML entry took the name already: hydra imports this module
# while instantiating that entry, and must not replace it (with its rlfactory_config) by this one.
if AGENT_NAME not in _agent_loop_registry:
    register(AGENT_NAME)(RLFactoryAgentLoop)
