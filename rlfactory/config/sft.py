"""Config section `sft:` — the warm start (`rlfactory sft`)."""

from __future__ import annotations

from rlfactory.config.base import ConfigPath, Section


class SftConfig(Section):
    """Supervised fine-tuning on demonstrations written by the env's own solver."""

    demos: int = 512
    """Demonstrations to write (the first rows of the env's train split, cycled if fewer)."""
    steps: int = 200
    """Optimizer steps."""
    batch_size: int = 32
    """Demonstrations per optimizer step."""
    lr: float = 3e-3
    """Peak learning rate (AdamW), reached after `warmup_steps` and decayed linearly to 10%."""
    full_text_steps: int = 0
    """How many of the first `steps` train on every token of the demonstration, prompt and tool
    results included (like TRL's SFT without `assistant_only_loss`); the rest train on model
    tokens only. Reading the passages teaches a model trained from scratch to copy names, which
    the model tokens alone teach slowly."""
    warmup_steps: int = 10
    """Steps of linear warm-up."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""
    seed: int = 0
    """Seeds batch order."""
    out: ConfigPath = "runs/sft"
    """A folder: the fine-tuned model goes to `<out>/model` (Hugging Face format; train from it
    with `model.path=<out>/model`), the per-step metrics to `<out>/sft_metrics.jsonl`."""
    bf16: bool = False
    """bfloat16 autocast for the forward passes."""
    check_rows: int = 32
    """After training: roll out this many rows of the test split greedily and compare the model's
    tool calls with the demonstrator's (format, calls matched by name and arguments, calls that
    succeeded), printed with advice where they are low and saved to `<out>/warm_start.json`; 0: skip."""
