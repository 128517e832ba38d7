"""Program tools: a typed Python function (sync or async) becomes a `Tool`.

The JSON schema of the arguments comes from the type hints (through pydantic) and the parameter
descriptions from the docstring (Google `Args:` or numpy `Parameters` sections). Whatever the
function raises becomes an error result the model reads; it never propagates.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from rlfactory.images import Image, ImageError, image_from_value, is_image_value
from rlfactory.tools.base import ERROR, INVALID_ARGUMENTS, ToolResult, TransportError

log = logging.getLogger("rlfactory.tools")

_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Params|Returns?|Yields?|Raises|Examples?|Notes?|See Also)\s*:?\s*$")
_GOOGLE_PARAM = re.compile(r"^\s*\**(\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")
_NUMPY_PARAM = re.compile(r"^\s*(\w+)\s*(?::\s*(.*))?$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into (description, {param: description}); Google or numpy style."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    numpy = False
    current: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _SECTION.match(line)
        underline = i + 1 < len(lines) and bool(lines[i + 1].strip()) and set(lines[i + 1].strip()) == {"-"}
        if m and (line.rstrip().endswith(":") or underline):
            section, numpy, current = m.group(1).lower(), underline, None
            i += 2 if underline else 1
            continue
        if section is None:
            summary.append(line)
        elif section in ("args", "arguments", "parameters", "params") and line.strip():
            at_base = len(line) - len(line.lstrip()) <= _base_indent(lines, i)
            gm = _GOOGLE_PARAM.match(line)
            nm = _NUMPY_PARAM.match(line)
            if at_base and numpy and nm:
                current = nm.group(1)
                params[current] = ""
            elif at_base and not numpy and gm:
                current = gm.group(1)
                params[current] = gm.group(3).strip()
            elif current is not None:
                params[current] = (params[current] + " " + line.strip()).strip()
        i += 1
    return "\n".join(summary).strip(), params


def _base_indent(lines: list[str], i: int) -> int:
    """Indent of the first non-empty line of the section that holds line `i`."""
    j = i
    while j > 0 and not _SECTION.match(lines[j - 1]) and not set(lines[j - 1].strip()) == {"-"}:
        j -= 1
    for line in lines[j : i + 1]:
        if line.strip():
            return len(line) - len(line.lstrip())
    return 0


def _strip_titles(schema: Any) -> Any:
    """Drop pydantic's auto-generated `title` keys (noise in a prompt), keep everything else."""
    if isinstance(schema, dict):
        out = {}
        for k, v in schema.items():
            if k == "title" and isinstance(v, str):
                continue
            if k == "properties" and isinstance(v, dict):
                out[k] = {name: _strip_titles(p) for name, p in v.items()}
            else:
                out[k] = _strip_titles(v)
        return out
    if isinstance(schema, list):
        return [_strip_titles(x) for x in schema]
    return schema


def result_from_value(value: Any) -> ToolResult:
    """Turn whatever a tool function returned into a result: text for the model, data when
    structured, images when it returned a picture (a PIL image, PNG/JPEG bytes, a numpy array, an
    `Image`) or a list mixing text and pictures. A value that claims to be a picture but cannot be
    read is an error result saying why."""
    if isinstance(value, ToolResult):
        return value
    if value is None:
        return ToolResult(text="")
    if isinstance(value, str):
        return ToolResult(text=value)
    if isinstance(value, (bytes, bytearray, memoryview)) or is_image_value(value):
        return _pictures([value])
    if isinstance(value, (list, tuple)) and any(is_image_value(v) for v in value):
        return _pictures(list(value))
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, (dict, list, tuple, int, float, bool)):
        try:
            return ToolResult(text=json.dumps(value, ensure_ascii=False, default=str), data=value)
        except (TypeError, ValueError):
            pass
    return ToolResult(text=str(value))


def _pictures(values: list[Any]) -> ToolResult:
    """Text parts and pictures in order: the text joins the parts, a note standing for each picture."""
    parts: list[str] = []
    images: list[Image] = []
    for i, v in enumerate(values):
        if isinstance(v, str):
            parts.append(v)
            continue
        try:
            images.append(image_from_value(v))
        except ImageError as e:
            where = f"part {i + 1} of the result" if len(values) > 1 else "the result"
            return ToolResult.error(f"the tool returned an image that cannot be shown ({where}): {e}", ERROR)
        parts.append(images[-1].note())
    return ToolResult(text="\n".join(parts), images=images)


@dataclass
class FunctionTool:
    """A Python function behind the `Tool` protocol. Build one with `function_tool`."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    args_model: type[BaseModel]
    is_async: bool
    run_in_thread: bool = True
    timeout_s: float | None = None
    max_concurrency: int | None = None
    cache: bool | None = None
    _names: tuple[str, ...] = field(default=())

    async def call(self, arguments: dict[str, Any]) -> ToolResult:
        try:
            parsed = self.args_model.model_validate(arguments)
        except ValidationError as e:
            errs = "; ".join(f"{'.'.join(map(str, x['loc'])) or '(arguments)'}: {x['msg']}" for x in e.errors())
            return ToolResult.error(f"invalid arguments for tool {self.name!r}: {errs}", INVALID_ARGUMENTS)
        kwargs = {k: getattr(parsed, k) for k in self._names}
        try:
            if self.is_async:
                value = await self.fn(**kwargs)
            elif self.run_in_thread:
                value = await asyncio.to_thread(functools.partial(self.fn, **kwargs))
            else:
                value = self.fn(**kwargs)
        except TransportError:
            raise  # the channel failed, not the tool: the runner retries it
        except Exception as e:  # the tool's own failure is an observation, never an exception
            return ToolResult.error(f"{type(e).__name__}: {e}", ERROR)
        return result_from_value(value)


def function_tool(
    fn: Callable[..., Any],
    name: str | None = None,
    description: str | None = None,
    *,
    timeout_s: float | None = None,
    max_concurrency: int | None = None,
    cache: bool | None = None,
    run_in_thread: bool = True,
) -> FunctionTool:
    """Make a tool of a typed function (sync or async).

    The schema is built from the type hints; parameter descriptions come from the docstring's
    `Args:` (Google) or `Parameters` (numpy) section, the tool description from its summary.
    Sync functions run in a worker thread (`run_in_thread`) so they never block the event loop.
    `timeout_s`, `max_concurrency` and `cache` are this tool's defaults for the runner.
    """
    if isinstance(fn, FunctionTool):
        return fn
    target = inspect.unwrap(fn)
    summary, param_docs = parse_docstring(inspect.getdoc(target))
    try:
        hints = _type_hints(target)
    except Exception as e:
        raise TypeError(f"function_tool({getattr(fn, '__name__', fn)!r}): cannot read type hints: {e}") from e
    fields: dict[str, Any] = {}
    names: list[str] = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.kind == p.POSITIONAL_ONLY:
            raise TypeError(f"function_tool({fn.__name__!r}): positional-only parameter {p.name!r} cannot be a tool argument")
        annotation = hints.get(p.name, Any)
        default = ... if p.default is p.empty else p.default
        fields[p.name] = (annotation, Field(default, description=param_docs.get(p.name) or None))
        names.append(p.name)
    tool_name = name or getattr(fn, "__name__", None) or type(fn).__name__
    try:
        model = create_model(
            f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=False), **fields
        )
        schema = _strip_titles(model.model_json_schema())
    except Exception as e:
        raise TypeError(f"function_tool({tool_name!r}): cannot build a JSON schema from the type hints: {e}") from e
    schema.setdefault("properties", {})
    schema["additionalProperties"] = False
    _warn_if_undescribed(fn, tool_name, [n for n in names if n not in hints], description is None and not summary)
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))
    return FunctionTool(
        name=tool_name,
        description=description if description is not None else summary,
        parameters=schema,
        fn=fn,
        args_model=model,
        is_async=is_async,
        run_in_thread=run_in_thread,
        timeout_s=timeout_s,
        max_concurrency=max_concurrency,
        cache=cache,
        _names=tuple(names),
    )


_warned: set[tuple[str, str]] = set()


def _warn_if_undescribed(fn: Callable[..., Any], tool_name: str, untyped: list[str], no_docstring: bool) -> None:
    """One warning line per function whose prompt would say `any` or nothing (the model reads it)."""
    key = (getattr(fn, "__module__", "?") or "?", getattr(fn, "__qualname__", tool_name))
    if not (untyped or no_docstring) or key in _warned:
        return
    _warned.add(key)
    gaps = []
    if untyped:
        gaps.append(f"no type hint on {', '.join(untyped)} (the model sees `any`)")
    if no_docstring:
        gaps.append("no docstring (the model sees no description)")
    log.warning("python tool %r (%s:%s): %s", tool_name, key[0], key[1], "; ".join(gaps))


def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    import typing

    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else getattr(fn, "__call__", fn)
    return typing.get_type_hints(target, include_extras=True)
