"""Config section `sft:` — the warm start (`rlfactory sft`)."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

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
    """Peak learning rate (AdamW), reached after `warmup_steps`; then `lr_schedule`."""
    lr_schedule: Literal["linear", "constant", "wsd"] = "linear"
    """After warm-up: `linear` decays to 10% of `lr` by the last step; `constant` stays at `lr`
    (a skill that appears late, such as the demo's tiny model copying a year's digits, keeps
    the rate it needs to form); `wsd` (warm-up, stable, decay) stays at `lr` and then decays
    linearly to 10% of it over the last `decay_steps` steps (a high rate to form what needs it,
    then a settling phase)."""
    decay_steps: int = 100
    """`lr_schedule: wsd` only: how many of the last steps decay the rate."""
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
    group_by_length: bool = True
    """Split each step's demonstrations into forward/backward passes of similar length
    (rlfactory/passes.py `plan_micro_batches`, as the RL update does) and sum their gradients: the
    same step as one padded pass, without computing the padding a short demonstration (a guess)
    gets beside a long one (several tool results). false = one pass a step."""
    micro_batch_tokens: int | None = None
    """At most this many padded token positions in one pass (memory only, not the result); a
    longer demonstration gets a pass of its own. Needs group_by_length."""
    check_rows: int = 32
    """After training: roll out this many rows of the test split greedily and compare the model's
    tool calls with the demonstrator's (format, calls matched by name and arguments, calls that
    succeeded), printed with advice where they are low and saved to `<out>/warm_start.json`; 0: skip."""

    @model_validator(mode="after")
    def _check(self) -> "SftConfig":
        if self.lr_schedule == "wsd" and not 1 <= self.decay_steps <= self.steps - self.warmup_steps:
            raise ValueError(f"sft.decay_steps must be between 1 and sft.steps - sft.warmup_steps "
                             f"({self.steps - self.warmup_steps}) for lr_schedule wsd, got {self.decay_steps}")
        if self.micro_batch_tokens is not None:
            if self.micro_batch_tokens < 1:
                raise ValueError("sft.micro_batch_tokens must be >= 1 (or null for no cap)")
            if not self.group_by_length:
                raise ValueError("sft.micro_batch_tokens needs sft.group_by_length: true")
        return self
