"""`llama3` ToolManager: Llama 3.1 JSON tool calls, results in the `ipython` role.

A call turn is `{"name": "f", "parameters": {...}}<|eot_id|>` (as the Llama 3.1 template renders
an assistant message with one tool call, and as Meta's prompt asks: "Respond in the format {"name":
function name, "parameters": dictionary of argument name and its value}"). Each result becomes its
own `ipython` turn. When the tokenizer's own template cannot render tool calls (plain Llama 3
templates), rlfactory's Llama 3.1-style template (`templates/llama3.jinja`) is used instead.

How `parse` reads a turn (the exact rule):

1. Reasoning inside `<think>...</think>` is dropped (the calls below are never searched in it).
2. A *call object* is a JSON object with a "name" key and a "parameters" or "arguments" key, in
   any order, other keys allowed; "type", if present, must be "function". The OpenAI wrapper
   `{"type": "function", "function": {call object}}` is one too. A *call value* is a call object or
   a JSON list whose first item is a call object (every item must then be a valid call).
3. Calls start either right after `<|python_tag|>` (then a call value must follow, or the turn is
   Malformed), or at the start of a line (leading spaces allowed) with a JSON value that decodes to
   a call value. JSON elsewhere (inside a sentence, like `the user is {"name": "Alice"}`) and line-
   start JSON of another shape (`{"name": "Alice"}` has no parameters) are text.
4. A line-start JSON value that does not decode and opens like a call (`{"name":`, `{"parameters":`,
   `{"arguments":`, `{"function":` or `{"type": "function"`, optionally inside `[`) makes the
   turn Malformed with the decoder's reason; other undecodable JSON is text.
5. After the first call value, more call values may follow, separated by whitespace, `;`, `,` or
   `<|python_tag|>`; the first thing that is not a call value ends the calls. What follows is
   trailing text (allowed by default, Malformed with `trailing_text="malformed"`); the text before
   the first call is `ToolCalls.text`.
6. A turn with no call is the final answer (the content of `<answer>...</answer>` if written).

JSON is decoded with `parsing.decode_json`'s limits, so parsing never raises and is linear in the
length of the turn.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from typing import Any, Literal

from rlfactory.chat.base import Answer, Malformed, ParseResult, ToolCalls
from rlfactory.chat.parsing import (JsonError, TagPair, answer_text, call_from_object, decode_json_prefix,
                                    is_call_object, split_reasoning, unknown_tool_reason)
from rlfactory.chat.template import ChatTemplate, ModelTurn, conversation, openai_tool_calls, openai_tools
from rlfactory.chat.templates import load_template
from rlfactory.tools.base import ToolCall, ToolResult, ToolSpec

END_OF_TURN = "<|eot_id|>"
PYTHON_TAG = "<|python_tag|>"
ARG_KEYS = ("parameters", "arguments")
# Possessive quantifiers throughout: matching never backtracks, so every scan below is linear.
_OPENS_LIKE_CALL = r'(?:\[\s*+)?\{\s*+(?:"(?:name|parameters|arguments|function)"\s*+:|"type"\s*+:\s*+"function")'
_CALL_START = re.compile(_OPENS_LIKE_CALL)
_JSON_LINE = re.compile(r"^[ \t]*+(?=[\[{])", re.MULTILINE)  # match end: a line-start JSON candidate
# Calls (and everything after them) are never reasoning, even if their arguments contain <think>.
_PROTECT = [TagPair(PYTHON_TAG), TagPair(re.compile(r"^[ \t]*+(?=" + _OPENS_LIKE_CALL + ")", re.MULTILINE))]
_SEPARATORS = re.compile(r"(?:[ \t\r\n;,]++|<\|python_tag\|>)*+")


class Llama3ToolManager:
    """ToolManager for Llama 3.x instruct models."""

    family = "llama3"

    def __init__(
        self,
        tokenizer: Any,
        *,
        known_tools: Collection[str] | None = None,
        trailing_text: Literal["allow", "malformed"] = "allow",
        chat_template: str | None = None,
    ):
        """`chat_template`: None picks the tokenizer's template if it renders tool calls, else
        rlfactory's Llama 3.1-style one; "tokenizer" / "builtin" force one; other text is a template."""
        own = getattr(tokenizer, "chat_template", None)
        if chat_template is None:
            template = own if own and "tool_calls" in own else load_template("llama3")
        elif chat_template == "tokenizer":
            template = own
        elif chat_template == "builtin":
            template = load_template("llama3")
        else:
            template = chat_template
        self.tokenizer = tokenizer
        self.known_tools = set(known_tools) if known_tools is not None else None
        self.trailing_text = trailing_text
        self.template = ChatTemplate(tokenizer, template)
        self._structured_calls = "tool_calls" in self.template.template

    # -- ToolManager protocol --------------------------------------------------------------
    def render_prompt(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec]) -> list[int]:
        return self.template.encode(self.render_prompt_text(messages, tools))

    def render_prompt_text(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec]) -> str:
        return self.template.render(messages, openai_tools(tools), add_generation_prompt=True)

    def parse(self, text: str, known_tools: Collection[str] | None = None) -> ParseResult:
        """See the module docstring for the rule. Linear in `len(text)`; never raises."""
        _, visible = split_reasoning(text, protect=_PROTECT)
        first = _first_call(visible)
        if isinstance(first, Malformed):
            return first
        if first is None:
            return Answer(answer_text(visible))
        start, pos = first
        calls: list[ToolCall] = []
        while True:
            decoded = decode_json_prefix(visible, pos)
            if isinstance(decoded, JsonError):
                if _CALL_START.match(visible, pos):
                    return Malformed(f"the tool call {decoded.reason}: {_snippet(visible, pos)!r}")
                break
            if not _is_call_value(decoded.value):
                break
            for item in decoded.value if isinstance(decoded.value, list) else [decoded.value]:
                call = call_from_object(item, ARG_KEYS)
                if isinstance(call, str):
                    return Malformed(call)
                calls.append(call)
            pos = _SEPARATORS.match(visible, decoded.end).end()  # type: ignore[union-attr]
            if pos >= len(visible) or visible[pos] not in "[{":
                break
        unknown = unknown_tool_reason(calls, known_tools if known_tools is not None else self.known_tools)
        if unknown:
            return Malformed(unknown)
        after = visible[pos:].strip()
        if after and self.trailing_text == "malformed":
            return Malformed("text after the tool call; end the turn after your tool calls")
        before = visible[:start].replace(PYTHON_TAG, "").strip()
        return ToolCalls(calls, text=(before + " " + after).strip())

    def render_observation(self, results: Sequence[ToolResult]) -> list[int]:
        return self.template.encode(self.observation_text(results))

    def render_user_turn(self, text: str) -> list[int]:
        return self.template.encode(self.template.user_turn_text(text, END_OF_TURN))

    def stop_token_ids(self) -> list[int]:
        names = [END_OF_TURN, "<|eom_id|>", "<|end_of_text|>", getattr(self.tokenizer, "eos_token", None)]
        return sorted({i for i in (self.template.token_id(n) for n in names) if i is not None})

    def stop_strings(self) -> list[str]:
        return []

    # -- formats ------------------------------------------------------------------------------
    def observation_text(self, results: Sequence[ToolResult]) -> str:
        """The text of `render_observation`: one `ipython` turn per result plus the assistant header."""
        context = [{"role": "user", "content": "?"}, self.assistant_message(ModelTurn([ToolCall("f", {})]))]
        tool_messages = [{"role": "ipython", "content": r.text} for r in results]
        return self.template.delta_after_turn(context, tool_messages, END_OF_TURN)

    def format_turn(self, turn: ModelTurn) -> str:
        """The text a model writes for `turn` (without `<|eot_id|>`)."""
        calls = [f'{{"name": "{c.name}", "parameters": {json.dumps(c.arguments, ensure_ascii=False)}}}'
                 for c in turn.calls]
        return "\n".join(([turn.content] if turn.content else []) + calls)

    def assistant_message(self, turn: ModelTurn) -> dict[str, Any]:
        """`turn` as a chat message whose template rendering is exactly the model's tokens. Llama 3.1
        templates render one structured call per message; anything else goes in as plain content."""
        if self._structured_calls and len(turn.calls) == 1 and not turn.content:
            return {"role": "assistant", "content": "", "tool_calls": openai_tool_calls(turn.calls)}
        return {"role": "assistant", "content": self.format_turn(turn)}

    # -- token contract -------------------------------------------------------------------------
    thinks = False

    def model_turn_ids(self, turn: ModelTurn) -> list[int]:
        return self.template.encode(self.format_turn(turn) + END_OF_TURN)

    def reference_ids(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec],
                      steps: Sequence[ModelTurn | Sequence[ToolResult]]) -> list[int]:
        conv = conversation(messages, steps, self.assistant_message, "ipython")
        return self.template.reference_ids(conv, openai_tools(tools), END_OF_TURN)


def _snippet(text: str, pos: int) -> str:
    return text[pos: pos + 120]


def _is_call_value(value: Any) -> bool:
    """A call object, or a list whose first item is one (rule 2 of the module docstring)."""
    if isinstance(value, list):
        return bool(value) and is_call_object(value[0], ARG_KEYS)
    return is_call_object(value, ARG_KEYS)


def _first_call(visible: str) -> tuple[int, int] | Malformed | None:
    """(where the text before the calls ends, where the first call value starts), a Malformed turn,
    or None when the turn has no call (rules 3 and 4). Each candidate is decoded at most once and
    candidates inside an already decoded (or failed) value are skipped, so this is linear."""
    tag = visible.find(PYTHON_TAG)
    skip_until = 0
    for m in _JSON_LINE.finditer(visible, 0, tag if tag != -1 else len(visible)):
        pos = m.end()
        if pos < skip_until:
            continue
        decoded = decode_json_prefix(visible, pos)
        if isinstance(decoded, JsonError):
            if _CALL_START.match(visible, pos):
                return Malformed(f"the tool call {decoded.reason}: {_snippet(visible, pos)!r}")
            skip_until = decoded.pos
        elif _is_call_value(decoded.value):
            return pos, pos
        else:
            skip_until = decoded.end
    if tag == -1:
        return None
    pos = _SEPARATORS.match(visible, tag).end()  # type: ignore[union-attr]
    decoded = decode_json_prefix(visible, pos)
    if isinstance(decoded, JsonError) and _CALL_START.match(visible, pos):
        return Malformed(f"the tool call {decoded.reason}: {_snippet(visible, pos)!r}")
    if isinstance(decoded, JsonError) or not _is_call_value(decoded.value):
        return Malformed(f'{PYTHON_TAG} must be followed by a JSON tool call such as '
                         f'{{"name": "search", "parameters": {{"query": "..."}}}}; got {_snippet(visible, pos)!r}')
    return tag, pos
