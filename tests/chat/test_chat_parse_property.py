"""Property tests: `parse` never raises on any text (huge integers, deep nesting and many unclosed
tags included), formatted turns parse back to their calls, and key order does not matter."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlfactory.chat import Answer, Llama3ToolManager, Malformed, ModelTurn, Qwen3ToolManager, SearchR1ToolManager, ToolCalls
from rlfactory.tools.base import ToolCall

TAGS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<answer>", "</answer>", "<search>", "</search>",
        "<information>", "</information>", "<tool_response>", "<|python_tag|>", "<|im_end|>"]
PIECES = TAGS + ['{"name": "search", "arguments": {"query": "Zor"}}', '{"name": ', '"parameters": {', "}", "{", "[",
                 "]", '"', "\\", "\n", " ", "search", "null", "1e999", '{"function": {"name": "x"}}', "[[[[[[[["]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Adversarial pieces: integers past Python's 4300-digit limit, nesting past the depth limit and past
# Python's recursion limit, runs of one unclosed tag.
HUGE = st.builds(lambda d, n: d * n, st.sampled_from(["1", "9", "-1", "0."]), st.integers(4000, 6000))
DEEP = st.builds(lambda o, n: o * n, st.sampled_from(["[", "{", '{"a":', '[{"name": "f", "parameters": ']),
                 st.integers(90, 3000))
RUNS = st.builds(lambda t, n: t * n, st.sampled_from(TAGS + ['{"name": ', "\n{", '"', "\\"]), st.integers(100, 3000))
tag_soup = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=8), HUGE, DEEP, RUNS), max_size=30).map("".join)
any_text = st.one_of(st.text(max_size=300), tag_soup)
names = st.from_regex(r"[a-z][a-z_0-9]{0,12}", fullmatch=True)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
calls = st.lists(st.builds(ToolCall, names, st.dictionaries(st.text(max_size=8), json_values, max_size=4)),
                 min_size=1, max_size=3)
plain = st.text(st.characters(blacklist_characters="<>{}[]"), max_size=40)


@pytest.fixture(scope="module")
def managers(tiny_tokenizer):
    return [Qwen3ToolManager(tiny_tokenizer), Llama3ToolManager(tiny_tokenizer), SearchR1ToolManager(tiny_tokenizer)]


@SETTINGS
@given(text=any_text)
def test_parse_never_raises(managers, text):
    for m in managers:
        result = m.parse(text)
        assert isinstance(result, (Answer, ToolCalls, Malformed))
        if isinstance(result, ToolCalls):
            assert result.calls and all(isinstance(c.arguments, dict) and c.name for c in result.calls)
        if isinstance(result, Malformed):
            assert result.reason


@SETTINGS
@given(text=any_text)
def test_qwen3_calls_inside_think_are_never_calls(managers, text):
    qwen = managers[0]
    inner = text.replace("<think>", "").replace("</think>", "")
    result = qwen.parse(f"<think>{inner}</think>\n\nThe answer.")
    assert result == Answer("The answer.")


@SETTINGS
@given(cs=calls, content=plain, reasoning=st.none() | plain)
def test_qwen3_and_llama3_turns_round_trip(managers, cs, content, reasoning):
    qwen, llama = managers[0], managers[1]
    content = content.strip()
    assert qwen.parse(qwen.format_turn(ModelTurn(cs, content, reasoning))) == ToolCalls(cs, text=content)
    assert llama.parse(llama.format_turn(ModelTurn(cs, content))) == ToolCalls(cs, text=content)


@SETTINGS
@given(queries=st.lists(plain.filter(str.strip), min_size=1, max_size=3), reasoning=st.none() | plain)
def test_searchr1_turns_round_trip(managers, queries, reasoning):
    sr1 = managers[2]
    turn = ModelTurn([ToolCall("search", {"query": q.strip()}) for q in queries], "", reasoning)
    assert sr1.parse(sr1.format_turn(turn)) == ToolCalls(turn.calls)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@SETTINGS
@given(digits=st.integers(1, 6000), sign=st.sampled_from(["", "-"]))
def test_huge_integers_are_a_call_or_a_reason(managers, digits, sign):
    qwen, llama = managers[0], managers[1]
    number = sign + "7" * digits
    texts = [(qwen, '<tool_call>{"name": "f", "arguments": {"x": ' + number + "}}</tool_call>"),
             (qwen, '<tool_call>{"name": "f", "arguments": "{\\"x\\": ' + number + '}"}</tool_call>'),
             (llama, '{"name": "f", "parameters": {"x": ' + number + "}}")]
    for manager, text in texts:
        result = manager.parse(text)
        if digits <= 4300:
            assert result == ToolCalls([ToolCall("f", {"x": int(number)})])
        else:
            assert isinstance(result, Malformed) and f"a number with {digits} digits" in result.reason


@SETTINGS
@given(depth=st.integers(1, 3000), as_string=st.booleans())
def test_deep_nesting_is_a_call_or_a_reason(managers, depth, as_string):
    qwen, llama = managers[0], managers[1]
    args = {"x": json.loads(nested(depth))} if depth < 500 else None
    raw = '{"x": ' + nested(depth) + "}"
    arguments = json.dumps(raw) if as_string else raw
    levels = depth + 1 if as_string else depth + 2  # the decoded JSON: arguments (+ the call object)
    for manager, text in [(qwen, '<tool_call>{"name": "f", "arguments": ' + arguments + "}</tool_call>"),
                          (llama, '{"name": "f", "parameters": ' + arguments + "}")]:
        result = manager.parse(text)
        if levels <= 100:
            assert result == ToolCalls([ToolCall("f", args)])
        else:
            assert isinstance(result, Malformed) and "nested deeper than 100 levels" in result.reason


@SETTINGS
@given(tags=st.lists(st.tuples(st.sampled_from(TAGS), st.integers(1, 3000)), min_size=1, max_size=4),
       filler=st.sampled_from(["", "x", '{"name": "f"', "\n"]))
def test_many_unclosed_tags(managers, tags, filler):
    text = filler.join(tag * n for tag, n in tags)
    for m in managers:
        assert isinstance(m.parse(text), (Answer, ToolCalls, Malformed))
    if all(tag == "<tool_call>" for tag, _ in tags) and "</tool_call>" not in filler:
        assert managers[0].parse(text) == Malformed("<tool_call> is not closed with </tool_call>")


@SETTINGS
@given(cs=calls, order=st.permutations(["name", "args", "type"]), with_type=st.booleans(),
       spelling=st.sampled_from(["arguments", "parameters"]), python_tag=st.booleans())
def test_key_order_does_not_matter(managers, cs, order, with_type, spelling, python_tag):
    qwen, llama = managers[0], managers[1]
    objs = []
    for c in cs:
        values = {"name": ("name", c.name), "args": (spelling, c.arguments), "type": ("type", "function")}
        objs.append(json.dumps(dict(values[k] for k in order if k != "type" or with_type)))
    assert qwen.parse("".join(f"<tool_call>{o}</tool_call>" for o in objs)) == ToolCalls(cs)
    assert llama.parse(("<|python_tag|>" if python_tag else "") + "\n".join(objs)) == ToolCalls(cs)


@SETTINGS
@given(prose=plain.map(lambda t: t.replace("\n", " ").replace("\r", " ")), name=names,
       extra=st.dictionaries(st.sampled_from(["age", "parameters", "arguments", "type"]), json_values, max_size=2))
def test_llama3_json_inside_a_sentence_is_never_a_call(managers, prose, name, extra):
    text = f"{prose} is {json.dumps({'name': name, **extra})} and more."
    assert managers[1].parse(text) == Answer(text.strip())
