"""Config of the FSDP2 learner (rlfactory.distributed.fsdp), used when a run is launched on
several processes: `rlfactory train CONFIG --nproc N` or `torchrun --nproc-per-node N -m
rlfactory.cli.main train CONFIG`. A run in one process ignores it."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from rlfactory.config.base import Section


class FsdpConfig(Section):
    """The FSDP2 learner, used under torchrun (`rlfactory train CONFIG --nproc N`); ignored in one process.

    Each rank rolls out its share of the step's prompts; the policy's parameters, gradients and
    optimizer state are sharded over the ranks (`fully_shard` per decoder layer plus the rest);
    rank 0 writes the logs and the checkpoint's model folder."""

    backend: Literal["auto", "nccl", "gloo"] = "auto"
    """torch.distributed backend: auto = nccl when CUDA is available (one GPU per rank, by
    LOCAL_RANK), else gloo (CPU)."""
    mixed_precision: bool = False
    """FSDP2 MixedPrecisionPolicy: parameters are gathered and computed in bfloat16, gradients
    reduced in float32; the sharded weights and optimizer state stay float32. Meant for GPUs
    (on CPU bfloat16 is slow); results then differ from a float32 run by bf16 rounding."""
    reshard_after_forward: bool = True
    """Free each layer's gathered parameters after its forward and gather them again for the
    backward (least memory, ZeRO-3); false keeps them until the backward (fewer all-gathers)."""
    timeout_s: float = 1800.0
    """Seconds a rank waits in a collective (e.g. while rank 0 evaluates or writes a checkpoint)
    before the run fails."""

    @model_validator(mode="after")
    def _check(self) -> "FsdpConfig":
        if self.timeout_s <= 0:
            raise ValueError("fsdp.timeout_s must be > 0")
        return self
