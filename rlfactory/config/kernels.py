"""The `trainer.kernels:` section: which GPU kernels the training forward uses.

Every switch's `auto` turns the kernel on only on CUDA (where it is faster), so CPU runs compute
exactly what they did before. `on` where the kernel cannot run (no CUDA for liger, liger-kernel
not installed, an architecture it does not patch) is one error line at start-up
(rlfactory/train/kernels.py `resolve_kernels`), before any work."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator, model_validator

from rlfactory.config.base import Section

Switch = Literal["auto", "on", "off"]


class KernelsConfig(Section):
    """Kernels of the training forward (the update's passes, the FSDP learner's and the recomputation of old logprobs)."""

    liger: Switch = "auto"
    """Liger Kernel's fused RMSNorm, rotary embedding and SwiGLU MLP patched into the training
    model (`pip install 'rlfactory[gpu]'`; needs CUDA and triton). auto = on CUDA where
    liger-kernel imports and the architecture is one it patches (qwen2, qwen3, llama, mistral,
    gemma, ...); on = the same, and an error where it cannot."""
    fused_head: Switch = "auto"
    """Token logprobs and entropy straight from the hidden states and the LM head's weight,
    head_chunk_tokens rows at a time, never holding the [tokens, vocabulary] logits (the
    backward recomputes each chunk's logits). auto = on CUDA; on = also on the CPU. Falls back to
    the plain head (one line on stderr) where the head is not a plain linear layer."""
    head_chunk_tokens: int = 4096
    """Rows of the fused head's chunks: each chunk holds head_chunk_tokens x vocabulary logits
    (4096 x 152k in bf16 = 1.2 GB) at a time."""
    compile: bool = False
    """torch.compile the decoder body for the update's passes (dynamic shapes). The first steps
    pay the compilation."""
    packed: Switch = "auto"
    """Pack each pass's sequences end to end in one row with per-document attention masks
    instead of padding them (no padded positions). auto = on CUDA; on = also on the CPU."""

    @field_validator("liger", "fused_head", "packed", mode="before")
    @classmethod
    def _yaml_booleans(cls, value: object) -> object:
        # YAML 1.1 (PyYAML) reads a bare `on` / `off` as true / false.
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _check(self) -> "KernelsConfig":
        if self.head_chunk_tokens < 1:
            raise ValueError(f"trainer.kernels.head_chunk_tokens must be >= 1, got {self.head_chunk_tokens}")
        return self
