"""The token contract checker, run at start-up for the configured tokenizer and ToolManager.

It renders a sample multi-turn conversation two ways: incrementally, as the rollout engine builds a
trajectory (prompt ids + model ids + observation ids + model ids ...), and at once through the chat
template (`reference_ids`). Model ids are the tokens the model would sample: its text encoded on its
own, ending with the end-of-turn token. Any difference raises `TokenContractError` naming the first
differing position, the segment it falls in, and both tokens decoded.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlfactory.chat.template import ModelTurn
from rlfactory.chat.vision import VisionToolManager, sample_with_images
from rlfactory.tools.base import ToolCall, ToolResult, ToolSpec

SAMPLE_TOOLS = [
    ToolSpec("search", "Search an encyclopedia.",
             {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
    ToolSpec("lookup", "Look up one attribute of an entity.",
             {"type": "object", "properties": {"query": {"type": "string"}, "attribute": {"type": "string"}},
              "required": ["query"]}),
]
SAMPLE_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "How many people live in Brathor, and who founded it?"},
]


class TokenContractError(RuntimeError):
    """prompt + model + observation ... ids differ from the chat template's rendering."""

    def __init__(self, message: str, position: int = -1, expected: str | None = None, got: str | None = None):
        super().__init__(message)
        self.position, self.expected, self.got = position, expected, got


@dataclass
class _Segment:
    role: str  # prompt | model | observation
    start: int
    end: int


def sample_steps(thinks: bool) -> list[ModelTurn | list[ToolResult]]:
    """A tool call with text before it, its result, two calls in one turn, two results (one an
    error), then the answer. `thinks`: every model turn starts with reasoning."""
    def reason(text: str) -> str | None:
        return text if thinks else None

    return [
        ModelTurn([ToolCall("search", {"query": "Brathor Zürich population"})], "Let me look that up.",
                  reason("I should search for the population first.")),
        [ToolResult("Brathor is a city of 4,200 people.\nIt lies on the river Quel.")],
        ModelTurn([ToolCall("lookup", {"query": "Brathor", "attribute": "founder"}),
                   ToolCall("search", {"query": "Brathor founder"})], "",
                  reason("Now the founder; two calls at once.")),
        [ToolResult('{"founder": "Stiorn"}'), ToolResult.error("Error: search timed out")],
        ModelTurn([], "Brathor has 4,200 people and was founded by Stiorn.", reason("I have both facts.")),
    ]


def check_token_contract(tool_manager: Any, tokenizer: Any | None = None, model_name: str | None = None) -> None:
    """Raise `TokenContractError` if incremental rendering differs from the chat template's.

    `tokenizer` decodes tokens for the error message (default: the manager's); `model_name` (e.g.
    model.path) is named in it too. A user ToolManager without `model_turn_ids` / `reference_ids`
    cannot be checked: a warning says so. A vision-language manager (`VisionToolManager`) is checked on
    the same conversation with an image in the question and two in the first tool result.
    """
    if not (hasattr(tool_manager, "model_turn_ids") and hasattr(tool_manager, "reference_ids")):
        warnings.warn(f"ToolManager {type(tool_manager).__name__} has no model_turn_ids/reference_ids; "
                      "the token contract is not checked", stacklevel=2)
        return
    tokenizer = tokenizer if tokenizer is not None else tool_manager.tokenizer
    family = getattr(tool_manager, "family", type(tool_manager).__name__)
    model_name = model_name or getattr(tool_manager, "model_name", None) or getattr(tokenizer, "name_or_path", None)
    if model_name:
        family = f"{family} ToolManager for model {model_name}"
    steps = sample_steps(bool(getattr(tool_manager, "thinks", False)))
    messages = SAMPLE_MESSAGES
    if isinstance(tool_manager, VisionToolManager):  # image turns: a picture in the question and two in a result
        messages, steps = sample_with_images(messages, steps)
    try:
        ids, segments = _incremental(tool_manager, messages, SAMPLE_TOOLS, steps)
        reference = list(tool_manager.reference_ids(messages, SAMPLE_TOOLS, steps))
    except ValueError as e:  # e.g. the template cannot render this family's turns at all
        raise TokenContractError(f"{family}: cannot render the sample conversation: {e}") from e
    stops = set(tool_manager.stop_token_ids())
    for seg, step in zip((s for s in segments if s.role == "model"), (s for s in steps if isinstance(s, ModelTurn))):
        if not step.calls or not tool_manager.stop_strings():
            if ids[seg.end - 1] not in stops:
                raise TokenContractError(
                    f"{family}: a model turn ends with {_tok(tokenizer, ids[seg.end - 1])!r}, "
                    f"which is not one of stop_token_ids() {sorted(stops)}")
    _compare(family, tokenizer, ids, reference, segments)


def _incremental(manager: Any, messages: list[dict[str, Any]], tools: Sequence[ToolSpec],
                 steps: Sequence[ModelTurn | list[ToolResult]]) -> tuple[list[int], list[_Segment]]:
    ids = list(manager.render_prompt(messages, tools))
    segments = [_Segment("prompt", 0, len(ids))]
    for step in steps:
        part = manager.model_turn_ids(step) if isinstance(step, ModelTurn) else manager.render_observation(step)
        role = "model" if isinstance(step, ModelTurn) else "observation"
        segments.append(_Segment(role, len(ids), len(ids) + len(part)))
        ids.extend(part)
    return ids, segments


def _tok(tokenizer: Any, token_id: int | None) -> str:
    return "<end>" if token_id is None else tokenizer.decode([token_id])


def _compare(family: str, tokenizer: Any, got: list[int], expected: list[int], segments: list[_Segment]) -> None:
    n = min(len(got), len(expected))
    pos = next((i for i in range(n) if got[i] != expected[i]), None)
    if pos is None:
        if len(got) == len(expected):
            return
        pos = n
    g = got[pos] if pos < len(got) else None
    e = expected[pos] if pos < len(expected) else None
    seg = next((s for s in segments if s.start <= pos < s.end), segments[-1])
    k = sum(1 for s in segments if s.role == seg.role and s.start <= seg.start)
    context = tokenizer.decode(expected[max(0, pos - 12): pos])
    raise TokenContractError(
        f"{family}: token contract broken at position {pos} ({seg.role} segment #{k}): "
        f"the chat template renders {_tok(tokenizer, e)!r} (id {e}) but prompt+model+observation ids "
        f"have {_tok(tokenizer, g)!r} (id {g}); text before it: {context!r}",
        position=pos, expected=_tok(tokenizer, e), got=_tok(tokenizer, g),
    )
