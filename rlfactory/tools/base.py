"""The tool contract: what every tool is, what a call is, and what a call returns.

Everything in rlfactory that runs a tool speaks these types. A tool error is a `ToolResult`
with `is_error=True` that the model reads as an observation; it is never an exception in the
training loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rlfactory.images import Image

# Status of one call, as recorded on results and trajectories.
OK = "ok"
ERROR = "error"  # the tool ran and reported an error of its own
TIMEOUT = "timeout"  # the call ran out of its timeout; its server (if any) was still talking
UNRESPONSIVE = "unresponsive"  # the call ran out of its timeout and its MCP server sent nothing at all meanwhile
INVALID_ARGUMENTS = "invalid_arguments"
UNKNOWN_TOOL = "unknown_tool"
CRASHED = "crashed"  # transport failure / server died and could not be recovered
CIRCUIT_OPEN = "circuit_open"
MALFORMED = "malformed"  # the model's text could not be parsed into a call
NOT_RUN = "not_run"  # the turn asked for more calls than rollout.max_calls_per_turn; this one was not run


@dataclass
class ToolCall:
    """One call the model asked for."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass
class ToolResult:
    """What a call returned. `text` is what the model sees."""

    text: str
    is_error: bool = False
    status: str = OK
    data: Any = None  # structured content, when the tool gives any
    images: list[Image] = field(default_factory=list)
    """The pictures the tool returned, in order (rlfactory/images.py); `text` holds a short note
    for each (`[image image/png]`), which is all a text-only model sees of them."""
    cached: bool = False
    latency_s: float = 0.0
    truncated: bool = False
    replaced_chars: int = 0
    """Characters of the tool's text that were not valid Unicode (lone surrogates, invalid UTF-8)
    and were replaced by U+FFFD before anything encoded it (rlfactory/text.py)."""
    reward: float | None = None
    """A score of this call for the turn that made it (a process reward), given by the tool with its
    result or set by an env's `step()` (RL-Factory's step reward); None = no score. The rollout
    records the turn's sum as that model segment's `step` reward term."""

    @classmethod
    def error(cls, text: str, status: str = ERROR) -> "ToolResult":
        return cls(text=text, is_error=True, status=status)


@dataclass(frozen=True)
class ToolSpec:
    """What a model is told about a tool."""

    name: str
    description: str
    parameters: dict[str, Any]

    def openai_schema(self) -> dict[str, Any]:
        """The `{"type": "function", "function": {...}}` form that chat templates take."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@runtime_checkable
class Tool(Protocol):
    """A callable tool. `parameters` is a JSON schema of the arguments object."""

    name: str
    description: str
    parameters: dict[str, Any]

    async def call(self, arguments: dict[str, Any]) -> ToolResult: ...


def spec_of(tool: Tool) -> ToolSpec:
    return ToolSpec(tool.name, tool.description, tool.parameters)


class TransportError(Exception):
    """The channel to a tool failed (connection lost, server died), as opposed to the tool's own error.

    Tools raise this instead of returning an error result; the runner retries it with backoff when
    `retryable`, and otherwise turns it into a result with `status`.
    """

    def __init__(self, message: str, *, retryable: bool = True, status: str = CRASHED) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status
