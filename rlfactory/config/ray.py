"""Config section `ray:`: where the pieces of a `trainer.backend: ray` run are placed.

Only settings live here (no Ray import); rlfactory.distributed reads them.
"""

from __future__ import annotations

from pydantic import Field

from rlfactory.config.base import ConfigPath, Section


class RayConfig(Section):
    """Ray placement for `trainer.backend: ray`: the cluster, the rollout workers, the tool pools.

    The learner runs in the driver (the `rlfactory train` process); rollout workers are Ray actors, each with its own copy of the policy for
    generation and its own ToolRunner; the MCP servers of `tools.mcp` and of the env run in
    tool-pool actors that every worker calls through. After each update the driver puts the new
    weights in Ray's object store once and every worker loads them, with the policy version."""

    address: str | None = None
    """The Ray cluster to join, e.g. `ray://head:10001` or `head:6379`. Unset: join the cluster
    named by the RAY_ADDRESS environment variable when it is set (`ray.init(address="auto")`),
    else start a local cluster with this machine's cores (stopped when the run ends)."""
    num_cpus: int | None = Field(None, ge=1)
    """CPUs of a local cluster started by the run; unset = the machine's cores."""
    temp_dir: ConfigPath | None = None
    """Ray's session folder for a local cluster started by the run; unset = Ray's default
    (/tmp/ray). Has no effect when joining a cluster."""
    rollout_workers: int = Field(2, ge=1)
    """Rollout worker actors. A step's rows are split among them by group (row i's n trajectories
    stay on one worker), in order, as evenly as the rows allow."""
    worker_cpus: float = Field(1.0, ge=0)
    """CPUs each rollout worker reserves (its torch threads follow Ray's OMP_NUM_THREADS)."""
    worker_gpus: float = Field(0.0, ge=0)
    """GPUs each rollout worker reserves for its generator (fractions share a GPU)."""
    tool_pools: int = Field(1, ge=1)
    """Tool-pool actors, each running one copy of every MCP server; worker i calls pool
    i mod tool_pools. Python-function tools run inside each worker."""
    shard_retries: int = Field(1, ge=0)
    """When a rollout worker dies mid-step, a replacement is started and its share of the step
    is rolled out again this many times; after that its trajectories end `infra_error` (left
    out of the loss and of their group's baseline) and the run goes on."""
    worker_start_timeout_s: float = Field(600.0, gt=0)
    """Seconds a worker has to start (load the model, start its tools) before the run stops with
    an error naming it."""
