"""`open_ray_rollout(cfg)`: the rollout session of a `trainer.backend: ray` run.

Joins or starts the Ray cluster (cluster.py), starts `ray.tool_pools` tool-pool actors and
`ray.rollout_workers` rollout workers, and opens the driver's own session through the same
`open_rollout` as in-process training: the learner's model and tokenizer, the env (data, reward)
and a ToolRunner for rewards that call tools, its MCP servers reached through pool 0 (no server
is started twice). The session's `engine` rolls out on the workers; its `weight_sync` sends the
policy to them (through the object store), or, with `generator.backend: server`, to the
generation servers that every worker's ServerGenerator sends its turns to. Everything started is stopped when the block exits (and Ray is shut down if
this call started or joined it).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator, Literal, Sequence

from rlfactory.distributed.cluster import connect_cluster, require_ray
from rlfactory.distributed.engine import RayRolloutEngine
from rlfactory.distributed.tool_pool import ToolPool, close_pools, pool_connector, start_pools
from rlfactory.distributed.weights import RayWeightSync
from rlfactory.distributed.workers import WorkerSet

if TYPE_CHECKING:
    from ray.actor import ActorHandle
    from torch import nn
    from transformers import PreTrainedTokenizerBase

    from rlfactory.chat.base import ToolManager
    from rlfactory.config import RunConfig
    from rlfactory.envs.base import Env
    from rlfactory.protocols import Generator, WeightSync
    from rlfactory.rewards.base import Reward
    from rlfactory.tools.runner import ToolRunner


@dataclass
class RaySession:
    """A RolloutSession whose engine runs on Ray workers (the fields the Trainer reads, plus Ray's)."""

    engine: RayRolloutEngine
    generator: Generator
    """The driver's own generator (LocalGenerator on the learner's model, or a ServerGenerator whose
    server list the weight sync updates); rollouts run on the workers."""
    model: nn.Module | None
    tokenizer: PreTrainedTokenizerBase
    tool_manager: ToolManager
    runner: ToolRunner
    env: Env
    weight_sync: WeightSync | None
    """RayWeightSync (embedded workers), or the generation servers' WeightSync (None: no sync)."""
    workers: WorkerSet
    pools: list[ActorHandle[ToolPool]] = field(default_factory=list)
    """The tool-pool actors' Ray handles."""
    reward: Reward | None = None
    """The run's reward (built by the driver's open_rollout; None when not asked for)."""


@contextlib.asynccontextmanager
async def open_ray_rollout(cfg: RunConfig, *, logits_processor: str | None = None,
                           reward_mode: Literal["optional", "required", "off"] = "optional",
                           check_splits: Sequence[str] = ()) -> AsyncIterator[RaySession]:
    """A RaySession for `cfg` (a RunConfig; see the module doc). `logits_processor`: a
    `module:factory` whose `factory(tokenizer)` every worker installs on its generator (a
    ScriptedPolicy for tests and benchmarks). `reward_mode` and `check_splits` go to the
    driver's open_rollout: the env, tools, reward and data are checked before any worker starts."""
    from rlfactory.train.session import open_rollout
    from rlfactory.train.weight_sync import make_weight_sync

    require_ray()
    on_servers = cfg.generator.backend == "server"
    joined = connect_cluster(cfg.ray)
    sys_path = list(sys.path)  # so workers import what the driver can (tools and envs next to the config)
    pools: list[ActorHandle[ToolPool]] = []
    try:
        pools = start_pools(cfg.ray.tool_pools, sys_path)
        async with open_rollout(cfg, connect_server=pool_connector(pools[0]), reward_mode=reward_mode,
                                check_splits=check_splits) as local:
            workers = WorkerSet(cfg, pools, sys_path, logits_processor, load_policy=not on_servers)
            try:
                await workers.start()
                engine = RayRolloutEngine(workers, cfg.rollout, cfg.sampling, local.env, cfg.ray.shard_retries)
                # Embedded workers get the weights through the object store; generation servers
                # get them from the driver, as in a run without Ray.
                sync = make_weight_sync(cfg, local.generator) if on_servers else RayWeightSync(workers)
                yield RaySession(engine, local.generator, local.model, local.tokenizer, local.tool_manager,
                                 local.runner, local.env, sync, workers, pools, local.reward)
            finally:
                await workers.close()
    finally:
        await close_pools(pools)
        if joined:
            import ray

            ray.shutdown()
