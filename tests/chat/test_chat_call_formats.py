"""Call formats of the template family: written calls parse back, and parsing never raises (huge
integers, NaN, deep nesting, unclosed tags and tag soup all come back as a reason or no call)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfactory.chat.call_formats import FORMATS, FoundCalls, detect_format, get_format
from rlfactory.tools.base import ToolCall

names = st.from_regex(r"[a-z][a-z_0-9]{0,10}", fullmatch=True)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**9, 10**9) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
calls = st.lists(st.builds(ToolCall, names, st.dictionaries(st.text(max_size=6), json_values, max_size=3)),
                 min_size=1, max_size=3)
PIECES = ["<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>", '{"name": "f", "arguments": {}}',
          '{"name": ', '"parameters": {', '"arguments": ', "}", "{", "[", "]", '"', "\\", "\n", ";", "NaN",
          "1e999", "9" * 5000, "[" * 3000, '{"function": {"name": "x"}}']
soup = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=6)), max_size=25).map("".join)


@settings(max_examples=200, deadline=None)
@given(text=st.one_of(soup, st.text(max_size=200)))
def test_parse_never_raises(text):
    for fmt in FORMATS.values():
        out = fmt.parse(text)
        assert out is None or isinstance(out, str) and out or isinstance(out, FoundCalls) and out.calls


@settings(max_examples=100, deadline=None)
@given(cs=calls)
def test_written_calls_parse_back(cs):
    for fmt in FORMATS.values():
        found = fmt.parse(fmt.format_calls(cs))
        assert isinstance(found, FoundCalls), (fmt.name, found)
        assert [(c.name, c.arguments) for c in found.calls] == [(c.name, c.arguments) for c in cs]


def test_a_close_tag_inside_an_argument_parses_back():
    cs = [ToolCall("run", {"code": 'print("</tool_call>")'}), ToolCall("f", {"x": "</tool_call>\n<tool_call>"})]
    for name in ("hermes", "hermes_list"):
        found = get_format(name).parse(get_format(name).format_calls(cs))
        assert isinstance(found, FoundCalls) and [(c.name, c.arguments) for c in found.calls] == [
            (c.name, c.arguments) for c in cs], name


@pytest.mark.parametrize("name, text, reason", [
    ("hermes", "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": " + "9" * 6000 + "}}</tool_call>", "digits"),
    ("hermes", "<tool_call>" + "[" * 50_000 + "</tool_call>", "nested deeper than"),
    ("hermes", '<tool_call>{"name": "f", "arguments": {"x": NaN}}</tool_call>', "NaN"),
    ("hermes", "<tool_call>" * 20_000, "not closed with </tool_call>"),
    ("hermes_list", "<tool_call>[]</tool_call>", "empty list"),
    ("llama3_json", '{"name": "f", "parameters": [1, 2]}', "must be a JSON object"),
    ("mistral", "[TOOL_CALLS][" + "{" * 40_000, "not valid JSON"),
    ("mistral", '[TOOL_CALLS][{"arguments": {}}]', "no \"name\""),
])
def test_bad_calls_are_reasons(name, text, reason):
    out = get_format(name).parse(text)
    assert isinstance(out, str) and reason in out


def test_formats_spelled_as_models_write_them():
    f = get_format("llama3_json").parse('<|python_tag|>{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}')
    assert [c.name for c in f.calls] == ["f", "g"] and f.calls[0].arguments == {"a": 1}
    m = get_format("mistral").parse('Sure.[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}, "id": "abc123XYZ"}]')
    assert m.calls[0].id == "abc123XYZ" and m.text == "Sure."
    h = get_format("hermes").parse('<tool_call>[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]</tool_call>')
    assert [c.name for c in h.calls] == ["f", "g"]  # a list body is accepted in either spelling
    assert get_format("hermes").parse("no calls here") is None
    assert get_format("llama3_json").parse('The set {"a"} is small.') is None


def test_detect_format_from_a_rendering():
    assert detect_format('[TOOL_CALLS][{"name": "p"}]', "p") == "mistral"
    assert detect_format('<tool_call>\n{"name": "p"}', "p") == "hermes"
    assert detect_format('<tool_call>[{"name": "p"}]', "p") == "hermes_list"
    assert detect_format('{"name": "p", "parameters": {}}', "p") == "llama3_json"
    assert detect_format("p(x=1)", "p") is None
    with pytest.raises(ValueError, match="unknown call format"):
        get_format("xml")
