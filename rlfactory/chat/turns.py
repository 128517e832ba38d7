"""A model turn's text as a ToolManager reads it: the text without the stop token that ended the
turn, parsed inline or, when long, in a worker thread. rlfactory's own rollouts (rollout/episode.py)
and the recording gateway (serve/gateway.py) read turns the same way."""

from __future__ import annotations

import asyncio

from rlfactory.chat.base import ParseResult, ToolManager
from rlfactory.protocols import GenResult

PARSE_INLINE_CHARS = 2048
"""A turn's text up to this many characters is parsed on the event loop; a longer one in a worker
thread (`asyncio.to_thread`), so that a slow parse cannot stall the other trajectories and their
tool timeouts. Short turns (nearly all: 2,048 characters is ~500 tokens) stay inline, where the
thread hop would cost more than the parse."""


async def parse_turn(tm: ToolManager, text: str) -> ParseResult:
    """`tm.parse(text)`, in a worker thread when the text is longer than PARSE_INLINE_CHARS."""
    if len(text) > PARSE_INLINE_CHARS:
        return await asyncio.to_thread(tm.parse, text)
    return tm.parse(text)


def turn_text(result: GenResult, stop_texts: dict[int, str]) -> str:
    """The turn's text as the parser sees it: the generator's text without the stop token that
    ended the turn (a stop string, when one ended it, stays: it is part of the model's text)."""
    stop = stop_texts.get(result.stop_token) if result.stop_token is not None else None
    if stop and result.text.endswith(stop):
        return result.text[: -len(stop)]
    return result.text
