"""The shared parsing helpers: the bounded JSON decoder and the linear tag scanner."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfactory.chat.parsing import (MAX_INT_DIGITS, MAX_JSON_DEPTH, JsonError, JsonValue, TagPair, answer_text,
                                    decode_json, decode_json_prefix, find_json_regions, find_regions, is_call_object,
                                    outside_regions, split_reasoning)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("text, reason", [
    ('{"x": ' + "1" * (MAX_INT_DIGITS + 1) + "}", f"has a number with {MAX_INT_DIGITS + 1} digits (at most {MAX_INT_DIGITS})"),
    ('{"x": -' + "1" * 9000 + "}", "has a number with 9000 digits"),
    (nested(MAX_JSON_DEPTH + 1), f"is nested deeper than {MAX_JSON_DEPTH} levels"),
    (nested(2000), f"is nested deeper than {MAX_JSON_DEPTH} levels"),
    ('{"a":' * 100_000, f"is nested deeper than {MAX_JSON_DEPTH} levels"),
    ('{"x": 1e999}', "has a number out of range (1e999)"),
    ('{"x": NaN}', "has NaN, which is not a JSON number"),
    ("[-Infinity]", "has -Infinity, which is not a JSON number"),
    ('{"q": "\\ud800"}', "has a string with an unpaired surrogate"),
    ('{"\\udc00": 1}', "has a string with an unpaired surrogate"),
    ('{"x": }', "is not valid JSON (Expecting value at char 6)"),
    ('{"x": 1} {"y": 2}', "is not valid JSON (Extra data at char 9)"),
    ("", "is not valid JSON (Expecting value at char 0)"),
])
def test_decode_json_turns_every_limit_into_a_reason(text, reason):
    result = decode_json(text)
    assert isinstance(result, JsonError) and result.reason.startswith(reason), result


def test_decode_json_accepts_values_at_the_limits():
    assert decode_json(nested(MAX_JSON_DEPTH)) == JsonValue(json.loads(nested(MAX_JSON_DEPTH)), 2 * MAX_JSON_DEPTH)
    big = "9" * MAX_INT_DIGITS
    text = f' {{"x": {big}, "y": 1.5}} '
    assert decode_json(text) == JsonValue({"x": int(big), "y": 1.5}, len(text) - 1)
    assert decode_json('"[[[[[[[[[[[[[[["').value == "[" * 15  # brackets inside strings do not nest
    assert decode_json('["\\ud83d\\ude00"]').value == ["\U0001F600"]  # a surrogate pair is one code point


def test_decode_json_prefix_reads_one_value_and_says_where_it_stopped():
    text = 'say {"a": [1, 2]} then {"b": '
    first = decode_json_prefix(text, 4)
    assert first == JsonValue({"a": [1, 2]}, 17)
    second = decode_json_prefix(text, 23)
    assert isinstance(second, JsonError) and second.pos == len(text)
    deep = decode_json_prefix("x" + nested(5000), 1)
    assert isinstance(deep, JsonError) and "nested deeper" in deep.reason and 1 < deep.pos <= len("x" + nested(5000))


@pytest.mark.parametrize("obj, is_call", [
    ({"name": "f", "parameters": {}}, True),
    ({"parameters": {}, "name": "f"}, True),
    ({"arguments": "{}", "type": "function", "name": "f"}, True),
    ({"type": "function", "function": {"arguments": {}, "name": "f"}}, True),
    ({"name": "f", "parameters": 3}, True),  # an attempt; call_from_object says what is wrong
    ({"name": "Alice"}, False),
    ({"name": "Alice", "age": 3}, False),
    ({"type": "person", "name": "Alice", "parameters": {}}, False),
    ({"function": {"name": "f"}}, False),
    ([{"name": "f", "parameters": {}}], False),
    ("f", False),
])
def test_is_call_object(obj, is_call):
    assert is_call_object(obj) is is_call


# -- find_regions is re.finditer over `open(.*?)close` alternatives, but linear -------------------------
PAIRS = [TagPair("<a>", "</a>"), TagPair("<b>", "</b>")]
REGEX = re.compile(r"<a>(.*?)</a>|<b>(.*?)</b>", re.DOTALL)
soup = st.lists(st.sampled_from(["<a>", "</a>", "<b>", "</b>", "x", "<", ">", "/", "a"]), max_size=40).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=soup)
def test_find_regions_matches_the_regex_it_replaces(text):
    expected = [(m.start(), m.end(), 0 if m.group(1) is not None else 1) for m in REGEX.finditer(text)]
    regions = find_regions(text, PAIRS)
    assert [(r.start, r.end, r.pair) for r in regions] == expected
    assert outside_regions(text, regions) == REGEX.sub("", text)


def test_find_regions_unclosed_and_open_ended_pairs():
    to_end = TagPair("<t>", "</t>", unclosed="to_end")
    r = find_regions("x<t>y<t>z", [to_end])
    assert [(x.start, x.body_start, x.end, x.closed) for x in r] == [(1, 4, 9, False)]
    line = TagPair(re.compile(r"^(?=\{)", re.MULTILINE))
    r = find_regions("a\n{b\n{c", [line])
    assert [(x.start, x.end) for x in r] == [(2, 7)]


# -- find_json_regions: a close tag inside the JSON value's strings does not end the region -----------
CALL = TagPair("<tool_call>", "</tool_call>")
call_soup = st.lists(st.sampled_from(["<tool_call>", "</tool_call>", "{", "}", "[", "]", ":", ",", "1", "null", " ",
                                      "\n", "x"]), max_size=40).map("".join)


def test_find_json_regions_skips_a_close_tag_inside_a_string():
    text = ('x<tool_call>\n{"name": "a", "arguments": {"code": "</tool_call>"}}\n</tool_call> y '
            '<tool_call>{"name": "b"}</tool_call><tool_call>not json</tool_call>"</tool_call>')
    r = find_json_regions(text, CALL)
    assert [text[x.body_start: x.body_end] for x in r] == [
        '\n{"name": "a", "arguments": {"code": "</tool_call>"}}\n', '{"name": "b"}', "not json"]
    assert outside_regions(text, r) == 'x y "</tool_call>'
    # a value that runs past the first close but is not followed by a close: the first close
    text = '<tool_call>{"a": "</tool_call>"} and more'
    assert [(x.body_end, x.end) for x in find_json_regions(text, CALL)] == [(text.index("</"), text.index('"}'))]


@settings(max_examples=300, deadline=None)
@given(text=call_soup)
def test_find_json_regions_is_find_regions_where_no_string_holds_a_close(text):
    """Without quotes no JSON value can hold a close tag, so the regions are `find_regions`'s."""
    for pair in (CALL, TagPair("<tool_call>", "</tool_call>", unclosed="to_end")):
        assert find_json_regions(text, pair) == find_regions(text, [pair])


def test_find_json_regions_reads_linearly(monkeypatch):
    """Decodes that run past later openings (one string around them all, each with a long array of
    its own) read each character at most twice (find_json_regions' doc says why), not once per opening."""
    import rlfactory.chat.parsing as parsing

    read, real = [], parsing.decode_json_prefix

    def counting(text, start=0, **kw):
        out = real(text, start, **kw)
        read.append((out.end if isinstance(out, JsonValue) else out.pos) - start)
        return out

    monkeypatch.setattr(parsing, "decode_json_prefix", counting)
    text = '<tool_call>"' + ("<tool_call>[" + "1," * 50 + "</tool_call>") * 2000 + '"'
    regions = find_json_regions(text, CALL)
    assert len(regions) == len(read) == 2000  # the first region holds the first two openings
    assert sum(read) <= 2 * len(text)


def test_split_reasoning_and_answer_text():
    assert split_reasoning("<think> a </think>b") == ("a", "b")
    assert split_reasoning("a </think>b<think>c") == ("a\nc", "b")  # prompt-opened, then unclosed
    call = TagPair("<c>", "</c>")
    assert split_reasoning("<c></think></c>b", protect=[call]) == ("", "<c></think></c>b")
    assert split_reasoning("<c>x</c></think>b", protect=[call]) == ("<c>x</c>", "b")
    assert answer_text("<answer>1</answer> <answer> 2 </answer> <answer>3") == "2"
    assert answer_text("  plain ") == "plain"
    with pytest.raises(TypeError, match="TagPairs"):  # a programming error, caught by any test of the caller
        split_reasoning("x", protect=r"<c>.*?</c>")
