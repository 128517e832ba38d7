"""A small workflow as a tool: an async function of the arguments, other tools, and a model.

    async def research(args, tools, model):
        hits = await tools.call("search", {"query": args["task"]})
        return await model(f"Summarise for the question {args['task']!r}:\n{hits.text}")

    agent = AgentTool("research", "Search and summarise.", research, model=ModelTool(...))

The runner that holds the agent binds itself to it, so `tools.call` reaches every other tool of
that runner (with their limits, timeouts and cache); an agent cannot call itself.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Protocol, Sequence, runtime_checkable

from rlfactory.tools.base import ERROR, UNKNOWN_TOOL, ToolCall, ToolResult, ToolSpec
from rlfactory.tools.function import result_from_value

ModelFn = Callable[[Any], Awaitable[str]]
"""A model as an async function: prompt (str or chat messages) -> answer text."""


@runtime_checkable
class Completes(Protocol):
    """A model object whose `complete` is a ModelFn (ModelTool)."""

    async def complete(self, prompt: Any) -> str:
        ...

Workflow = Callable[[dict[str, Any], "ToolHandle", "ModelFn | None"], Awaitable[Any]]

_DEFAULT_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"task": {"type": "string", "description": "What the agent should do."}},
    "required": ["task"],
}


class ToolHandle:
    """What a workflow sees of the runner: call a tool by name, list the tools it may use."""

    def __init__(self, runner: Any, owner: str, allowed: Sequence[str] | None = None) -> None:
        self._runner = runner
        self._owner = owner
        self._allowed = set(allowed) if allowed is not None else None

    async def call(self, name: str, arguments: dict[str, Any] | None = None, **kwargs: Any) -> ToolResult:
        """Call another tool; like every call, it returns a result and never raises for the tool's sake."""
        if name == self._owner or (self._allowed is not None and name not in self._allowed):
            return ToolResult.error(f"agent {self._owner!r} may not call tool {name!r}", UNKNOWN_TOOL)
        return await self._runner._call(ToolCall(name, {**(arguments or {}), **kwargs}), nested=True)

    def specs(self) -> list[ToolSpec]:
        return [
            s
            for s in self._runner.specs()
            if s.name != self._owner and (self._allowed is None or s.name in self._allowed)
        ]


class AgentTool:
    """A workflow behind the `Tool` protocol. `model` is an async prompt->text function or a `ModelTool`."""

    def __init__(
        self,
        name: str,
        description: str,
        workflow: Workflow,
        parameters: dict[str, Any] | None = None,
        *,
        model: Completes | ModelFn | None = None,
        tools: Sequence[str] | None = None,
        timeout_s: float | None = None,
        cache: bool | None = False,
        max_concurrency: int | None = None,
    ) -> None:
        self.name = name
        self.description = description
        self.parameters = parameters or dict(_DEFAULT_PARAMETERS)
        self.workflow = workflow
        self.model_fn: ModelFn | None = model.complete if isinstance(model, Completes) else model
        self.allowed_tools = list(tools) if tools is not None else None
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self.cache = cache
        self._handle: ToolHandle | None = None

    def bind_runner(self, runner: Any) -> None:
        """Called by the `ToolRunner` that holds this tool."""
        self._handle = ToolHandle(runner, self.name, self.allowed_tools)

    async def call(self, arguments: dict[str, Any]) -> ToolResult:
        if self._handle is None:
            return ToolResult.error(f"agent tool {self.name!r} is not attached to a ToolRunner", ERROR)
        try:
            value = await self.workflow(arguments, self._handle, self.model_fn)
        except Exception as e:
            return ToolResult.error(f"agent {self.name!r} failed: {type(e).__name__}: {e}", ERROR)
        return result_from_value(value)
