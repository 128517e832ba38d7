"""Scale-out on engines users already run: Ray rollout workers and tool pools (`trainer.backend: ray`).

    async with open_ray_rollout(cfg) as session:      # workers, tool pools, the learner's model
        trainer = Trainer(cfg, session, reward, rows)  # rolls out on the workers, learns here

What runs where: the learner (policy, optimizer, checkpoints) in the driver process; each
rollout worker (worker.py) is a Ray actor with its own copy of the policy, its own LocalGenerator
(built by the same `open_rollout` as in-process training) and its own ToolRunner; the MCP
servers run in tool-pool actors (tool_pool.py) that the workers' runners call through. New
weights go through Ray's object store once per step (weights.py).

Names are imported lazily and nothing here imports `ray` until it is used, so `import rlfactory`
works without Ray installed.
"""

from __future__ import annotations

from rlfactory.lazy import lazy_exports

_EXPORTS = {
    "open_ray_rollout": "session",
    "RaySession": "session",
    "RayRolloutEngine": "engine",
    "RayWeightSync": "weights",
    "WorkerSet": "workers",
    "ToolPool": "tool_pool",
    "PoolConnection": "tool_pool",
    "RolloutWorker": "worker",
    "connect_cluster": "cluster",
    "require_ray": "cluster",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())
