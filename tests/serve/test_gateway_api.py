"""The gateway's OpenAI shapes (rlfactory/serve/gateway_api.py): requests normalised for a chat
template, bad fields named in one line, replies and stream chunks in OpenAI's shape (read back
by the OpenAI SDK's own types)."""

from __future__ import annotations

import json

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from rlfactory.chat.base import Answer, Malformed, ToolCalls
from rlfactory.serve.gateway_api import BadRequest, completion, make_choice, parse_chat, stream_chunks
from rlfactory.tools.base import ToolCall

TOOL = {"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {"type": "object"}}}


def test_messages_are_normalised_for_a_chat_template():
    req = parse_chat({"model": "x", "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "2"},
    ], "tools": [TOOL], "n": 2, "temperature": 0, "max_completion_tokens": 7, "stop": "END", "stream": True,
        "stream_options": {"include_usage": True}, "parallel_tool_calls": True, "user": "u"})
    assert req.messages[0] == {"role": "system", "content": "be brief"}
    assert req.messages[2]["content"] == "" and req.messages[2]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert req.messages[3] == {"role": "tool", "content": "2", "tool_call_id": "c1"}
    assert req.tools[0].name == "add" and req.n == 2 and req.sampling.greedy and req.max_tokens == 7
    assert req.stop == ["END"] and req.stream and req.include_usage


@pytest.mark.parametrize("body, field", [
    ({"messages": []}, "`messages`"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "image_url"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 0}, "`n`"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "`temperature`"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "code"}]}, "tools[0]"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": True}, "`max_tokens`"),
    ({"messages": [{"role": "user", "content": "x"}], "top_p": 2}, "top_p"),
    ([1, 2], "JSON object"),
])
def test_bad_requests_name_the_field(body, field):
    with pytest.raises(BadRequest, match=None) as e:
        parse_chat(body)
    assert field in str(e.value) and "\n" not in str(e.value)


def test_a_tool_call_turn_reads_back_with_the_openai_sdk():
    parsed = ToolCalls([ToolCall("add", {"a": 1, "b": "é"})], text="let me add")
    choice = make_choice("<think>hmm</think>let me add\n<tool_call>...</tool_call>", parsed, False, "auto", 9)
    body = completion([choice], "tiny", 5, {"episode": "k"})
    reply = ChatCompletion.model_validate(body)
    msg = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls" and msg.content == "let me add"
    assert msg.tool_calls[0].function.name == "add"
    assert json.loads(msg.tool_calls[0].function.arguments) == {"a": 1, "b": "é"}
    assert body["choices"][0]["message"]["reasoning_content"] == "hmm"
    assert reply.usage.prompt_tokens == 5 and reply.usage.completion_tokens == 9


def test_answers_malformed_turns_length_and_tool_choice_none():
    assert make_choice("42", Answer("42"), False, "auto", 1).finish_reason == "stop"
    bad = make_choice("<tool_call>{", Malformed("not closed"), False, "auto", 1)
    assert bad.content == "<tool_call>{" and not bad.tool_calls
    assert make_choice("abc", Answer("abc"), True, "auto", 3).finish_reason == "length"
    none = make_choice("x<tool_call>{}</tool_call>", ToolCalls([ToolCall("f", {})], "x"), False, "none", 1)
    assert not none.tool_calls and none.finish_reason == "stop" and none.content == "x<tool_call>{}</tool_call>"


def test_the_stream_is_openai_chunks_then_done():
    parsed = ToolCalls([ToolCall("add", {"a": 1})], text="")
    events = list(stream_chunks([make_choice("<tool_call>..</tool_call>", parsed, False, "auto", 4)], "tiny", 3, True))
    assert events[-1] == "data: [DONE]\n\n" and all(e.startswith("data: ") and e.endswith("\n\n") for e in events)
    chunks = [ChatCompletionChunk.model_validate(json.loads(e[6:])) for e in events[:-1]]
    assert chunks[0].choices[0].delta.role == "assistant"
    calls = [c for ch in chunks for choice in ch.choices for c in (choice.delta.tool_calls or [])]
    assert calls[0].function.name == "add" and calls[0].id.startswith("call_")
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"
    assert chunks[-1].usage.total_tokens == 7 and not chunks[-1].choices
