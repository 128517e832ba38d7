"""Forward passes of the training model: per-token logprobs and entropies (and hidden states for
the critic), computed only where they are needed.

Two savings over a plain forward of every trajectory:
- shared prompts: each distinct prompt runs once; its completions attend to its keys/values
  (gradients flow back through them), so a group of G trajectories pays for its prompt once;
- the LM head and softmax run only at loss positions (model-sampled tokens), never at prompt,
  observation or padding positions.
`share_prefix=False` runs every trajectory in full instead (needed with gradient checkpointing,
which drops the key/value cache); both give the same numbers up to float rounding.

A batch with images (TrainBatch.images, a vision-language model) runs the same passes through the
multimodal model: each pass gets its rows' pixels and the model's own M-RoPE positions of the
whole rows (batch_images.py), so rows with and without images share a batch.

Logits are divided by the sampling temperature before the softmax, so the training model's
logprobs are comparable with the sampler's (see rlfactory/generation/sampling.py).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache

from rlfactory.algos.utils import entropy_from_logits, token_logprobs
from rlfactory.generation.attention_masks import mask_plan
from rlfactory.generation.kv_cache import cache_kwarg, returned_cache
from rlfactory.train.batch import TrainBatch, filler_batch, micro_batches
from rlfactory.train.batch_images import joined, mrope_positions, multimodal_body, pixel_kwargs
from rlfactory.train.packed import packable, packed_hidden
from rlfactory.train.fused_head import fused_head_logprobs, linear_head
from rlfactory.train.kernels import PLAIN, TrainKernels, compiled, training_pass


def autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    """bfloat16 autocast on `device` when enabled (CPU included), else a no-op."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def decoder_and_head(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(the transformer body, the LM head) of a causal LM, or of a peft model's base. The body of a
    vision-language model is its multimodal model (vision tower + text model), which takes pixels."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return multimodal_body(base) or base.get_decoder(), base.get_output_embeddings()


def predictive_hidden(decoder: nn.Module, batch: TrainBatch, share_prefix: bool = True,
                      packed: bool = False) -> torch.Tensor:
    """Last-layer hidden state that predicts each completion token: [B, Lc, H].

    Row b, column j is the state after the prompt and completion tokens 0..j-1 of trajectory b.
    `packed`: one pass over the rows packed without padding (rlfactory/train/packed.py) where the
    model allows it (not sliding-window or vision-language models: those keep this padded path).
    """
    if packed and packable(decoder) is None:
        return packed_hidden(decoder, batch)
    pm, cm, idx = batch.prompt_mask, batch.completion_mask, batch.prompt_index
    plen = pm.sum(-1)  # [P]
    lc = batch.completion_ids.shape[1]
    # sliding-window layers: masks by position (padding splits the columns)
    plan = mask_plan(getattr(decoder, "language_model", decoder))
    images = batch.images
    if images is not None and not hasattr(decoder, "get_rope_index"):
        raise ValueError(f"a batch with images needs a vision-language model; {type(decoder).__name__} takes no pixels")

    def attention(mask: torch.Tensor, key_pos: torch.Tensor, query_pos: torch.Tensor) -> Any:
        if plan is None:
            return mask
        cols = mask.shape[1] - query_pos.shape[1] + torch.arange(query_pos.shape[1], device=mask.device)
        return plan.build(key_pos, mask.bool(), query_pos, query_col=cols)

    if not share_prefix:
        ids = torch.cat([batch.prompt_ids[idx], batch.completion_ids], 1)
        mask = torch.cat([pm[idx], cm], 1)
        # positions count real tokens only, so a padded prompt continues at its own length
        pos = torch.cat([(pm.cumsum(-1) - 1).clamp(min=0)[idx], plen[idx, None] + torch.arange(lc, device=cm.device)], 1)
        positions, pixels = pos, {}
        if images is not None:  # each row's prompt images, then its own
            rows = [joined(images.prompts[p], images.completions[b]) for b, p in enumerate(idx.tolist())]
            positions, pixels = mrope_positions(decoder, ids, mask, rows), pixel_kwargs(rows)
        h = decoder(input_ids=ids, attention_mask=attention(mask, pos, pos), position_ids=positions,
                    use_cache=False, **pixels).last_hidden_state
        start = plen[idx] - 1  # the state after the last prompt token predicts completion token 0
        cols = torch.cat([start[:, None], pm.shape[1] + torch.arange(lc - 1, device=cm.device).expand(len(idx), -1)], 1)
        return h.gather(1, cols.unsqueeze(-1).expand(-1, -1, h.shape[-1]))
    pos_p = (pm.cumsum(-1) - 1).clamp(min=0)
    positions, pixels = pos_p, {}
    if images is not None:
        positions, pixels = mrope_positions(decoder, batch.prompt_ids, pm, images.prompts), pixel_kwargs(images.prompts)
    # A config-less cache keeps every column (a model's own cache drops keys that slid out of a window).
    out = decoder(input_ids=batch.prompt_ids, attention_mask=attention(pm, pos_p, pos_p), position_ids=positions,
                  **cache_kwarg(decoder, DynamicCache()), use_cache=True, **pixels)
    cache = DynamicCache()
    for layer, entry in enumerate(returned_cache(out).layers):
        cache.update(entry.keys.index_select(0, idx), entry.values.index_select(0, idx), layer)
    last = out.last_hidden_state[torch.arange(len(plen), device=pm.device), plen - 1][idx]  # [B, H]
    if lc == 1:
        return last.unsqueeze(1)
    # The last completion column predicts nothing; with images it runs anyway, so that no image
    # is cut off from its pads (the pass's pixels fill every pad of its columns).
    n = lc if images is not None else lc - 1
    pos_c = plen[idx, None] + torch.arange(n, device=cm.device)
    mask_c = torch.cat([pm[idx], cm[:, :n]], 1)
    positions, pixels = pos_c, {}
    if images is not None:  # the whole rows' positions (prompt, then completion), cut after the prompts
        rows = [joined(images.prompts[p], images.completions[b]) for b, p in enumerate(idx.tolist())]
        full = torch.cat([batch.prompt_ids[idx], batch.completion_ids], 1)
        positions = mrope_positions(decoder, full, mask_c, rows)[:, :, pm.shape[1]:]
        pixels = pixel_kwargs(images.completions)
    hc = decoder(
        input_ids=batch.completion_ids[:, :n], attention_mask=attention(mask_c, torch.cat([pos_p[idx], pos_c], 1), pos_c),
        position_ids=positions, **cache_kwarg(decoder, cache), use_cache=True, **pixels,
    ).last_hidden_state
    return torch.cat([last.unsqueeze(1), hc[:, : lc - 1]], 1)


def policy_forward(
    model: nn.Module,
    batch: TrainBatch,
    *,
    temperature: float = 1.0,
    bf16: bool = False,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    share_prefix: bool = True,
    kernels: TrainKernels = PLAIN,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each completion token under `model` (and the entropy there).

    Returns (logp [B, Lc] float32, entropy [B, Lc] float32 or None), both 0 where loss_mask is 0
    (not computed there). Gradients flow to logp when enabled, and to the entropy only with
    `entropy_grad` (otherwise it is a detached metric). `kernels` (rlfactory/train/kernels.py):
    the fused head, Liger's kernels (applied to `model` beforehand), the compiled decoder.
    """
    if isinstance(model, PolicyModule):  # its forward runs this function (so FSDP2's hooks see the pass)
        return model(batch, temperature=temperature, bf16=bf16, with_entropy=with_entropy,
                     entropy_grad=entropy_grad, share_prefix=share_prefix, kernels=kernels)
    decoder, head = decoder_and_head(model)
    sel = batch.loss_mask > 0
    # Inside PolicyModule's forward the FSDP2 root has gathered the head's weight (a plain tensor).
    fused = linear_head(head) if kernels.fused_head else None
    with autocast(batch.completion_ids.device, bf16), training_pass(kernels.liger):
        h = predictive_hidden(compiled(decoder) if kernels.compile else decoder, batch, share_prefix,
                              kernels.packed)
        if fused is not None:
            lp, e = fused_head_logprobs(h[sel], *fused, batch.targets[sel], temperature=temperature,
                                        chunk_tokens=kernels.head_chunk_tokens, with_entropy=with_entropy,
                                        entropy_grad=entropy_grad)
        else:
            logits = head(h[sel])  # [N, V]
    if fused is not None:
        zeros = torch.zeros(sel.shape, dtype=torch.float32, device=sel.device)
        return zeros.masked_scatter(sel, lp), (zeros.masked_scatter(sel, e) if e is not None else None)
    if temperature != 1.0:
        logits = logits.float() / temperature
    # else: bf16 logits stay bf16 ([N, V] is the largest tensor of the step: 10 GB in float32 for
    # 16k tokens x 152k vocabulary); token_logprobs and entropy_from_logits upcast them chunk by
    # chunk, which gives the same float32 values as upcasting the whole tensor first.
    zeros = torch.zeros(sel.shape, dtype=torch.float32, device=sel.device)
    logp = zeros.masked_scatter(sel, token_logprobs(logits.unsqueeze(0), batch.targets[sel].unsqueeze(0))[0])
    ent = None
    if with_entropy:
        e = entropy_from_logits((logits if entropy_grad else logits.detach()).unsqueeze(0))[0]
        ent = zeros.masked_scatter(sel, e)
    return logp, ent


class PolicyModule(nn.Module):
    """A causal LM whose `forward(batch, **options)` is `policy_forward` of it.

    The FSDP2 learner shards this wrapper: its root all-gathers the parameters outside the decoder
    layers (embeddings, final norm, LM head) when `forward` runs, which calling the decoder and
    the head separately would skip. `policy_forward(PolicyModule(m), ...)` equals `policy_forward(m, ...)`.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: TrainBatch, **options: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        lc = batch.completion_ids.shape[1]
        if not (options.get("share_prefix", True) and lc < 2):
            return policy_forward(self.model, batch, **options)
        # One completion column runs the decoder once, more run it twice (prompt, then
        # completions): a padding column makes every pass run it twice, so the ranks of the
        # FSDP learner all-gather the same layers the same number of times.
        logp, ent = policy_forward(self.model, _with_padding_column(batch), **options)
        return logp[:, :lc].clone(), (ent[:, :lc].clone() if ent is not None else None)


def _with_padding_column(batch: TrainBatch) -> TrainBatch:
    """`batch` with one more completion column of padding (mask 0, loss mask 0)."""
    def widen(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, torch.zeros_like(x[:, :1])], 1)

    return TrainBatch(batch.prompt_ids, batch.prompt_mask, batch.prompt_index, widen(batch.completion_ids),
                      widen(batch.completion_mask), widen(batch.loss_mask), widen(batch.sampler_logprobs), batch.images)


@torch.no_grad()
def batched_logprobs(
    model: nn.Module,
    batch: TrainBatch,
    micro_batch_size: int | None,
    *,
    temperature: float = 1.0,
    bf16: bool = False,
    share_prefix: bool = True,
    passes: int = 0,
    chunks: list[torch.Tensor] | None = None,
    kernels: TrainKernels = PLAIN,
) -> torch.Tensor:
    """`policy_forward` logprobs for the whole batch without gradients, in micro-batches: [B, Lc].

    `chunks`: the rows of each pass (the update's passes, RowLayout.micro_batches); default
    consecutive chunks of `micro_batch_size`. `passes`: run at least this many forward passes,
    padding with passes over a one-token filler batch whose output is dropped (the FSDP learner:
    every rank must run as many passes as the rank with the most, since each pass all-gathers the
    parameters).
    """
    out = torch.zeros(batch.loss_mask.shape, dtype=torch.float32, device=batch.completion_ids.device)
    if chunks is None:
        chunks = micro_batches(torch.arange(len(batch), device=out.device), micro_batch_size) if len(batch) else []
    for idx in chunks:
        mb = batch.select(idx)
        logp, _ = policy_forward(model, mb, temperature=temperature, bf16=bf16, share_prefix=share_prefix,
                                 kernels=kernels)
        out[idx, : logp.shape[1]] = logp
    for _ in range(passes - len(chunks)):
        policy_forward(model, filler_batch(out.device), temperature=temperature, bf16=bf16, share_prefix=share_prefix,
                       kernels=kernels)
    return out
