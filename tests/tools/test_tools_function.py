import asyncio
import threading
from typing import Literal

import pytest
from pydantic import BaseModel

from rlfactory.tools import ERROR, INVALID_ARGUMENTS, Tool, ToolResult, function_tool
from rlfactory.tools.function import parse_docstring


def add(a: int, b: float = 2.0, mode: Literal["sum", "diff"] = "sum") -> float:
    """Add two numbers.

    Args:
        a: The first number,
            continued on a second line.
        b (float): The second number.
        mode: How to combine them.

    Returns:
        The result.
    """
    return a + b if mode == "sum" else a - b


async def search(query: str, k: int = 3) -> list[str]:
    """Search the corpus.

    Parameters
    ----------
    query : str
        What to look for.
    k : int
        How many hits.
    """
    await asyncio.sleep(0)
    return [f"{query}-{i}" for i in range(k)]


class Point(BaseModel):
    x: float
    y: float


def norm(p: Point) -> float:
    """Length of a point vector."""
    return (p.x**2 + p.y**2) ** 0.5


def test_schema_from_hints_and_google_docstring():
    t = function_tool(add)
    assert isinstance(t, Tool)
    assert t.name == "add" and t.description == "Add two numbers."
    props = t.parameters["properties"]
    assert t.parameters["type"] == "object" and t.parameters["required"] == ["a"]
    assert props["a"] == {"type": "integer", "description": "The first number, continued on a second line."}
    assert props["b"]["type"] == "number" and props["b"]["default"] == 2.0 and props["b"]["description"] == "The second number."
    assert props["mode"]["enum"] == ["sum", "diff"]
    assert t.parameters["additionalProperties"] is False


def test_numpy_docstring_and_async_function():
    t = function_tool(search)
    assert t.description == "Search the corpus."
    assert t.parameters["properties"]["query"]["description"] == "What to look for."
    assert t.parameters["properties"]["k"]["description"] == "How many hits."
    r = asyncio.run(t.call({"query": "q", "k": 2}))
    assert r.text == '["q-0", "q-1"]' and r.data == ["q-0", "q-1"] and not r.is_error


def test_sync_function_runs_off_the_event_loop_thread():
    seen = []

    def where() -> str:
        """Report the thread."""
        seen.append(threading.get_ident())
        return "ok"

    assert asyncio.run(function_tool(where).call({})).text == "ok"
    assert seen and seen[0] != threading.get_ident()


def test_name_description_override_and_nested_model():
    t = function_tool(norm, name="length", description="Vector length.")
    assert (t.name, t.description) == ("length", "Vector length.")
    assert "p" in t.parameters["required"]
    assert asyncio.run(t.call({"p": {"x": 3, "y": 4}})).text == "5.0"


def test_exceptions_and_bad_arguments_become_error_results():
    def boom(x: int) -> int:
        """Always fails."""
        raise RuntimeError("kaput")

    t = function_tool(boom)
    r = asyncio.run(t.call({"x": 1}))
    assert r.is_error and r.status == ERROR and "RuntimeError: kaput" in r.text
    r = asyncio.run(t.call({"x": "not a number"}))
    assert r.is_error and r.status == INVALID_ARGUMENTS and "x" in r.text


def test_tool_result_passthrough_and_none():
    async def custom() -> ToolResult:
        """Custom result."""
        return ToolResult(text="hi", data={"k": 1})

    def nothing() -> None:
        """Nothing."""

    assert asyncio.run(function_tool(custom).call({})).data == {"k": 1}
    assert asyncio.run(function_tool(nothing).call({})).text == ""


def test_unusable_signatures_are_rejected_at_definition():
    def positional_only(a: int, /) -> int:
        return a

    with pytest.raises(TypeError, match="positional-only"):
        function_tool(positional_only)


def test_parse_docstring_without_sections():
    assert parse_docstring("Just a line.") == ("Just a line.", {})
    assert parse_docstring(None) == ("", {})


def test_a_function_without_hints_or_docstring_is_warned_about_once(caplog):
    def bare_lookup(query, k: int = 3):
        return query

    def bare_doc(query: str):
        return query

    with caplog.at_level("WARNING", logger="rlfactory.tools"):
        tool = function_tool(bare_lookup)
        function_tool(bare_lookup)  # the same function again: no second warning
        function_tool(bare_doc)
        function_tool(add)  # typed and documented: nothing to say
    assert tool.parameters["properties"]["query"] == {}  # what the model would see as `any`
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"python tool 'bare_lookup' ({__name__}:test_a_function_without_hints_or_docstring_is_warned_about_once."
        "<locals>.bare_lookup): no type hint on query (the model sees `any`); no docstring (the model sees no "
        "description)",
        f"python tool 'bare_doc' ({__name__}:test_a_function_without_hints_or_docstring_is_warned_about_once."
        "<locals>.bare_doc): no docstring (the model sees no description)",
    ]
