"""Write what the trainer computed back onto the trajectories it logs: each model segment's
trainer logprobs (under the weights before the update, the same numbers the importance ratio and
`mismatch/*` use) and each trajectory's advantage. The studio's trajectory viewer shows them next
to the sampler's logprobs."""

from __future__ import annotations

from typing import Sequence

import torch

from rlfactory.trajectory import Trajectory


def annotate_trajectories(trajs: Sequence[Trajectory], logp: torch.Tensor, advantages: torch.Tensor) -> None:
    """Set `Segment.trainer_logprobs` on the model segments and `Trajectory.advantage`.

    `trajs` are the rows of the train batch in order; `logp` [B, Lc] is the trainer's logprob of
    completion token j of row b (batch.py's column convention); `advantages` is [B] or [B, Lc]
    (gae: the trajectory's advantage is the mean over its model tokens).
    """
    logp = logp.detach().float().cpu()
    adv = advantages.detach().float().cpu()
    for b, t in enumerate(trajs):
        start = max(t.prompt_len, 1)  # collate's prompt: a trajectory without one uses its first token
        col = -start
        mask_cols: list[int] = []
        for seg in t.segments:
            n = len(seg.token_ids)
            if seg.role == "model":
                cols = range(col, col + n)
                # None only for a first token that served as the prompt (it is never predicted)
                seg.trainer_logprobs = [float(logp[b, c]) if 0 <= c < logp.shape[1] else None for c in cols]  # type: ignore[misc]
                mask_cols += [c for c in cols if 0 <= c < logp.shape[1]]
            col += n
        if adv.dim() == 1:
            t.advantage = float(adv[b])
        else:
            t.advantage = float(adv[b, mask_cols].mean()) if mask_cols else 0.0
