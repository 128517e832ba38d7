"""Token logprobs and entropies straight from hidden states and the LM head's weight, a chunk of
rows at a time, never holding the [N, V] logits (`trainer.kernels.fused_head`).

The plain head (rlfactory/train/logprobs.py) computes `head(h)` for all N loss positions at once:
with a 152k vocabulary that [N, V] tensor (and its gradient, and with temperature != 1 its
float32 copy) is the largest of the update. Here each chunk of `chunk_tokens` rows computes its
logits, their logsumexp, the target's logprob and the entropy, and drops them; the forward keeps
only the hidden rows, the weight (both already alive) and per row the logsumexp and entropy. The
backward recomputes each chunk's logits and turns d(logp) and d(entropy) into the chunk's
d(logits) in place, then into the gradients of the hidden rows, the weight and the bias. Values
equal the plain head's: the same float32 ops per row (logits.float() / temperature, logsumexp,
softmax); only the matmul's blocking differs.

Gradients, with p = softmax(z), H = lse - sum(p z) (z: the logits divided by the temperature):
    d logp / dz = onehot(target) - p
    d H / dz    = -p (z - (lse - H))          (lse - H = E_p[z])
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def linear_head(head: nn.Module) -> tuple[Tensor, Tensor | None] | None:
    """(weight [V, H], bias [V] or None) of a plain `nn.Linear` LM head, or None where the fused head
    cannot stand in for `head(h)`: a wrapped head (peft's LoRA `lora.Linear`, `ModulesToSaveWrapper`),
    a head with forward hooks or a forward of its own (accelerate's offloading hooks replace the
    instance's forward), or a sharded (DTensor) weight outside its module's forward."""
    if type(head) is not nn.Linear or head._forward_hooks or head._forward_pre_hooks or "forward" in head.__dict__:
        return None
    from torch.distributed.tensor import DTensor

    if isinstance(head.weight, DTensor):
        return None
    return head.weight, head.bias


def compute_dtype(device: torch.device, weight: Tensor) -> torch.dtype:
    """The dtype `nn.Linear` would compute in here: autocast's (bf16) when autocast is on for
    `device`, else the weight's own."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return weight.dtype


class _FusedHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,  # type: ignore[override]
                temperature: float, chunk: int, dtype: torch.dtype, with_entropy: bool,
                entropy_grad: bool) -> tuple[Tensor, Tensor]:
        n, acc = hidden.shape[0], torch.promote_types(dtype, torch.float32)
        w, b = weight.to(dtype), (bias.to(dtype) if bias is not None else None)
        logp = torch.empty(n, dtype=acc, device=hidden.device)
        lse = torch.empty(n, dtype=acc, device=hidden.device)
        ent = torch.empty(n if with_entropy else 0, dtype=acc, device=hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, n, chunk):
                z = _logits(hidden[s : s + chunk].to(dtype), w, b, acc, temperature)
                lse[s : s + chunk] = torch.logsumexp(z, dim=-1)
                logp[s : s + chunk] = z.gather(-1, targets[s : s + chunk, None]).squeeze(-1) - lse[s : s + chunk]
                if with_entropy:  # as entropy_from_logits: lse - sum(softmax(z) * z)
                    probs = torch.softmax(z, dim=-1)
                    ent[s : s + chunk] = lse[s : s + chunk] - probs.mul_(z).sum(dim=-1)
        keep_ent = with_entropy and entropy_grad
        ctx.save_for_backward(hidden, weight, bias, targets, lse, ent if keep_ent else None)
        ctx.options = (temperature, chunk, dtype, keep_ent)
        if not keep_ent:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp: Tensor, grad_ent: Tensor | None):  # type: ignore[override]
        hidden, weight, bias, targets, lse, ent = ctx.saved_tensors
        temperature, chunk, dtype, keep_ent = ctx.options
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[2]
        acc = lse.dtype
        w, b = weight.to(dtype), (bias.to(dtype) if bias is not None else None)
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.promote_types(weight.dtype, torch.float32),
                             device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, hidden.shape[0], chunk):
                h = hidden[s : s + chunk].to(dtype)
                z = _logits(h, w, b, acc, temperature)
                g = grad_logp[s : s + chunk].to(acc)[:, None]
                if keep_ent and grad_ent is not None:
                    probs = torch.exp(z - lse[s : s + chunk, None])
                    ge = grad_ent[s : s + chunk].to(acc)[:, None]
                    mean_z = (lse[s : s + chunk] - ent[s : s + chunk])[:, None]
                    dz = z.sub_(mean_z).mul_(-ge).sub_(g).mul_(probs)  # -g p - ge p (z - E[z]), in z's memory
                    del probs
                else:
                    dz = z.sub_(lse[s : s + chunk, None]).exp_().mul_(-g)  # -g p, in z's memory
                dz.scatter_add_(-1, targets[s : s + chunk, None], g)
                if temperature != 1.0:
                    dz.div_(temperature)
                if need_b:
                    grad_b += dz.sum(0)
                dz = dz.to(dtype)
                if need_h:
                    grad_h[s : s + chunk] = (dz @ w).to(hidden.dtype)
                if need_w:
                    grad_w += dz.t() @ h
        return (grad_h, grad_w.to(weight.dtype) if need_w else None, grad_b.to(bias.dtype) if need_b else None,
                None, None, None, None, None, None)


def _logits(h: Tensor, w: Tensor, b: Tensor | None, acc: torch.dtype, temperature: float) -> Tensor:
    """One chunk's logits in `acc` (float32), divided by the temperature, as the plain head's
    `head(h).float() / temperature`."""
    z = torch.nn.functional.linear(h, w, b).to(acc)
    return z.div_(temperature) if temperature != 1.0 else z


def fused_head_logprobs(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 4096,
    with_entropy: bool = False,
    entropy_grad: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """log p(target) and (with_entropy) the entropy at each of N rows, from `hidden` [N, H], the
    LM head's `weight` [V, H] (and `bias` [V]), `targets` [N] long: ([N] float32, [N] float32 or
    None). Equal to `token_logprobs(head(hidden) / temperature)` and `entropy_from_logits(...)`;
    computed in autocast's dtype where autocast is on (as `head(hidden)` would be). Gradients flow
    to hidden, weight and bias through logp, and through the entropy only with `entropy_grad`."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    dtype = compute_dtype(hidden.device, weight)
    logp, ent = _FusedHead.apply(hidden, weight, bias, targets.long(), float(temperature), int(chunk_tokens),
                                 dtype, with_entropy, entropy_grad)
    return logp, (ent if with_entropy else None)
