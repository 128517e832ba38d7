"""`qwen3` ToolManager: Hermes-style `<tool_call>{json}</tool_call>` calls, `<tool_response>` results.

The model's turn looks like (thinking optional, calls optional, content optional):

    <think>\nREASONING\n</think>\n\nCONTENT\n<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call><|im_end|>

Calls written inside `<think>...</think>` are not calls. A turn without calls is the final answer;
its text is the content of `<answer>...</answer>` when the model wrote one.

Thinking and the token contract: Qwen3's template drops the reasoning of assistant turns before the
last user message, and an assistant turn without `reasoning_content` loses the empty
`<think>\n\n</think>\n\n` block that the template's own generation prompt inserted when
`enable_thinking=False`. rlfactory keeps the tokens the model actually saw; `assistant_message`
therefore always sets `reasoning_content` (`"\n"` for the empty block), and with that the template's
rendering of an episode (one user message, then tool turns) equals the incremental ids exactly.
An env that adds new user messages mid-episode makes the template drop earlier reasoning; the
trajectory still holds what the model saw.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any, Literal

from rlfactory.chat.base import Answer, Malformed, ParseResult, ToolCalls
from rlfactory.chat.parsing import (TagPair, answer_text, call_from_json, find_json_regions, outside_regions,
                                    split_reasoning, unknown_tool_reason)
from rlfactory.chat.template import ChatTemplate, ModelTurn, conversation, openai_tool_calls, openai_tools
from rlfactory.chat.templates import load_template
from rlfactory.tools.base import ToolCall, ToolResult, ToolSpec

_CALL = TagPair("<tool_call>", "</tool_call>")
END_OF_TURN = "<|im_end|>"


class Qwen3ToolManager:
    """ToolManager for Qwen3 (and Qwen2.5 / Hermes-format) chat templates."""

    family = "qwen3"

    def __init__(
        self,
        tokenizer: Any,
        *,
        enable_thinking: bool | None = None,
        known_tools: Collection[str] | None = None,
        trailing_text: Literal["allow", "malformed"] = "allow",
        chat_template: str | None = None,
    ):
        """`enable_thinking`: passed to the template (None: the template's default, thinking on).
        `known_tools`: names a call may use; others parse as Malformed (None: any name).
        `trailing_text`: what text after the last `</tool_call>` means ("allow": still ToolCalls).
        `chat_template`: template text; default the tokenizer's, or rlfactory's Qwen3 copy if none."""
        template = chat_template or getattr(tokenizer, "chat_template", None) or load_template("qwen3")
        self.tokenizer = tokenizer
        self.enable_thinking = enable_thinking
        self.known_tools = set(known_tools) if known_tools is not None else None
        self.trailing_text = trailing_text
        self.template = ChatTemplate(tokenizer, template, enable_thinking=enable_thinking)

    # -- ToolManager protocol --------------------------------------------------------------
    def render_prompt(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec]) -> list[int]:
        return self.template.encode(self.render_prompt_text(messages, tools))

    def render_prompt_text(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec]) -> str:
        return self.template.render(messages, openai_tools(tools), add_generation_prompt=True)

    def parse(self, text: str, known_tools: Collection[str] | None = None) -> ParseResult:
        """Linear in `len(text)`; never raises (JSON limits: see `parsing.decode_json`)."""
        _, visible = split_reasoning(text, protect=[_CALL])
        blocks = find_json_regions(visible, _CALL)
        outside = outside_regions(visible, blocks)
        if "<tool_call>" in outside:
            return Malformed("<tool_call> is not closed with </tool_call>")
        if "</tool_call>" in outside:
            return Malformed("</tool_call> without an opening <tool_call>")
        if not blocks:
            return Answer(answer_text(visible))
        calls: list[ToolCall] = []
        for i, m in enumerate(blocks):
            call = call_from_json(visible[m.body_start: m.body_end])
            if isinstance(call, str):
                return Malformed(call if len(blocks) == 1 else f"tool call {i + 1}: {call}")
            calls.append(call)
        unknown = unknown_tool_reason(calls, known_tools if known_tools is not None else self.known_tools)
        if unknown:
            return Malformed(unknown)
        after = visible[blocks[-1].end:].strip()
        if after and self.trailing_text == "malformed":
            return Malformed("text after the last </tool_call>; end the turn after your tool calls")
        return ToolCalls(calls, text=outside.strip())

    def render_observation(self, results: Sequence[ToolResult]) -> list[int]:
        return self.template.encode(self.observation_text(results))

    def render_user_turn(self, text: str) -> list[int]:
        return self.template.encode(self.template.user_turn_text(text, END_OF_TURN))

    def stop_token_ids(self) -> list[int]:
        names = [END_OF_TURN, "<|endoftext|>", getattr(self.tokenizer, "eos_token", None)]
        return sorted({i for i in (self.template.token_id(n) for n in names) if i is not None})

    def stop_strings(self) -> list[str]:
        return []

    # -- formats ------------------------------------------------------------------------------
    def observation_text(self, results: Sequence[ToolResult]) -> str:
        """The text of `render_observation`: tool turn(s) plus the next assistant header."""
        # Reasoning on the context turn makes Qwen3 render it the same whether or not it is last.
        context = [{"role": "user", "content": "?"}, self.assistant_message(ModelTurn([ToolCall("f", {})], reasoning="."))]
        tool_messages = [{"role": "tool", "content": r.text} for r in results]
        return self.template.delta_after_turn(context, tool_messages, END_OF_TURN)

    def format_turn(self, turn: ModelTurn) -> str:
        """The text a model writes for `turn` (without the end-of-turn token)."""
        out = f"<think>\n{turn.reasoning}\n</think>\n\n" if turn.reasoning is not None else ""
        out += turn.content
        for i, call in enumerate(turn.calls):
            if i > 0 or turn.content:
                out += "\n"
            args = json.dumps(call.arguments, ensure_ascii=False)
            out += f'<tool_call>\n{{"name": "{call.name}", "arguments": {args}}}\n</tool_call>'
        return out

    def assistant_message(self, turn: ModelTurn) -> dict[str, Any]:
        """`turn` as a chat message whose template rendering is exactly the model's tokens."""
        msg: dict[str, Any] = {"role": "assistant", "content": turn.content}
        if turn.calls:
            msg["tool_calls"] = openai_tool_calls(turn.calls)
        if turn.reasoning is not None:
            msg["reasoning_content"] = turn.reasoning
        elif self.enable_thinking is False:
            msg["reasoning_content"] = "\n"  # keeps the empty think block the generation prompt added
        return msg

    # -- token contract -------------------------------------------------------------------------
    @property
    def thinks(self) -> bool:
        """Whether the model writes its own `<think>` block each turn."""
        return self.enable_thinking is not False

    def model_turn_ids(self, turn: ModelTurn) -> list[int]:
        return self.template.encode(self.format_turn(turn) + END_OF_TURN)

    def reference_ids(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec],
                      steps: Sequence[ModelTurn | Sequence[ToolResult]]) -> list[int]:
        conv = conversation(messages, steps, self.assistant_message, "tool")
        return self.template.reference_ids(conv, openai_tools(tools), END_OF_TURN)
