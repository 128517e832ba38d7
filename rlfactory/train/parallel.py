"""What the trainer asks of the processes it runs in: one (`SingleProcess`, the default) or the
ranks of the FSDP2 learner under torchrun (rlfactory.distributed.fsdp.FsdpLearner).

The trainer's step reads the same for both. Each rank rolls out its share of the step's prompts
(whole groups), `gather` hands every rank all trajectories of the step in the single-process
order, so advantages and metrics are computed over the whole batch exactly as in one process,
and each rank then trains on its own rows: `RowLayout` says where each row of the update lives,
so that every rank forms the same minibatches and divides by the same global token counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, TypeVar

import torch
from torch import nn

from rlfactory.passes import plan_micro_batches
from rlfactory.train.batch import TrainBatch, micro_batches

T = TypeVar("T")


class Parallel(Protocol):
    rank: int
    world_size: int
    sharded: bool
    """True for the FSDP learner: the trainer then saves and loads checkpoints through
    `save_checkpoint(run_dir, meta, learner, replica, tokenizer, optimizer, trainer_state, keep_last)`
    and `load_checkpoint(path, learner, replica, optimizer) -> (meta, trainer_state)`."""

    @property
    def is_main(self) -> bool:
        """Whether this process writes logs and the checkpoint's main files (rank 0)."""
        ...

    def share(self, items: Sequence[T]) -> list[T]:
        """This rank's contiguous share of `items` (a step's prompts)."""
        ...

    def gather(self, items: list[T]) -> list[T]:
        """Every rank's `items`, concatenated in rank order (on every rank). This rank's own items
        are the objects it passed in, not copies."""
        ...

    def wrap_policy(self, model: nn.Module) -> nn.Module:
        """The module the optimizer trains: `model` itself, or a sharded copy of it."""
        ...

    def wrap_frozen(self, model: nn.Module) -> nn.Module:
        """A frozen module (the KL reference) as the learner holds it: itself, or a sharded copy."""
        ...

    def sync_replica(self, learner: nn.Module, replica: nn.Module) -> None:
        """Make `replica` (the rollout model) hold the learner's weights after an update."""
        ...

    def barrier(self) -> None:
        ...


class SingleProcess:
    """One process: every share is everything, nothing is copied or sharded."""

    rank = 0
    world_size = 1
    is_main = True
    sharded = False

    def share(self, items: Sequence[T]) -> list[T]:
        return list(items)

    def gather(self, items: list[T]) -> list[T]:
        return items

    def wrap_policy(self, model: nn.Module) -> nn.Module:
        return model

    def wrap_frozen(self, model: nn.Module) -> nn.Module:
        return model

    def sync_replica(self, learner: nn.Module, replica: nn.Module) -> None:
        return None

    def barrier(self) -> None:
        return None


@dataclass
class RowLayout:
    """The rows of one update across ranks, in global (single-process) order.

    Rank r trains on the rows it owns; row n of the global order is row `local_index[n]` of its
    owner's batch (each rank's rows keep their global order).
    """

    owner: torch.Tensor
    """[N] long: the rank holding row n."""
    tokens: torch.Tensor
    """[N] float: loss tokens of row n (the global normaliser of token-mean losses)."""
    rank: int = 0
    world_size: int = 1
    shape: torch.Tensor | None = None
    """[N, 3] long: row n's completion length, prompt length and prompt key (equal for rows of one
    prompt), for passes of rows of similar length (`micro_batches`); None = consecutive passes."""

    def __post_init__(self) -> None:
        self.local_index = torch.zeros_like(self.owner)
        for r in range(self.world_size):
            mine = self.owner == r
            self.local_index[mine] = torch.arange(int(mine.sum()))

    @classmethod
    def single(cls, batch: TrainBatch) -> "RowLayout":
        """Every row of `batch` on rank 0 (one process), with its shape."""
        shape = torch.stack([batch.completion_mask.sum(-1), batch.prompt_lengths(), batch.prompt_index], 1).cpu()
        return cls(torch.zeros(len(batch), dtype=torch.long), batch.loss_mask.sum(-1).float().cpu(), shape=shape)

    def __len__(self) -> int:
        return int(self.owner.shape[0])

    def _mine(self, positions: torch.Tensor, rank: int | None) -> torch.Tensor:
        """The global rows among `positions` that `rank` (default this one) holds, in order."""
        positions = positions.cpu()
        return positions[self.owner[positions] == (self.rank if rank is None else rank)]

    def rows_of(self, positions: torch.Tensor, rank: int | None = None) -> torch.Tensor:
        """Local row indices (on `rank`, default this one) of global rows `positions`, in order."""
        return self.local_index[self._mine(positions, rank)]

    def micro_batches(self, positions: torch.Tensor, size: int | None, max_tokens: int | None = None,
                      by_length: bool = False, rank: int | None = None, packed: bool = False) -> list[torch.Tensor]:
        """The forward/backward passes of `rank` (default this one) over global rows `positions`:
        its local row indices, each pass non-empty. `by_length` (with `shape`): passes of rows of
        similar length (rlfactory/passes.py `plan_micro_batches`; `packed`: passes packed without
        padding, `max_tokens` counting real tokens); else consecutive chunks of `size`."""
        mine = self._mine(positions, rank)
        local = self.local_index[mine]
        if not len(local):
            return []
        if not by_length or self.shape is None:
            return [c for c in micro_batches(local, size) if len(c)]
        lc, lp, key = self.shape[mine].T.tolist()
        plan = plan_micro_batches(lc, lp, key, size, max_tokens, packed=packed)
        return [local[torch.tensor(p, dtype=torch.long)] for p in plan]

    def passes(self, positions: torch.Tensor, micro_batch_size: int | None, max_tokens: int | None = None,
               by_length: bool = False, packed: bool = False) -> int:
        """Micro-batch passes the busiest rank makes over global rows `positions`."""
        return max(len(self.micro_batches(positions, micro_batch_size, max_tokens, by_length, r, packed))
                   for r in range(self.world_size))


def reduce_weighted(parts: list[tuple[dict[str, float], dict[str, float]]]) -> dict[str, float]:
    """Weighted means of per-rank (sums, weights) metric dicts: sum of sums / sum of weights."""
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for s, w in parts:
        for k, v in s.items():
            sums[k] = sums.get(k, 0.0) + v
            weights[k] = weights.get(k, 0.0) + w[k]
    return {k: sums[k] / max(weights[k], 1e-12) for k in sums}

