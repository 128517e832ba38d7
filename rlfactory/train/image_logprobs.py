"""The training model's logprobs for trajectories with images (vision-language policies, issue 31).

A trajectory's images (its segments' `images`, in order) are turned back into the model's pixel
inputs by the ToolManager's image processor (deterministic: the same bytes give the same pixels),
so the trainer sees the pixels the rollout showed. Positions are the model's own multimodal rotary
positions (Qwen2-VL's 3-D M-RoPE, from its `get_rope_index` over the whole sequence), which is
what makes a forward of the whole trajectory equal the same computed turn by turn with a KV cache
(`incremental_logits`, the generator's way: each turn's images go in with that turn).

These functions run one trajectory at a time: the reference that the trainer's batched forward
(rlfactory/train/logprobs.py with batch_images.py: shared prompts, padding, micro-batches) is
tested against.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache

from rlfactory.generation.kv_cache import cache_kwarg, returned_cache
from rlfactory.generation.vision import image_starts
from rlfactory.trajectory import Trajectory


def _vl_model(model: Any) -> Any:
    """The `...ForConditionalGeneration` under a peft wrapper, if any."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def rope_positions(model: Any, inputs: dict[str, Any]) -> torch.Tensor:
    """[3, 1, L] M-RoPE positions of the whole sequence, as the model computes them."""
    positions, _ = _vl_model(model).model.get_rope_index(
        inputs["input_ids"], inputs["mm_token_type_ids"], image_grid_thw=inputs.get("image_grid_thw"))
    return positions


def trajectory_logprobs(model: Any, tool_manager: Any, traj: Trajectory, temperature: float = 1.0) -> torch.Tensor:
    """[number of model tokens] the logprob under `model` of each model-sampled token of `traj`
    (loss_mask 1), its images included; logits divided by the sampling `temperature`."""
    ids = traj.input_ids
    inputs = tool_manager.model_inputs(ids, traj.images())
    logits = model(**inputs, position_ids=rope_positions(model, inputs)).logits[0, :-1].float() / temperature
    targets = inputs["input_ids"][0, 1:]
    lp = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None])[:, 0]
    mask = torch.tensor(traj.loss_mask[1:], dtype=torch.bool)
    return lp[mask]


def incremental_logits(model: Any, inputs: dict[str, Any], cuts: Sequence[int], merge_size: int) -> torch.Tensor:
    """[L, V] logits of the sequence in `inputs` (ToolManager.model_inputs) computed chunk by chunk
    with a KV cache, split at positions `cuts` (turn boundaries): each chunk gets its own images'
    pixels and its slice of the whole sequence's M-RoPE positions. A cut inside an image's pads
    is a ValueError (an image is encoded whole, in one turn)."""
    ids = inputs["input_ids"]
    positions = rope_positions(model, inputs)
    grids = inputs.get("image_grid_thw")
    pixels = inputs.get("pixel_values")
    is_pad = inputs["mm_token_type_ids"][0].bool()
    # Where each image's pads start, and where its rows of pixel_values start.
    counts = [int(g.prod()) // merge_size ** 2 for g in grids] if grids is not None else []
    starts = image_starts(is_pad, counts)
    rows = [0]
    for g in grids if grids is not None else []:
        rows.append(rows[-1] + int(g.prod()))
    inside = [c for c in cuts for k, s in enumerate(starts) if s < c < s + counts[k]]
    if inside:
        raise ValueError(f"the cut at {inside[0]} falls inside an image's pads")
    cache = DynamicCache(config=_vl_model(model).config)
    out = []
    bounds = [0, *cuts, ids.shape[1]]
    for a, b in zip(bounds, bounds[1:]):
        mine = [k for k, s in enumerate(starts) if a <= s < b]
        kwargs: dict[str, Any] = {}
        if mine:
            kwargs = {"pixel_values": pixels[rows[mine[0]]: rows[mine[-1] + 1]],
                      "image_grid_thw": grids[mine[0]: mine[-1] + 1]}
        result = model(input_ids=ids[:, a:b], position_ids=positions[:, :, a:b], use_cache=True,
                       mm_token_type_ids=inputs["mm_token_type_ids"][:, a:b], **cache_kwarg(model, cache), **kwargs)
        cache = returned_cache(result)
        out.append(result.logits[0])
    return torch.cat(out)
