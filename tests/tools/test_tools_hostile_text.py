"""Hostile text and shapes at the tool boundary: results that are not valid Unicode, arguments
nested past any schema's patience, and the ToolRunner's promise never to raise."""

import asyncio
import json
import time

from rlfactory.config import ToolsConfig
from rlfactory.tools import INVALID_ARGUMENTS, OK, ToolCall, ToolResult, ToolRunner
from rlfactory.tools.validation import MAX_ARGUMENT_DEPTH, ArgumentValidator

RECURSIVE = {
    "$ref": "#/$defs/node",
    "$defs": {"node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/node"}, "v": {"type": "integer"}}}},
}


def nested(depth: int, leaf=1) -> dict:
    value = {"v": leaf}
    for _ in range(depth - 1):
        value = {"child": value}
    return value


class Tree:
    name = "tree"
    description = "takes a tree"
    parameters = RECURSIVE

    async def call(self, arguments):
        return ToolResult("took it")


class Broken:
    """A tool whose text is broken in each way a tool can break it."""

    name = "broken"
    description = "returns text that is not valid Unicode"
    parameters = {"type": "object", "properties": {"mode": {"type": "string"}}}

    async def call(self, arguments):
        mode = arguments["mode"]
        if mode == "surrogate":  # what json.loads makes of "\ud83d" (half an emoji)
            return ToolResult(json.loads('"broken \\ud83d emoji, NUL \\u0000 stays"'))
        if mode == "pair":  # a pair held as two code points: one character once joined
            return ToolResult("\ud83d\ude00")
        if mode == "bytes":  # invalid UTF-8
            return ToolResult(b"ok \xff\xfe end")  # type: ignore[arg-type]
        if mode == "error":
            return ToolResult.error("failed with \udcff in its message")
        raise ValueError(f"raised with \ud800 in its message {mode}")


def py_surrogate(n: int) -> str:
    """Returns n lone surrogates.

    Args:
        n: How many.
    """
    return "x" + "\ud800" * n


def test_results_are_made_valid_text_and_counted():
    async def main():
        async with ToolRunner([Broken(), py_surrogate]) as r:
            modes = ["surrogate", "pair", "bytes", "error", "raise"]
            res = await r.run([ToolCall("broken", {"mode": m}) for m in modes] + [ToolCall("py_surrogate", {"n": 3})])
            for x in res:
                x.text.encode("utf-8")  # every text encodes
            surrogate, pair, raw, error, raised, py = res
            assert surrogate.text == "broken \ufffd emoji, NUL \x00 stays" and surrogate.replaced_chars == 1
            assert surrogate.status == OK
            assert pair.text == "\U0001F600" and pair.replaced_chars == 0
            assert raw.text == "ok \ufffd\ufffd end" and raw.replaced_chars == 2
            assert error.is_error and error.text == "failed with \ufffd in its message" and error.replaced_chars == 1
            assert raised.is_error and "raised with \ufffd in its message" in raised.text
            assert py.text == "x\ufffd\ufffd\ufffd" and py.replaced_chars == 3
            metrics = r.metrics()
            assert metrics["broken"].replaced_chars == 5 and metrics["py_surrogate"].replaced_chars == 3

    asyncio.run(main())


def test_arguments_nested_past_the_limit_are_invalid_arguments_not_an_exception():
    async def main():
        r = ToolRunner([Tree()], ToolsConfig(cache=True))
        ok = await r.call(ToolCall("tree", nested(MAX_ARGUMENT_DEPTH)))
        assert ok.status == OK and ok.text == "took it"
        bad_leaf = await r.call(ToolCall("tree", nested(40, leaf="x")))
        assert bad_leaf.status == INVALID_ARGUMENTS and "is not of type 'integer'" in bad_leaf.text
        for depth in (MAX_ARGUMENT_DEPTH + 1, 300, 5000):
            t0 = time.perf_counter()
            res = await r.call(ToolCall("tree", nested(depth)))
            assert res.status == INVALID_ARGUMENTS, (depth, res.text)
            assert f"nested deeper than {MAX_ARGUMENT_DEPTH} levels" in res.text
            assert time.perf_counter() - t0 < 0.05  # refused before jsonschema walks it
        # a list nested as deep, and text that is not Unicode
        deep_list: list = []
        for _ in range(400):
            deep_list = [deep_list]
        assert (await r.call(ToolCall("tree", {"v": deep_list}))).status == INVALID_ARGUMENTS
        res = await r.call(ToolCall("tree", {"v": 1, "child": {"\ud800": "x"}}))
        assert res.status == INVALID_ARGUMENTS and "unpaired surrogate" in res.text

    asyncio.run(main())


def test_a_recursion_error_inside_validation_is_that_calls_message():
    v = ArgumentValidator.for_schema("tree", RECURSIVE)
    assert v.error(nested(10)) is None
    # validated directly (no depth check in front): Python's stack runs out inside jsonschema
    assert v.error(nested(2000)) == "nested too deeply to be checked against the tool's schema"
