"""What a tokenizer's chat template can do, found by rendering small probe conversations.

`probe_template` answers, for the `template` ToolManager family: which text ends an assistant turn,
whether the template renders a tool list, structured tool calls (one, or several in one message),
tool results and reasoning, and which call format its rendering of a call shows. Nothing is taken
from the model's name or `model_type`: SmolLM2 is `model_type: llama` but speaks ChatML.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlfactory.chat.call_formats import detect_format
from rlfactory.chat.template import ChatTemplate, openai_tool_calls
from rlfactory.tools.base import ToolCall

PROBE_TOOL = "rlf_probe_tool"
PROBE_TEXT = "RLF_PROBE_ANSWER"
PROBE_RESULT = "RLF_PROBE_RESULT"
PROBE_REASONING = "RLF_PROBE_REASONING"
_PROBE_SCHEMA = {
    "type": "function",
    "function": {"name": PROBE_TOOL, "description": "rlf probe tool description",
                 "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}},
}


@dataclass(frozen=True)
class TemplateProfile:
    end_of_turn: str
    """The text (one special token) that ends an assistant turn: what the model generates last."""
    renders_tools: bool
    """The template writes the `tools` list into the prompt."""
    renders_calls: bool
    """The template renders an assistant message's structured `tool_calls`."""
    multi_calls: bool
    """... also several calls in one message."""
    renders_tool_role: bool
    """The template has its own markup for `tool` messages (not the role name printed verbatim)."""
    renders_reasoning: bool
    """The template renders an assistant message's `reasoning_content`."""
    call_format: str | None
    """The call format its rendering of a call (or its tool instructions) shows; None: no call markup."""


def _user(text: str = "?") -> dict[str, Any]:
    return {"role": "user", "content": text}


def _call_message(n: int = 1) -> dict[str, Any]:
    calls = [ToolCall(PROBE_TOOL, {"x": i + 1}) for i in range(n)]
    return {"role": "assistant", "content": "", "tool_calls": openai_tool_calls(calls)}


def _try(template: ChatTemplate, messages: list[dict[str, Any]], tools: list | None = None,
         gen: bool = False) -> str | None:
    """The rendering, or None when the template refuses (raises) for these messages."""
    try:
        return template.render(messages, tools, add_generation_prompt=gen)
    except Exception:  # noqa: BLE001 - jinja's raise_exception and template bugs alike: "cannot render"
        return None


def end_of_turn_of(template: ChatTemplate) -> str:
    """The special token a rendered assistant turn ends with (e.g. `<|im_end|>`, `<|eot_id|>`)."""
    text = _try(template, [_user(), {"role": "assistant", "content": PROBE_TEXT}])
    if text is None or PROBE_TEXT not in text:
        raise ValueError("the chat template does not render a plain assistant message")
    after = text[text.rindex(PROBE_TEXT) + len(PROBE_TEXT):]
    tok = template.tokenizer
    ids = template.encode(after)
    special = set(getattr(tok, "all_special_ids", []) or [])
    special |= {i for i, t in getattr(tok, "added_tokens_decoder", {}).items() if getattr(t, "special", False)}
    if ids and ids[0] in special:
        return tok.decode([ids[0]])
    eos = getattr(tok, "eos_token", None)
    if eos and after.startswith(eos):
        return eos
    raise ValueError(f"cannot tell which token ends an assistant turn: the template writes {after[:40]!r} after "
                     "one; set end_of_turn")


def probe_template(template: ChatTemplate, end_of_turn: str | None = None) -> TemplateProfile:
    eot = end_of_turn or end_of_turn_of(template)
    source = template.template
    with_tools = _try(template, [_user()], [_PROBE_SCHEMA], gen=True) or ""
    renders_tools = PROBE_TOOL in with_tools
    one = _try(template, [_user(), _call_message(1)]) or ""
    renders_calls = PROBE_TOOL in one
    two = _try(template, [_user(), _call_message(2)]) or ""
    multi = renders_calls and two.count(PROBE_TOOL) >= 2
    result = _try(template, [_user(), _call_message(1), {"role": "tool", "name": PROBE_TOOL, "content": PROBE_RESULT}],
                  [_PROBE_SCHEMA]) or ""
    verbatim = any(f"{h}tool\n" in result for h in ("<|im_start|>", "<|start_header_id|>", "<start_of_turn>"))
    renders_tool_role = PROBE_RESULT in result and "tool" in source and not verbatim
    reasoning = _try(template, [_user(), {"role": "assistant", "content": PROBE_TEXT, "reasoning_content": PROBE_REASONING}])
    renders_reasoning = bool(reasoning) and PROBE_REASONING in reasoning
    call_format = None
    if renders_calls:
        call_format = detect_format(one, PROBE_TOOL)
    if call_format is None and renders_tools:
        call_format = detect_format(with_tools, PROBE_TOOL)
    return TemplateProfile(eot, renders_tools, renders_calls, multi, renders_tool_role, renders_reasoning, call_format)
