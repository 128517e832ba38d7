"""Trajectories -> padded training tensors, with each distinct prompt stored once.

A GRPO step rolls every prompt out `group_size` times, so the trainer keeps the distinct prompts
([P, Lp]) apart from the completions ([B, Lc]: every token after the prompt, model and
observation alike) and `prompt_index` [B] says which prompt row b continues. The forward pass
(logprobs.py) then runs each prompt once and lets its completions attend to the shared keys
and values.

Position convention: column j of every per-token tensor ([B, Lc]) is about completion token j,
predicted from everything before it. The loss mask is 1 exactly where that token was sampled by
the model (`Trajectory.loss_mask`); observation and padding tokens are 0 and never reach the loss.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

import torch

from rlfactory.images import Image
from rlfactory.train.batch_images import BatchImages, PixelSource, row_pixels
from rlfactory.trajectory import Trajectory


@dataclass
class TrainBatch:
    prompt_ids: torch.Tensor
    """[P, Lp] long: the distinct prompts, right-padded."""
    prompt_mask: torch.Tensor
    """[P, Lp] long: 1 on real prompt tokens."""
    prompt_index: torch.Tensor
    """[B] long: the prompt row that trajectory b continues."""
    completion_ids: torch.Tensor
    """[B, Lc] long: the tokens after the prompt, right-padded."""
    completion_mask: torch.Tensor
    """[B, Lc] long: 1 on real completion tokens."""
    loss_mask: torch.Tensor
    """[B, Lc] float: 1 where completion token j was sampled by the model."""
    sampler_logprobs: torch.Tensor
    """[B, Lc] float: the sampler's logprob of completion token j (0 where loss_mask is 0)."""
    images: BatchImages | None = None
    """The pixels of each prompt and completion row (None: no row has images)."""

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def targets(self) -> torch.Tensor:
        """[B, Lc] long: the token each column is about."""
        return self.completion_ids

    def prompt_lengths(self) -> torch.Tensor:
        """[B] long: each trajectory's prompt length."""
        return self.prompt_mask.sum(-1)[self.prompt_index]

    def num_tokens(self) -> int:
        """Tokens of the trajectories (each counted with its full prompt)."""
        return int(self.prompt_lengths().sum() + self.completion_mask.sum())

    def select(self, idx: torch.Tensor | Sequence[int]) -> "TrainBatch":
        """Rows `idx` with only the prompts they use, and padding that all of them share cut off."""
        idx = torch.as_tensor(idx, dtype=torch.long, device=self.completion_ids.device)
        used, remap = torch.unique(self.prompt_index[idx], return_inverse=True)
        pm = self.prompt_mask[used]
        cm = self.completion_mask[idx]
        lp = max(int(pm.sum(-1).max()), 1) if len(used) else 1
        lc = max(int(cm.sum(-1).max()), 1) if len(idx) else 1
        return TrainBatch(
            prompt_ids=self.prompt_ids[used, :lp],
            prompt_mask=pm[:, :lp],
            prompt_index=remap.reshape(-1),
            completion_ids=self.completion_ids[idx, :lc],
            completion_mask=cm[:, :lc],
            loss_mask=self.loss_mask[idx, :lc],
            sampler_logprobs=self.sampler_logprobs[idx, :lc],
            images=self.images.select(used, idx) if self.images is not None else None,
        )

    def to(self, device: torch.device | str) -> "TrainBatch":
        return TrainBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)
                             if getattr(self, f.name) is not None})


def collate(trajectories: Sequence[Trajectory], pad_id: int, pixels: PixelSource | None = None) -> TrainBatch:
    """Pad `trajectories` into one TrainBatch (rows in the given order).

    Trajectories whose prompt token ids (and prompt images) are equal share one prompt row. A
    trajectory without a prompt segment uses its first token as the prompt (the first token is
    never predicted). Model tokens without sampler logprobs get 0.0 there. Images become pixels
    through `pixels` (the VL ToolManager; a ValueError if a trajectory has images and it is None).
    """
    if not trajectories:
        raise ValueError("collate needs at least one trajectory")
    prompts: dict[tuple[tuple[int, ...], tuple[str, ...]], int] = {}
    index, comps, masks, lps = [], [], [], []
    prompt_images: dict[int, list[Image]] = {}  # prompt row -> its images
    completion_images: list[list[Image]] = []  # the images after each trajectory's prompt
    for t in trajectories:
        ids, mask = t.input_ids, t.loss_mask
        p = max(t.prompt_len, 1) if ids else 0
        first = (t.segments[0].images or []) if t.prompt_len else []
        key = (tuple(ids[:p]) or (pad_id,), tuple(im.sha256 for im in first))
        index.append(prompts.setdefault(key, len(prompts)))
        prompt_images.setdefault(index[-1], first)
        completion_images.append([im for s in t.segments[1 if t.prompt_len else 0:] for im in s.images or ()])
        comps.append(ids[p:])
        masks.append(mask[p:])
        sampler = t.sampler_logprobs[p - t.prompt_len :] if t.prompt_len <= p else []
        lps.append(sampler[: len(ids) - p])
    lp_max = max(len(k) for k, _ in prompts)
    prompt_ids = torch.full((len(prompts), lp_max), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(prompts), lp_max), dtype=torch.long)
    for (key, _), row in prompts.items():
        prompt_ids[row, : len(key)] = torch.tensor(key, dtype=torch.long)
        prompt_mask[row, : len(key)] = 1
    b, lc = len(trajectories), max(1, max(len(c) for c in comps))
    completion_ids = torch.full((b, lc), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((b, lc), dtype=torch.long)
    loss_mask = torch.zeros((b, lc), dtype=torch.float32)
    sampler = torch.zeros((b, lc), dtype=torch.float32)
    for i, (c, m, s) in enumerate(zip(comps, masks, lps)):
        n = len(c)
        if n:
            completion_ids[i, :n] = torch.tensor(c, dtype=torch.long)
            completion_mask[i, :n] = 1
            loss_mask[i, :n] = torch.tensor(m, dtype=torch.float32)
        if s:
            sampler[i, : len(s)] = torch.tensor(s, dtype=torch.float32)
    images = None
    if any(prompt_images.values()) or any(completion_images):
        images = BatchImages([row_pixels(prompt_images[r], pixels) for r in range(len(prompts))],
                             [row_pixels(c, pixels) for c in completion_images])
    return TrainBatch(prompt_ids, prompt_mask, torch.tensor(index, dtype=torch.long), completion_ids,
                      completion_mask, loss_mask, sampler * loss_mask, images)


def row_shape(t: Trajectory) -> tuple[int, int, int]:
    """(completion length, prompt length, prompt key) of `t` as `collate` lays it out; trajectories
    of one prompt share the key (the same in every process)."""
    p = max(t.prompt_len, 1) if t.input_ids else 0
    prompt = tuple(t.input_ids[:p])
    return len(t.input_ids) - p, max(len(prompt), 1), hash(prompt)


def loss_tokens(t: Trajectory) -> int:
    """Loss tokens of `t` as `collate` keeps them (a first token that serves as the prompt is never predicted)."""
    p = max(t.prompt_len, 1) if t.input_ids else 0
    return int(sum(t.loss_mask[p:]))


def empty_batch(device: torch.device | str = "cpu") -> TrainBatch:
    """A batch of no rows (a rank of the FSDP learner that trains on none of the step's rows)."""
    z = torch.zeros((0, 1), dtype=torch.long, device=device)
    return TrainBatch(z, z, torch.zeros(0, dtype=torch.long, device=device), z, z, z.float(), z.float())


def filler_batch(device: torch.device | str = "cpu") -> TrainBatch:
    """One row of one prompt token and one loss token (id 0), for passes that exist only to keep
    the FSDP learner's ranks in step (their loss is multiplied by 0)."""
    one = torch.ones((1, 1), dtype=torch.long, device=device)
    return TrainBatch(one * 0, one, torch.zeros(1, dtype=torch.long, device=device), one * 0, one, one.float(),
                      torch.zeros((1, 1), device=device))


def micro_batches(indices: torch.Tensor, size: int | None) -> list[torch.Tensor]:
    """Split a 1-D index tensor into consecutive chunks of at most `size` (None = one chunk)."""
    if size is None or size >= len(indices):
        return [indices]
    return list(torch.split(indices, size))
