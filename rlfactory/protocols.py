"""Protocols at the bottom of the house: what one layer offers another, named here instead of `Any`.

`WeightSync`: gives the generators each new policy version. The learner owns the weights; after an
update the training step calls `ensure(policy, version)` and logs the metrics it returns. Three
implement it: `rlfactory.train.weight_sync.ServerWeightSync` (generation servers, over HTTP, disk
or NCCL), `rlfactory.distributed.weights.RayWeightSync` (Ray rollout workers, through the object
store) and `rlfactory.train.async_pipeline.LocalWeightSync` (the local generator's copy of the
policy in asynchronous training). Every one logs its time as `WEIGHT_SYNC_SECONDS` and, where it
moves bytes, their size as `WEIGHT_SYNC_MB`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import nn

WEIGHT_SYNC_SECONDS = "weight_sync/seconds"
"""Seconds one push took in the training step (for a push that finishes later, its start)."""
WEIGHT_SYNC_PREPARE_S = "weight_sync/prepare_s"
"""Seconds spent building what is sent (serialising, writing a checkpoint folder)."""
WEIGHT_SYNC_MB = "weight_sync/mb"
"""Megabytes of weights one push moved."""
WEIGHT_SYNC_OK = "weight_sync/ok"
"""Generation servers that took the new weights."""
WEIGHT_SYNC_FAILED = "weight_sync/failed"
"""Generation servers that did not (they get no turns until a later push succeeds)."""


@runtime_checkable
class WeightSync(Protocol):
    """Gives every generator the learner's weights as a policy version."""

    async def ensure(self, policy: "nn.Module", version: int) -> dict[str, float]:
        """Make sure the generators hold `version` (push it unless they already do); returns the
        push's metrics, or {} when nothing was pushed."""
        ...

    async def push(self, policy: "nn.Module", version: int) -> dict[str, float]:
        """Send `policy`'s weights as `version` to the generators; returns metrics."""
        ...
