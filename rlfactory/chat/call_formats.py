"""How a model writes tool calls, for the `template` ToolManager family.

| name          | what the model writes for calls f(x=1) and g()                                   |
|---------------|----------------------------------------------------------------------------------|
| `hermes`      | `<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>` per call (Qwen2.5/3, Hermes) |
| `hermes_list` | `<tool_call>[{"name": "f", "arguments": {"x": 1}}, {"name": "g", ...}]</tool_call>` (SmolLM2-1.7B) |
| `llama3_json` | `{"name": "f", "parameters": {"x": 1}}` per line (Llama 3.1/3.2/3.3)               |
| `mistral`     | `[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}, ...]` (Mistral v3 templates)   |

Each format writes calls (`format_calls`) and parses a turn's visible text (`parse`). Parsing is
lenient where that costs nothing (a `<tool_call>` block may hold an object or a list; "arguments"
and "parameters" are both accepted) and never raises: it returns None (no call was attempted: the
turn is an answer), a `FoundCalls`, or the reason (a str) why the attempted call cannot be run.
It runs in time linear in the text, on the helpers of rlfactory/chat/parsing.py: tags are paired by
`find_json_regions` (one left-to-right pass; a close tag inside a JSON string is not one), JSON
goes through the bounded `decode_json` (huge integers, NaN, deep nesting and unpaired surrogates
become a reason).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rlfactory.chat.parsing import (
    JsonError, TagPair, call_from_object, decode_json, decode_json_prefix, find_json_regions, outside_regions,
)
from rlfactory.tools.base import ToolCall


@dataclass
class FoundCalls:
    calls: list[ToolCall]
    text: str  # the visible text outside the calls
    trailing: str  # text after the last call (for `trailing_text: malformed`)


ParsedCalls = FoundCalls | str | None


class CallFormat(Protocol):
    name: str
    protect: list[TagPair]
    """Regions that are never reasoning even when they contain `<think>` (see split_reasoning)."""

    def format_calls(self, calls: Sequence[ToolCall]) -> str:
        """The text the model writes for `calls` (no surrounding whitespace)."""
        ...

    def parse(self, visible: str) -> ParsedCalls:
        """None: no call in `visible`; FoundCalls; or why the attempted call is malformed. Never raises."""
        ...


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _calls_of(value: Any, arg_keys: tuple[str, ...]) -> list[ToolCall] | str:
    """One call per object of `value` (an object, or a list of objects)."""
    items = value if isinstance(value, list) else [value]
    if not items:
        return "an empty list of tool calls"
    calls = []
    for i, item in enumerate(items):
        call = call_from_object(item, arg_keys)
        if isinstance(call, str):
            return call if len(items) == 1 else f"tool call {i + 1}: {call}"
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            call.id = item["id"]
        calls.append(call)
    return calls


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# -- formats -------------------------------------------------------------------------------------
_TOOL_CALL_PAIR = TagPair("<tool_call>", "</tool_call>")


class HermesFormat:
    """`<tool_call>{json object}</tool_call>` blocks; `list_body=True` writes one block with a list."""

    def __init__(self, list_body: bool = False) -> None:
        self.list_body = list_body
        self.name = "hermes_list" if list_body else "hermes"
        self.protect = [_TOOL_CALL_PAIR]

    def format_calls(self, calls: Sequence[ToolCall]) -> str:
        objs = [{"name": c.name, "arguments": c.arguments} for c in calls]
        if self.list_body:
            return f"<tool_call>[{', '.join(_dumps(o) for o in objs)}]</tool_call>"
        return "\n".join(f"<tool_call>\n{_dumps(o)}\n</tool_call>" for o in objs)

    def parse(self, visible: str) -> ParsedCalls:
        blocks = find_json_regions(visible, _TOOL_CALL_PAIR)
        outside = outside_regions(visible, blocks)
        if "<tool_call>" in outside:
            return "<tool_call> is not closed with </tool_call>"
        if not blocks:
            return None
        calls: list[ToolCall] = []
        for block in blocks:
            body = visible[block.body_start: block.body_end]
            decoded = decode_json(body)
            if isinstance(decoded, JsonError):
                return f"the tool call {decoded.reason}: {_short(body.strip())!r}"
            found = _calls_of(decoded.value, ("arguments", "parameters"))
            if isinstance(found, str):
                return found
            calls.extend(found)
        return FoundCalls(calls, outside.strip(), visible[blocks[-1].end:].strip())


# A JSON call object starts here: `{"name":`, `{"function":`, `[{"name":` (keys in any order are
# accepted by the decoder; this only spots where an attempt begins).
_JSON_CALL_START = re.compile(r'[\[{][ \t\r\n]*+(?:\{[ \t\r\n]*+)?"(?:name|function|type|parameters|arguments)"[ \t\r\n]*+:')
_SEPARATORS = " \t\r\n;,"


class Llama3JsonFormat:
    """`{"name": ..., "parameters": {...}}` objects (one per line, `;`-separated, or a JSON list),
    optionally after `<|python_tag|>`."""

    name = "llama3_json"
    protect: list[TagPair] = []

    def format_calls(self, calls: Sequence[ToolCall]) -> str:
        return "\n".join(_dumps({"name": c.name, "parameters": c.arguments}) for c in calls)

    def parse(self, visible: str) -> ParsedCalls:
        visible = visible.replace("<|python_tag|>", "")
        m = _JSON_CALL_START.search(visible)
        if m is None:
            return None
        return _json_calls(visible, m.start(), ("parameters", "arguments"))


class MistralFormat:
    """`[TOOL_CALLS]` followed by a JSON list of `{"name", "arguments"[, "id"]}` objects."""

    name = "mistral"
    marker = "[TOOL_CALLS]"
    protect = [TagPair("[TOOL_CALLS]")]  # from the marker on, the text is calls

    def format_calls(self, calls: Sequence[ToolCall]) -> str:
        objs = [{"name": c.name, "arguments": c.arguments} | ({"id": c.id} if c.id else {}) for c in calls]
        return self.marker + "[" + ", ".join(_dumps(o) for o in objs) + "]"

    def parse(self, visible: str) -> ParsedCalls:
        start = visible.find(self.marker)
        if start == -1:
            return None
        before = visible[:start]
        calls: list[ToolCall] = []
        pos = start
        while visible.startswith(self.marker, pos):
            value_at = pos + len(self.marker)
            while value_at < len(visible) and visible[value_at] in " \t\r\n":
                value_at += 1
            found = _json_calls(visible, value_at, ("arguments", "parameters"), single=True)
            if isinstance(found, str):
                return found
            calls.extend(found.calls)
            pos = len(visible) - len(found.trailing_raw)
            while pos < len(visible) and visible[pos] in " \t\r\n":
                pos += 1
        trailing = visible[pos:].strip()
        return FoundCalls(calls, (before.strip() + " " + trailing).strip(), trailing)


@dataclass
class _JsonCalls(FoundCalls):
    trailing_raw: str = ""


def _json_calls(text: str, start: int, arg_keys: tuple[str, ...], single: bool = False) -> _JsonCalls | str:
    """Consecutive JSON call values from `text[start]` (separated by whitespace, `;` or `,`; just
    one with `single`)."""
    calls: list[ToolCall] = []
    pos = start
    while pos < len(text) and text[pos] in "[{":
        decoded = decode_json_prefix(text, pos)
        if isinstance(decoded, JsonError):
            return f"the tool call {decoded.reason}: {_short(text[pos:])!r}"
        value, pos = decoded.value, decoded.end
        found = _calls_of(value, arg_keys)
        if isinstance(found, str):
            return found
        calls.extend(found)
        if single:
            break
        while pos < len(text) and text[pos] in _SEPARATORS:
            pos += 1
    if not calls:
        return f"no JSON tool call where one was expected: {_short(text[start:])!r}"
    trailing = text[pos:]
    return _JsonCalls(calls, (text[:start].strip() + " " + trailing.strip()).strip(), trailing.strip(), trailing)


FORMATS: dict[str, CallFormat] = {
    "hermes": HermesFormat(),
    "hermes_list": HermesFormat(list_body=True),
    "llama3_json": Llama3JsonFormat(),
    "mistral": MistralFormat(),
}


def get_format(name: str) -> CallFormat:
    if name not in FORMATS:
        raise ValueError(f"unknown call format {name!r}; choose one of {sorted(FORMATS)}")
    return FORMATS[name]


def detect_format(rendered: str, probe_name: str) -> str | None:
    """The format of a template's rendering of a call to `probe_name` (or of its tool instructions),
    or None when `rendered` shows no known call markup."""
    if MistralFormat.marker in rendered:
        return "mistral"
    at = rendered.find("<tool_call>")
    if at != -1:
        rest = rendered[at + len("<tool_call>"):].lstrip()
        return "hermes_list" if rest.startswith("[") else "hermes"
    if re.search(r'"name"\s*:\s*"' + re.escape(probe_name) + r'"\s*,\s*"parameters"', rendered) or \
            re.search(r'"parameters"\s*:.*"name"\s*:\s*"' + re.escape(probe_name) + '"', rendered):
        return "llama3_json"
    return None
