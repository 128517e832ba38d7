"""`template` ToolManager: any chat model, worked from its tokenizer's own chat template.

At construction the template is probed (rlfactory/chat/template_probe.py): the token that ends an
assistant turn, whether it renders tools, tool calls, tool results and reasoning, and the call
format its rendering of a call shows (or `call_format` from config: hermes, hermes_list,
llama3_json, mistral; see rlfactory/chat/call_formats.py).

- Prompts are the template's rendering of the messages, tools passed as `tools=` (OpenAI schemas).
- A model turn's tokens are what the template renders for that assistant message (cut between the
  generation prompt and the end-of-turn token), so a model trained on them writes exactly what
  the template would show; `parse` reads them back in the detected call format.
- Observation ids are the exact delta the template adds after an assistant turn for the tool
  message(s) plus the next assistant header (`ChatTemplate.delta_after_turn`).
The token-contract checker (contract.py) verifies at start-up that these pieces concatenate to the
template's rendering of a whole sample conversation; a template that re-renders earlier turns
(e.g. one that writes call ids into tool results) fails there, naming the model and the first
differing token: pick a named family or a `module:Class` for it.

Templates that ignore tools (SmolLM2-135M/360M-Instruct: plain ChatML that prints a `tool` role
verbatim) are used in *injected* mode: the tool list goes into the system prompt as

    {system prompt}

    # Tools

    You may call one or more functions to assist with the user query.
    You are provided with function signatures within <tools></tools> XML tags:
    <tools>
    {"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}
    </tools>

    For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
    <tool_call>
    {"name": <function-name>, "arguments": <args-json-object>}
    </tool_call>

(the Hermes / Qwen2.5 wording; `{system prompt}` and its blank line are left out when there is
none), calls are written in the `hermes` format (or the configured one) as the assistant's text,
and tool results come back in a user turn, one `<tool_response>\\n...\\n</tool_response>` block per
result, separated by newlines. Such a model can be taught to use tools by SFT and RL.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any, Literal

from rlfactory.chat.base import Answer, Malformed, ParseResult, ToolCalls
from rlfactory.chat.call_formats import get_format
from rlfactory.chat.parsing import answer_text, split_reasoning, unknown_tool_reason
from rlfactory.chat.template import ChatTemplate, ModelTurn, openai_tool_calls, openai_tools
from rlfactory.chat.template_probe import probe_template
from rlfactory.tools.base import ToolCall, ToolResult, ToolSpec

TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
    "</tool_call>"
)
TOOLS_FOOTER_LIST = (
    "\n</tools>\n\nTo call functions, return a json list of objects with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>[{\"name\": <function-name>, \"arguments\": <args-json-object>}]"
    "</tool_call>"
)


def injected_tools_text(tools: Sequence[ToolSpec], call_format: str = "hermes") -> str:
    """The tool list as the system-prompt text of injected mode (see the module docstring)."""
    lines = "\n".join(json.dumps(t.openai_schema(), ensure_ascii=False) for t in tools)
    return TOOLS_HEADER + lines + (TOOLS_FOOTER_LIST if call_format == "hermes_list" else TOOLS_FOOTER)


def tool_response_text(results: Sequence[ToolResult]) -> str:
    """Tool results as one user turn's text in injected mode."""
    return "\n".join(f"<tool_response>\n{r.text}\n</tool_response>" for r in results)


class TemplateToolManager:
    """ToolManager that follows the tokenizer's own chat template (see the module docstring)."""

    family = "template"

    def __init__(
        self,
        tokenizer: Any,
        *,
        call_format: str = "auto",
        template_kwargs: dict[str, Any] | None = None,
        chat_template: str | None = None,
        tools_in: Literal["auto", "template", "system"] = "auto",
        end_of_turn: str | None = None,
        known_tools: Collection[str] | None = None,
        trailing_text: Literal["allow", "malformed"] = "allow",
        model_name: str | None = None,
    ):
        """`call_format`: auto (from the template; hermes when it shows none) or a format name.
        `template_kwargs`: extra template variables (e.g. enable_thinking). `tools_in`: auto (the
        template's own tool rendering when it has one), template, or system (injected mode).
        `end_of_turn`: the turn-ending token when the template does not make it clear."""
        self.tokenizer = tokenizer
        self.model_name = model_name or getattr(tokenizer, "name_or_path", "") or ""
        self._who = self.model_name or "this model"
        self.template = ChatTemplate(tokenizer, chat_template, **(template_kwargs or {}))
        self.profile = probe_template(self.template, end_of_turn)
        if tools_in == "auto":
            tools_in = "template" if self.profile.renders_tools else "system"
        if tools_in == "template" and not self.profile.renders_tools:
            raise ValueError(f"{self._who}: its chat template does not render tools; use tools_in: system")
        self.injected = tools_in == "system"
        name = call_format if call_format != "auto" else (self.profile.call_format or "hermes")
        self.call_format = get_format(name)
        # Structured calls go through the template only when it renders them in this very format.
        self._native_calls = (not self.injected and self.profile.renders_calls
                              and self.profile.call_format == self.call_format.name)
        self.end_of_turn = self.profile.end_of_turn
        self.known_tools = set(known_tools) if known_tools is not None else None
        self.trailing_text = trailing_text

    # -- ToolManager protocol --------------------------------------------------------------
    def render_prompt(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec]) -> list[int]:
        return self.template.encode(self.render_prompt_text(messages, tools))

    def render_prompt_text(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec]) -> str:
        return self.render_text(messages, tools, add_generation_prompt=True)

    def parse(self, text: str, known_tools: Collection[str] | None = None) -> ParseResult:
        if self.end_of_turn and text.endswith(self.end_of_turn):
            text = text[: -len(self.end_of_turn)]
        _, visible = split_reasoning(text, protect=self.call_format.protect)
        found = self.call_format.parse(visible)
        if found is None:
            return Answer(answer_text(visible))
        if isinstance(found, str):
            return Malformed(found)
        unknown = unknown_tool_reason(found.calls, known_tools if known_tools is not None else self.known_tools)
        if unknown:
            return Malformed(unknown)
        if found.trailing and self.trailing_text == "malformed":
            return Malformed("text after the tool call; end the turn after your tool calls")
        return ToolCalls(found.calls, text=found.text)

    def render_observation(self, results: Sequence[ToolResult]) -> list[int]:
        return self.template.encode(self.observation_text(results))

    def render_user_turn(self, text: str) -> list[int]:
        # A plain user message renders the same in native and injected mode (only assistant calls
        # and tool results differ), so the template's own rendering is the delta.
        return self.template.encode(self.template.user_turn_text(text, self.end_of_turn))

    def stop_token_ids(self) -> list[int]:
        names = [self.end_of_turn, getattr(self.tokenizer, "eos_token", None)]
        ids = {i for i in (self.template.token_id(n) for n in names) if i is not None}
        eos = getattr(self.tokenizer, "eos_token_id", None)
        ids |= set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        return sorted(ids)

    def stop_strings(self) -> list[str]:
        return []

    # -- rendering ----------------------------------------------------------------------------
    def render_text(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec] | None,
                    add_generation_prompt: bool = False) -> str:
        """The template's text for `messages` (OpenAI-style: assistant `tool_calls`, `tool` results)."""
        if not self.injected:
            return self.template.render(self._native_messages(messages), openai_tools(tools), add_generation_prompt)
        return self.template.render(self._injected_messages(messages, tools), None, add_generation_prompt)

    def _native_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Assistant calls the template cannot render in the model's format become text."""
        if self._native_calls and self.profile.multi_calls:
            return messages
        out = []
        for m in messages:
            calls = m.get("tool_calls") if m.get("role") == "assistant" else None
            if calls and not (self._native_calls and len(calls) == 1):
                m = self._as_text(m)
            out.append(m)
        return out

    def _injected_messages(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec] | None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        pending: list[ToolResult] = []
        for m in messages:
            if m.get("role") == "tool":
                pending.append(ToolResult(text=str(m.get("content", ""))))
                continue
            if pending:
                out.append({"role": "user", "content": tool_response_text(pending)})
                pending = []
            out.append(self._as_text(m) if m.get("role") == "assistant" and m.get("tool_calls") else m)
        if pending:
            out.append({"role": "user", "content": tool_response_text(pending)})
        if tools:
            text = injected_tools_text(tools, self.call_format.name)
            if out and out[0].get("role") == "system":
                out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}"}
            else:
                out.insert(0, {"role": "system", "content": text})
        return out

    def _as_text(self, message: dict[str, Any]) -> dict[str, Any]:
        calls = [ToolCall(c["function"]["name"], _arguments(c["function"].get("arguments")), c.get("id"))
                 for c in message["tool_calls"]]
        turn = ModelTurn(calls, message.get("content") or "")
        out = {k: v for k, v in message.items() if k != "tool_calls"}
        out["content"] = self.text_with_calls(turn)
        return out

    def text_with_calls(self, turn: ModelTurn) -> str:
        """The turn's content followed by its calls in the call format (no reasoning)."""
        calls = self.call_format.format_calls(turn.calls) if turn.calls else ""
        return "\n".join(p for p in (turn.content, calls) if p)

    def observation_text(self, results: Sequence[ToolResult]) -> str:
        """The text of `render_observation`: tool turn(s) plus the next assistant header."""
        # Reasoning on the context turn, where the template renders any: some (Qwen3) render the last
        # assistant turn differently from earlier ones when it has none.
        reasoning = "." if self.profile.renders_reasoning else None
        context = [{"role": "user", "content": "?"}, self.assistant_message(ModelTurn([ToolCall("f", {})], reasoning=reasoning))]
        if self.injected:
            added = [{"role": "user", "content": tool_response_text(results)}]
        else:
            added = [{"role": "tool", "content": r.text} for r in results]
        return self.delta_after_turn(context, added)

    def delta_after_turn(self, context: list[dict[str, Any]], added: list[dict[str, Any]]) -> str:
        base = self.render_text(context, None)
        cut = base.rfind(self.end_of_turn)
        if cut == -1:
            raise ValueError(f"{self._who}: the chat template does not end an assistant turn with "
                             f"{self.end_of_turn!r}")
        cut += len(self.end_of_turn)
        full = self.render_text(context + added, None, add_generation_prompt=True)
        if full[:cut] != base[:cut]:
            raise ValueError(f"{self._who}: the chat template re-renders earlier turns when tool results "
                             "follow; observation ids cannot be a pure delta")
        return full[cut:]

    def assistant_message(self, turn: ModelTurn) -> dict[str, Any]:
        """`turn` as an OpenAI-style chat message."""
        msg: dict[str, Any] = {"role": "assistant", "content": turn.content}
        if turn.calls:
            msg["tool_calls"] = openai_tool_calls(turn.calls)
        if turn.reasoning is not None:
            msg["reasoning_content"] = turn.reasoning
        return msg

    def format_turn(self, turn: ModelTurn) -> str:
        """What the model writes for `turn` (without the end-of-turn token): the template's own
        rendering of the assistant message, between the generation prompt and the end of turn."""
        context = [{"role": "user", "content": "?"}]
        prefix = self.render_text(context, None, add_generation_prompt=True)
        full = self.render_text(context + [self.assistant_message(turn)], None)
        if not full.startswith(prefix):
            raise ValueError(f"{self._who}: the chat template renders an assistant turn differently from "
                             "its own generation prompt")
        body = full[len(prefix):]
        end = body.rfind(self.end_of_turn)
        if end == -1:
            raise ValueError(f"{self._who}: the chat template does not end an assistant turn with "
                             f"{self.end_of_turn!r}")
        return body[:end]

    # -- token contract -------------------------------------------------------------------------
    @property
    def thinks(self) -> bool:
        """Whether sample turns carry reasoning (the template renders it and thinking is not off)."""
        return self.profile.renders_reasoning and self.template.template_kwargs.get("enable_thinking") is not False

    def model_turn_ids(self, turn: ModelTurn) -> list[int]:
        return self.template.encode(self.format_turn(turn)) + self.template.encode(self.end_of_turn)

    def reference_ids(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec],
                      steps: Sequence[ModelTurn | Sequence[ToolResult]]) -> list[int]:
        conv = list(messages)
        for step in steps:
            if isinstance(step, ModelTurn):
                conv.append(self.assistant_message(step))
            else:
                conv.extend({"role": "tool", "content": r.text} for r in step)
        text = self.render_text(conv, tools)
        cut = text.rfind(self.end_of_turn)
        return self.template.encode(text[: cut + len(self.end_of_turn)] if cut != -1 else text)


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, str):
        try:
            value = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}
    return dict(raw or {})
