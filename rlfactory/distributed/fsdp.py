"""The FSDP2 learner: the trainer's `Parallel` (rlfactory/train/parallel.py) for the ranks of a
torchrun launch.

- Process group: gloo on CPU, nccl with CUDA (one GPU per rank, by LOCAL_RANK); CPU threads per
  rank = the cores / ranks on this node (1 each for 2 ranks on 2 cores), unless OMP_NUM_THREADS says.
- Rollout: every rank keeps a full, unsharded copy of the policy (the rollout session's model,
  the "replica") and rolls out its contiguous share of the step's prompts (whole groups).
- Gather: all ranks' trajectories go to every rank (`all_gather_object`), so advantages, metrics
  and logs are those of one process.
- Update: the trained module is a sharded copy of the policy (`fully_shard` on each decoder layer,
  then on the whole; parameters, gradients and AdamW state are sharded). Gradients are summed
  over ranks (divide factor 1); each rank's micro-batches are weighted by the global token count,
  so the sum is the single-process gradient. After each update every rank gathers the full
  weights into its replica, one parameter at a time.
- Checkpoint: rank 0 writes the Hugging Face folder from the gathered full state dict
  (`get_model_state_dict(full_state_dict=True, cpu_offload=True)`) with trainer_state.pt and
  meta.json; the optimizer state is written sharded by every rank with torch.distributed.checkpoint
  (optimizer/), and each rank's RNG states to rng_rank<r>.pt. The folder is renamed into place
  once all ranks have written (run_dir must be on a filesystem every node sees).
"""

from __future__ import annotations

import copy
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from rlfactory.config import ConfigError, FsdpConfig, RunConfig
from rlfactory.train.checkpoint import (
    CheckpointMeta,
    commit_checkpoint,
    load_checkpoint,
    rng_state,
    start_checkpoint,
    write_checkpoint_files,
)
from rlfactory.train.logprobs import PolicyModule, decoder_and_head
from rlfactory.train.model import load_full_weights

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

T = TypeVar("T")


def launched_by_torchrun() -> bool:
    """Whether this process is one rank of a torchrun launch (RANK and WORLD_SIZE are set)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def check_config(cfg: RunConfig, world_size: int) -> None:
    """What the FSDP learner does not do (yet) is a one-line ConfigError naming the key."""
    tr = cfg.trainer
    if tr.backend != "local":
        raise ConfigError(f"trainer.backend: {tr.backend} rollout workers and the FSDP learner (torchrun / --nproc) "
                          "do not combine yet; use trainer.backend: local under torchrun")
    if tr.lora is not None:
        raise ConfigError("trainer.lora: LoRA is not supported with the FSDP learner (torchrun / --nproc); "
                          "train LoRA in one process, or drop trainer.lora for full fine-tuning")
    if cfg.algo.advantage == "gae":
        raise ConfigError("algo.advantage: gae (a critic) is not supported with the FSDP learner yet; "
                          "use grpo, dr_grpo, rloo or reinforce++")
    if cfg.generator.backend != "local":
        raise ConfigError("generator.backend: the FSDP learner rolls out with the local generator on every "
                          "rank; a server backend is not supported with it yet")
    if tr.prompts_per_step % world_size:
        raise ConfigError(f"trainer.prompts_per_step={tr.prompts_per_step} must be a multiple of the number "
                          f"of processes ({world_size}): each rank rolls out whole groups")


def threads_per_rank(local_world_size: int) -> int:
    """OMP_NUM_THREADS when set, else this machine's cores split evenly over its ranks (at least 1)."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, (os.cpu_count() or 1) // max(local_world_size, 1))


class FsdpLearner:
    """One rank of the FSDP2 learner (the trainer's `Parallel`). Initialises the process group."""

    sharded = True

    def __init__(self, cfg: FsdpConfig) -> None:
        self.cfg = cfg
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.threads = threads_per_rank(int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size)))
        torch.set_num_threads(self.threads)
        cuda = torch.cuda.is_available()
        backend = cfg.backend if cfg.backend != "auto" else ("nccl" if cuda else "gloo")
        if backend == "nccl" and not cuda:
            raise ConfigError("fsdp.backend: nccl needs CUDA, and no CUDA device is visible; use gloo or auto")
        self.device_type = "cuda" if backend == "nccl" else "cpu"
        if self.device_type == "cuda":
            torch.cuda.set_device(self.local_rank)
        if not dist.is_initialized():
            dist.init_process_group(backend, timeout=timedelta(seconds=cfg.timeout_s))
        self.backend = backend
        from torch.distributed.device_mesh import init_device_mesh

        self.mesh = init_device_mesh(self.device_type, (self.world_size,))
        if self.is_main:
            print(f"rlfactory: FSDP2 learner on {self.world_size} rank(s), backend {backend}, "
                  f"{self.threads} CPU thread(s) per rank", file=sys.stderr)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def close(self, synchronize: bool = True) -> None:
        """Destroy the process group. `synchronize` (every rank got here without an error): first
        a barrier, so that no rank tears its gloo connections down while a peer still finishes the
        last collective on them (a peer's gloo thread then aborts the process: "terminate called
        without an active exception", seen once in CI). Without it a rank that failed does not
        wait for the others."""
        if dist.is_initialized():
            if synchronize:
                dist.barrier()
            dist.destroy_process_group()

    # ---- rows and gathers -------------------------------------------------------------------

    def share(self, items: Sequence[T]) -> list[T]:
        n = len(items)
        if n % self.world_size:
            raise ValueError(f"{n} prompts cannot be split evenly over {self.world_size} ranks")
        k = n // self.world_size
        return list(items[self.rank * k:(self.rank + 1) * k])

    def gather(self, items: list[T]) -> list[T]:
        parts: list[list[T]] = [[] for _ in range(self.world_size)]
        dist.all_gather_object(parts, items)
        parts[self.rank] = items
        return [x for part in parts for x in part]

    def barrier(self) -> None:
        dist.barrier()

    # ---- sharding ---------------------------------------------------------------------------

    def _shard(self, module: PolicyModule) -> PolicyModule:
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)
              if self.cfg.mixed_precision else MixedPrecisionPolicy(cast_forward_inputs=False))
        opts = dict(mesh=self.mesh, mp_policy=mp)
        decoder, _ = decoder_and_head(module.model)
        for layer in getattr(decoder, "layers", []):
            fully_shard(layer, reshard_after_forward=self.cfg.reshard_after_forward, **opts)
        fully_shard(module, reshard_after_forward=False, **opts)  # the root is needed again right away
        for m in module.modules():
            if isinstance(m, FSDPModule):
                m.set_gradient_divide_factor(1.0)  # sum over ranks: the loss is already globally normalised
                m.set_force_sum_reduction_for_comms(True)  # a plain sum (gloo has no PREMUL_SUM)
        return module

    def wrap_policy(self, model: nn.Module) -> nn.Module:
        """A sharded copy of `model` (which stays whole, as the rollout replica)."""
        return self._shard(PolicyModule(copy.deepcopy(model)))

    def wrap_frozen(self, model: nn.Module) -> nn.Module:
        """`model` (the KL reference, no gradients) sharded in place."""
        return self._shard(PolicyModule(model))

    @torch.no_grad()
    def sync_replica(self, learner: nn.Module, replica: nn.Module) -> None:
        """Gather each sharded parameter in full (every rank) and copy it into the replica."""
        from torch.distributed.tensor import DTensor

        mine = dict(replica.named_parameters())
        for name, p in learner.named_parameters():
            full = p.full_tensor() if isinstance(p, DTensor) else p
            mine[name.removeprefix("model.")].copy_(full)

    # ---- checkpoints ------------------------------------------------------------------------

    def save_checkpoint(self, run_dir: str | Path, meta: CheckpointMeta, learner: nn.Module, replica: nn.Module,
                        tokenizer: PreTrainedTokenizerBase, optimizer: torch.optim.Optimizer, trainer_state: dict[str, Any],
                        keep_last: int) -> Path:
        """Write checkpoint `meta.step` (see the module docstring); every rank calls it."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        meta.world_size, meta.sharded = self.world_size, True
        full = get_model_state_dict(learner, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        optim_state = get_optimizer_state_dict(learner, optimizer)
        tmp = final = None
        if self.is_main:
            tmp, final = start_checkpoint(run_dir, meta.step)
        tmp, final = self._broadcast((tmp, final))
        dcp.save({"optimizer": optim_state}, checkpoint_id=str(tmp / "optimizer"))
        torch.save(rng_state(), tmp / f"rng_rank{self.rank}.pt")
        self.barrier()
        if self.is_main:
            state_dict = {k.removeprefix("model."): v for k, v in full.items()}
            write_checkpoint_files(tmp, meta, replica, tokenizer, trainer_state, state_dict=state_dict)
            commit_checkpoint(run_dir, tmp, final, keep_last)
        self.barrier()
        return final

    def load_checkpoint(self, path: str | Path, learner: nn.Module, replica: nn.Module,
                        optimizer: torch.optim.Optimizer) -> tuple[CheckpointMeta, dict[str, Any]]:
        """Load checkpoint folder `path` into the replica, the learner's shards and the optimizer;
        returns (meta, trainer_state). Every rank calls it. A checkpoint of a different number of
        ranks loads too (torch.distributed.checkpoint reshards the optimizer state)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        path = Path(path)
        meta, state = load_checkpoint(path)
        if not meta.sharded:
            raise ValueError(f"checkpoint {path} was written by one process (its optimizer state is not sharded); "
                             "resume it without torchrun / --nproc")
        load_full_weights(replica, path / "model")
        full = {f"model.{k}": p.detach() for k, p in replica.named_parameters()}
        set_model_state_dict(learner, full, options=StateDictOptions(full_state_dict=True, strict=False))
        optim_state = get_optimizer_state_dict(learner, optimizer)
        dcp.load({"optimizer": optim_state}, checkpoint_id=str(path / "optimizer"))
        set_optimizer_state_dict(learner, optimizer, optim_state)
        own = path / f"rng_rank{self.rank}.pt"
        state["rng"] = torch.load(own, weights_only=False) if own.is_file() else state.get("rng")
        return meta, state

    def _broadcast(self, obj: T) -> T:
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

