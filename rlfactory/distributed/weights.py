"""Weight sync for Ray rollout workers: the learner's weights through the object store.

After each update the driver puts the policy's weights into Ray's object store once
(`ray.put`) and every worker loads that one copy (`load_weights(ref, version)`), so the cost
is one serialisation per step, not one per worker. Tensors travel as numpy arrays, which
Ray's object store hands to workers on the same node without a copy (bfloat16, which numpy
lacks, travels as its int16 bits). A LoRA policy is sent merged (W + scale * B @ A), under the
base model's names, so workers run a plain model.

Same shape as the generation-server weight sync (`ensure` / `push` returning metrics), so the
trainer treats both alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias

import numpy as np
import torch
from torch import nn

from rlfactory.protocols import WEIGHT_SYNC_MB, WEIGHT_SYNC_SECONDS
from rlfactory.train.policy_weights import policy_tensors

if TYPE_CHECKING:
    from ray import ObjectRef


def policy_state(policy: nn.Module) -> WireState:
    """The generation weights of `policy` by parameter name, as CPU numpy arrays (see to_wire).
    A peft LoRA model is merged for the copy and left as it was."""
    return {name: to_wire(t) for name, t in policy_tensors(policy, cpu=False).items()}


@dataclass
class Bf16Bits:
    """A bfloat16 tensor as the int16 numpy array of its bits (numpy has no bfloat16)."""

    bits: np.ndarray


def to_wire(t: torch.Tensor) -> np.ndarray | Bf16Bits:
    """A detached CPU copy of `t` as numpy (bfloat16 as Bf16Bits)."""
    t = t.detach().to("cpu", copy=True).contiguous()
    if t.dtype == torch.bfloat16:
        return Bf16Bits(t.view(torch.int16).numpy())
    return t.numpy()


WireState: TypeAlias = dict[str, np.ndarray | Bf16Bits]
"""The policy's weights by parameter name as they travel through the object store (see to_wire)."""


def from_wire(a: np.ndarray | Bf16Bits | torch.Tensor) -> torch.Tensor:
    """Inverse of to_wire (a torch tensor passes through)."""
    if isinstance(a, torch.Tensor):
        return a
    if isinstance(a, Bf16Bits):
        return torch.from_numpy(np.array(a.bits)).view(torch.bfloat16)
    return torch.from_numpy(np.array(a))


def wire_bytes(state: WireState) -> int:
    return sum((a.bits if isinstance(a, Bf16Bits) else a).nbytes for a in state.values())


class LoadsWeights(Protocol):
    """What RayWeightSync needs of its workers (workers.WorkerSet offers it; named here so that this
    module does not import the worker set, which imports it)."""

    async def load_weights(self, ref: ObjectRef[WireState], version: int) -> None: ...


class RayWeightSync:
    """Pushes the learner's weights to every rollout worker of `workers` (a WorkerSet); a
    `rlfactory.protocols.WeightSync`."""

    def __init__(self, workers: LoadsWeights) -> None:
        self.workers = workers
        self.pushed: int | None = None
        """The last version every live worker was given."""

    async def ensure(self, policy: nn.Module, version: int) -> dict[str, float]:
        """Push `version` unless it was the last one pushed (e.g. the first step, or after a resume)."""
        if self.pushed == version:
            return {}
        return await self.push(policy, version)

    async def push(self, policy: nn.Module, version: int) -> dict[str, float]:
        """Put `policy`'s weights in the object store as `version`; every worker loads them (a
        dead one is replaced, and its replacement starts from them). Returns metrics."""
        import ray

        t0 = time.perf_counter()
        state = policy_state(policy)
        ref = ray.put(state)
        await self.workers.load_weights(ref, version)
        self.pushed = version
        mb = wire_bytes(state) / 1e6
        return {WEIGHT_SYNC_MB: mb, WEIGHT_SYNC_SECONDS: time.perf_counter() - t0}
