"""The training forward's kernels (`trainer.kernels`): which ones a run uses (`resolve_kernels`,
at start-up), Liger Kernel's patches, and the compiled decoder.

Liger is applied to the policy's own module instances, and its kernels run only inside training
passes (`training_pass()`, entered by policy_forward): in one process the local generator
samples from the very same module objects (the policy is trained in place), and its decode,
recorded as CUDA graphs (rlfactory/generation/decode_graph.py), keeps running transformers' own
code, as before. liger's `apply_liger_kernel_to_<arch>(model=...)` binds Liger's forwards to the
model's RMSNorm and MLP instances and swaps module globals (the rotary function, the RMSNorm and
MLP classes, which would reach every later model of that architecture in the process); here the
class globals are put back, and each patched forward and the rotary function become switches
that call Liger's code in a training pass of this thread and the original everywhere else.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import MethodType
from typing import Any

import torch
from torch import nn

from rlfactory.config import ConfigError
from rlfactory.config.kernels import KernelsConfig

LIGER_ARCHITECTURES = ("qwen2", "qwen3", "llama", "mistral", "gemma", "gemma2", "mixtral", "qwen3_moe", "olmo2", "phi3")
"""model_type values whose text decoders Liger's RMSNorm / rotary / SwiGLU patches cover (liger-kernel 0.8.5)."""


@dataclass(frozen=True)
class TrainKernels:
    """What the training forward uses, resolved from `trainer.kernels` for this run's device and model."""

    fused_head: bool = False
    """Logprobs and entropies by rlfactory/train/fused_head.py (else the plain head)."""
    head_chunk_tokens: int = 4096
    """Rows per chunk of the fused head."""
    packed: bool = False
    """Pack the pass's sequences with document masks (rlfactory/train/packed.py)."""
    liger: bool = False
    """Liger's kernels were applied to the policy (they run inside `training_pass()`)."""
    compile: bool = False
    """Run the decoder body through torch.compile in training passes."""


PLAIN = TrainKernels()
"""Today's path: the plain head, padded passes, transformers' own modules, no compile."""


def resolve_kernels(cfg: KernelsConfig, model: nn.Module, decoder: nn.Module, head: nn.Module,
                    device: torch.device) -> TrainKernels:
    """The kernels a run on `device` uses for `model` (its transformer body `decoder` and LM head
    `head`: rlfactory/train/logprobs.py `decoder_and_head(model)`, after LoRA is applied); `auto` =
    on CUDA where possible. `liger: on` where Liger cannot run raises ConfigError with one line
    naming the key and the cause; the fused head falls back to the plain one where `head` is not
    a plain linear layer, and packing to padded passes where the model cannot pack (one line on
    stderr each, when they were asked for with `on` or could not be used on CUDA)."""
    from rlfactory.train.fused_head import linear_head
    from rlfactory.train.packed import use_packed

    cuda = device.type == "cuda"
    fused = cfg.fused_head == "on" or (cfg.fused_head == "auto" and cuda)
    if fused and linear_head(head) is None:
        print(f"trainer.kernels.fused_head: the LM head is a {type(head).__name__}, not a plain torch.nn.Linear "
              "(e.g. LoRA on lm_head); using the plain head", file=sys.stderr)
        fused = False
    liger = False
    if cfg.liger != "off":
        reason = liger_unavailable(model, device)
        if reason is not None and cfg.liger == "on":
            raise ConfigError(f"trainer.kernels.liger: on, but {reason}")
        liger = reason is None
    if liger and getattr(decoder, "gradient_checkpointing", False):
        # Liger runs only inside a training pass on the calling thread; gradient checkpointing
        # recomputes the layers in the backward, on autograd's own thread, where transformers'
        # code would run and not match the saved tensors (seen on an H200: CheckpointError).
        why = "gradient checkpointing recomputes the layers outside the training pass (autograd's thread)"
        if cfg.liger == "on":
            raise ConfigError(f"trainer.kernels.liger: on, but {why}")
        print(f"trainer.kernels.liger: off, since {why}", file=sys.stderr)
        liger = False
    return TrainKernels(fused_head=fused, head_chunk_tokens=cfg.head_chunk_tokens,
                        packed=use_packed(cfg.packed, decoder, device), liger=liger, compile=cfg.compile)


def liger_unavailable(model: nn.Module, device: torch.device) -> str | None:
    """Why Liger's kernels cannot run on `model` on `device` (one phrase), or None when they can."""
    if device.type != "cuda":
        return f"Liger's kernels need CUDA (the policy is on {device.type})"
    arch = getattr(getattr(model, "config", None), "model_type", None)
    if arch not in LIGER_ARCHITECTURES:
        return f"liger-kernel does not patch the architecture {arch!r} (it does: {', '.join(LIGER_ARCHITECTURES)})"
    try:
        importlib.import_module("liger_kernel.transformers")
    except ImportError as e:
        return f"liger-kernel does not import ({e}; `pip install 'rlfactory[gpu]'`)"
    return None


# ---- Liger, switched on per training pass ---------------------------------------------------------

_PASS = threading.local()


def in_training_pass() -> bool:
    """True inside `training_pass()` on this thread."""
    return getattr(_PASS, "on", False)


@contextlib.contextmanager
def training_pass(enabled: bool = True) -> Iterator[None]:
    """Liger's kernels (where applied) run for the forwards inside this block on this thread."""
    before = in_training_pass()
    _PASS.on = enabled or before
    try:
        yield
    finally:
        _PASS.on = before


def _switch(liger: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """A module-global function that calls `liger` in a training pass and `original` elsewhere."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return liger(*args, **kwargs) if in_training_pass() else original(*args, **kwargs)

    call.rlfactory_switch = (liger, original)  # type: ignore[attr-defined]
    return call


def _switched_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    # Bound to the module with its two forwards as bound methods, so that a deepcopy of the model
    # (the reference policy, the asynchronous generator's copy) switches between its own.
    return (self.liger_forward if in_training_pass() else self.plain_forward)(*args, **kwargs)


_MISSING = object()


def apply_liger(model: nn.Module) -> int:
    """Liger's fused RMSNorm, rotary embedding and SwiGLU MLP on `model`'s modules, for training
    passes only (see the module docstring); returns how many module forwards were switched.
    Needs liger-kernel (and CUDA, triton); the architecture must be one of LIGER_ARCHITECTURES."""
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    arch = model.config.model_type
    modeling = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
    before = dict(vars(modeling))
    own = {id(m): m.__dict__.get("forward") for m in model.modules()}
    patch = MODEL_TYPE_TO_APPLY_LIGER_FN[arch]
    wanted = dict(rope=True, rms_norm=True, swiglu=True, geglu=True, cross_entropy=False,
                  fused_linear_cross_entropy=False)  # gemma's MLP is GeGLU: its patch takes geglu, not swiglu
    params = inspect.signature(patch).parameters
    patch(model=model, **{k: v for k, v in wanted.items() if k in params})
    for name, value in list(vars(modeling).items()):  # module globals: classes back, functions switched
        old = before.get(name, _MISSING)
        if value is old:
            continue
        if old is _MISSING:
            delattr(modeling, name)
        elif isinstance(old, type) or hasattr(old, "rlfactory_switch"):
            setattr(modeling, name, old)
        else:
            setattr(modeling, name, _switch(value, old))
    switched = 0
    for m in model.modules():
        patched = m.__dict__.get("forward")
        if patched is None or patched is own[id(m)] or getattr(patched, "__func__", None) is _switched_forward:
            continue
        m.liger_forward = patched
        m.plain_forward = own[id(m)] or MethodType(type(m).forward, m)
        m.forward = MethodType(_switched_forward, m)
        switched += 1
    return switched


# ---- torch.compile of the decoder body ------------------------------------------------------------

_COMPILED: "weakref.WeakKeyDictionary[nn.Module, nn.Module]" = weakref.WeakKeyDictionary()


def compiled(decoder: nn.Module) -> nn.Module:
    """`decoder` through torch.compile (dynamic shapes), made once per decoder object. The decoder
    itself is left as it is: the generator calls it uncompiled (its decode records CUDA graphs)."""
    out = _COMPILED.get(decoder)
    if out is None:
        out = _COMPILED[decoder] = torch.compile(decoder, dynamic=True)
    return out
