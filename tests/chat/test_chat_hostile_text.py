"""Text that is not valid Unicode reaching a ToolManager (a tool result, a dataset row's prompt):
every family renders it, with U+FFFD for each lone surrogate, instead of the tokenizer's TypeError."""

import pytest

from rlfactory.chat.registry import make_tool_manager
from rlfactory.tools.base import ToolResult, ToolSpec

HOSTILE = ["half an emoji \ud83d here", "\udc80\udcff at the start", "NUL \x00 and \x01 stay", "\ud83d\ude00 (a pair)"]
REPAIRED = ["half an emoji \ufffd here", "\ufffd\ufffd at the start", "NUL \x00 and \x01 stay", "\U0001F600 (a pair)"]
TOOLS = [ToolSpec("search", "find \ud800 things", {"type": "object", "properties": {"q": {"type": "string"}}})]


def check(tm) -> None:
    before = tm.template.replaced_chars
    hostile = tm.render_observation([ToolResult(t) for t in HOSTILE])
    assert hostile == tm.render_observation([ToolResult(t) for t in REPAIRED])
    assert tm.template.replaced_chars == before + 3
    prompt = tm.render_prompt([{"role": "user", "content": HOSTILE[0]}], TOOLS)
    repaired_tools = [ToolSpec("search", "find \ufffd things", TOOLS[0].parameters)]
    assert prompt == tm.render_prompt([{"role": "user", "content": REPAIRED[0]}], repaired_tools)
    assert "\x00" in tm.tokenizer.decode(hostile)  # NUL is valid text: kept, not replaced


@pytest.mark.parametrize("family", ["qwen3", "searchr1", "template"])
def test_every_family_renders_lone_surrogates_with_the_tiny_tokenizer(tiny_tokenizer, family):
    check(make_tool_manager(tiny_tokenizer, family))


def test_real_qwen3_and_llama3_tokenizers(qwen3_tokenizer, llama31_tokenizer):
    check(make_tool_manager(qwen3_tokenizer, "qwen3"))
    check(make_tool_manager(llama31_tokenizer, "llama3"))
