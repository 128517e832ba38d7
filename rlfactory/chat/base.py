"""The ToolManager contract: render a prompt, parse a response, render observations.

See DESIGN.md "ToolManager". Observation ids are the exact delta the chat template adds for the
tool turn(s) plus the next assistant header, so that prompt + model + observation + model ...
equals the template's rendering of the whole conversation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, Union, runtime_checkable

from rlfactory.chat.template import ChatTemplate
from rlfactory.tools.base import ToolCall, ToolResult, ToolSpec


@dataclass
class Answer:
    """The model gave its final answer; `text` is the answer content (tags stripped)."""

    text: str


@dataclass
class ToolCalls:
    """The model asked for one or more tool calls."""

    calls: list[ToolCall]
    text: str = ""  # the model's visible text outside the calls (reasoning excluded); may be empty


@dataclass
class Malformed:
    """The model tried to call a tool but the call cannot be run; `reason` is shown to the model."""

    reason: str


ParseResult = Union[Answer, ToolCalls, Malformed]


class ToolManager(Protocol):
    """One per model family (qwen3, llama3, searchr1, or a user's `module:Class`)."""

    family: str

    def render_prompt(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec]) -> list[int]:
        """Token ids of the conversation so far plus the assistant header the model continues."""
        ...

    def parse(self, text: str) -> ParseResult:
        """The model turn `text` as an answer, tool calls or a malformed attempt. Never raises, and
        runs in time linear in `len(text)` (build on `rlfactory.chat.parsing`'s helpers)."""
        ...

    def render_observation(self, results: Sequence[ToolResult]) -> list[int]:
        """Ids of the tool turn(s) for `results` plus the next assistant header."""
        ...

    def stop_token_ids(self) -> list[int]:
        """Token ids that end a model turn (end of turn, eos)."""
        ...

    def stop_strings(self) -> list[str]:
        """Strings that end a model turn early (e.g. `</search>` for searchr1); often empty."""
        ...


@runtime_checkable
class PromptTextRenderer(Protocol):
    """A ToolManager whose prompt ids are its chat template's text, encoded: qwen3, llama3, searchr1
    and template are. The recording gateway renders the text and encodes only what earlier calls
    did not (serve/gateway_prefix.py)."""

    template: ChatTemplate

    def render_prompt_text(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec]) -> str:
        """The text `render_prompt` encodes: `render_prompt(m, t) == template.encode(render_prompt_text(m, t))`."""
        ...


@runtime_checkable
class UserTurnRenderer(Protocol):
    """A ToolManager that can also render a user message in the middle of an episode (an env's
    `next_user_turn`): qwen3, llama3 and template do."""

    def render_user_turn(self, text: str) -> list[int]:
        """Ids of a user turn holding `text` plus the next assistant header: the exact delta the chat
        template adds after an assistant turn's end, as `render_observation` is for tool turns."""
        ...
