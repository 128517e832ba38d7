"""A request inside the decode loop: what it asked for, what it has sampled so far, why it ended."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from rlfactory.protocols import GenRequest


@dataclass
class Row:
    req: GenRequest
    future: asyncio.Future
    stop_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    t_submit: float
    t_start: float = 0.0
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    """None while generating; "stop" (a stop token or string) or "length" once done."""
    stop_token: int | None = None
    rope_delta: int = 0
    """Multimodal rotary position minus cache column of the tokens after the prompt (nonzero after
    images: vision.py); 0 for text."""
