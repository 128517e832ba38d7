"""The tool contract: what every tool is, what a call is, and what a call returns.

Everything in rlfactory that runs a tool speaks these types: `Tool` (name, description, JSON-schema
`parameters`, `call`) and what a tool may offer besides, each a Protocol checked with `isinstance`:
`CallOptions` (its own timeout, concurrency and cache defaults), `UsesRunner` (`bind_runner`),
`ClosesAsync` (`aclose`). The package imports only the bottom, so every layer may name them. A tool error is a `ToolResult`
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


@runtime_checkable
class CallOptions(Protocol):
    """A tool that carries its own defaults for how the ToolRunner calls it (FunctionTool, MCPTool,
    ModelTool, AgentTool do). `tools.per_tool.<name>` overrides each; None (or a tool without
    them) leaves it to the `tools:` section."""

    timeout_s: float | None
    """Seconds a call may take, retries included."""
    max_concurrency: int | None
    """Calls of this tool running at once."""
    cache: bool | None
    """Whether results are cached (False for tools whose answer may change between calls)."""


@runtime_checkable
class UsesRunner(Protocol):
    """A tool that calls other tools through the runner that holds it (AgentTool)."""

    def bind_runner(self, runner: Any) -> None:
        """Called once by the ToolRunner the tool is given to (`runner`: that ToolRunner)."""
        ...


@runtime_checkable
class ClosesAsync(Protocol):
    """A tool that holds something to release (a client, a process); the runner closes it last."""

    async def aclose(self) -> None:
        ...


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
