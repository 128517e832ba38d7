"""A real agent, unchanged, against the gateway on the tiny:1m model (ScriptedPolicy makes it write
tool calls): the OpenAI SDK's function-tool loop. The recorded ids are exactly the sampled ones and
what the chat template renders for the conversation; unknown keys get a 401; hostile requests get
one line. Agents run per dataset row by the trainer's AgentEngine: tests/train/test_train_gateway_agents.py."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from gateway_fixtures import serving
from openai import AsyncOpenAI

pytestmark = pytest.mark.usefixtures("one_thread")


def rendered(tokenizer, messages, tools, generation_prompt=True):
    """The chat template's own rendering, encoded (independent of the gateway's code)."""
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt)
    return tokenizer.encode(text, add_special_tokens=False)


def test_openai_sdk_agent_records_exactly_the_templates_tokens(tiny):
    import openai_agent

    model, tok = tiny

    async def main():
        async with serving(model, tok, verify_prefix=True) as gw:
            key = gw.open_episode({"id": "r0"})
            client = AsyncOpenAI(base_url=gw.base_url(), api_key=key, max_retries=0)
            answer, messages = await openai_agent.run_agent(client, "tiny", "Add 3 and 4.")
            return answer, messages, gw.close_episode(key), gw.stats, gw.prefix

    answer, messages, episode, stats, prefix = asyncio.run(main())
    # the second call reused the first prompt's ids (checked against a full encode: verify_prefix)
    assert prefix.enabled and prefix.stats.reused_tokens > 0 and prefix.stats.verified == 1
    assert answer == "The answer is 7."
    assert messages[2]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 3, "b": 4}'}
    (traj,) = episode.trajectories("r0", 0, "ok", 1.0)
    assert [s.role for s in traj.segments] == ["prompt", "model", "observation", "model"]
    # The conversation as the template renders it, built by hand: the whole trajectory up to the
    # last call's generation prompt is that rendering, token for token.
    convo = [messages[0], messages[1],
             {"role": "assistant", "content": "", "tool_calls": [
                 {"type": "function", "function": {"name": "add", "arguments": {"a": 3, "b": 4}}}]},
             {"role": "tool", "content": "7"}]
    last_prompt = rendered(tok, convo, openai_agent.TOOLS)
    assert traj.input_ids[: len(last_prompt)] == last_prompt
    assert traj.segments[0].token_ids == rendered(tok, convo[:2], openai_agent.TOOLS)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    first, last = traj.turn_segments()
    assert first.token_ids == tok.encode('<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>',
                                         add_special_tokens=False) + [im_end]
    assert last.token_ids[-1] == im_end and last.text == "The answer is 7.<|im_end|>"
    assert len(traj.input_ids) == len(last_prompt) + len(last.token_ids)
    assert all(len(s.logprobs) == len(s.token_ids) for s in traj.turn_segments())
    assert [(c.name, c.arguments) for c in traj.tool_calls] == [("add", {"a": 3, "b": 4})]
    assert traj.metrics["gateway_calls"] == 2 and stats.calls == 2 and stats.overhead_s > 0


def test_http_surface_auth_models_stream_and_n(tiny):
    model, tok = tiny
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Add 5 and 6."}], "tools": None}

    async def main():
        async with serving(model, tok) as gw:
            async with httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
                no_key = await http.post("/v1/chat/completions", json=body)
                bad_key = await http.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer nope"})
                models = (await http.get("/v1/models")).json()
                bad_json = await http.post(f"/episodes/{gw.open_episode()}/v1/chat/completions", content=b"{")
            key = gw.open_episode()
            sdk = AsyncOpenAI(base_url=gw.base_url(key), api_key="unused", max_retries=0)  # the key in the path
            stream = await sdk.chat.completions.create(model="tiny", messages=body["messages"], stream=True,
                                                       stream_options={"include_usage": True})
            chunks = [c async for c in stream]
            many = await sdk.chat.completions.create(model="tiny", messages=body["messages"], n=3)
            episode = gw.close_episode(key)
            with pytest.raises(openai.AuthenticationError, match="unknown episode key"):
                await sdk.chat.completions.create(model="tiny", messages=body["messages"])
            return no_key, bad_key, models, bad_json, chunks, many, episode

    no_key, bad_key, models, bad_json, chunks, many, episode = asyncio.run(main())
    assert no_key.status_code == bad_key.status_code == 401
    assert "no episode key" in no_key.json()["error"]["message"]
    assert "unknown episode key 'nope'" in bad_key.json()["error"]["message"]
    assert models["data"][0]["id"] == "tiny"
    assert bad_json.status_code == 400 and "not valid JSON" in bad_json.json()["error"]["message"]
    calls = [c for ch in chunks for choice in ch.choices for c in (choice.delta.tool_calls or [])]
    assert calls[0].function.name == "add" and json.loads(calls[0].function.arguments) == {"a": 5, "b": 6}
    assert chunks[-1].usage.completion_tokens > 0
    assert len(many.choices) == 3 and {c.finish_reason for c in many.choices} == {"tool_calls"}
    # the streamed call is sample 0; the n=3 call sends the same prompt again, which stops inside
    # sample 0 (a retry, not a continuation): its 3 choices are samples 1-3
    assert len(episode.samples) == 4


def test_hostile_requests_get_one_line_and_the_gateway_goes_on(tiny):
    model, tok = tiny
    user = {"role": "user", "content": "Add 1 and 2."}

    async def main():
        async with serving(model, tok) as gw:
            key = gw.open_episode()
            url = f"/episodes/{key}/v1/chat/completions"
            async with httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
                deep = await http.post(url, content=b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
                not_utf8 = await http.post(url, content=b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}')
                parts = await http.post(url, json={"messages": [{"role": "user", "content": [{"type": "audio"}]}]})
                tool_first = await http.post(url, json={"messages": [{"role": "tool", "content": "x"}], "n": 99})
                # a lone surrogate (JSON escape) and a non-JSON arguments string are served
                odd = await http.post(url, content=json.dumps({"messages": [
                    {"role": "user", "content": "Add 1 and 2. \ud800"},
                    {"role": "assistant", "content": None,
                     "tool_calls": [{"id": "c", "type": "function",
                                     "function": {"name": "add", "arguments": "{oops"}}]},
                    {"role": "tool", "tool_call_id": "c", "content": "3"}], "max_tokens": 10**9},
                    ensure_ascii=True).encode())
                ok = await http.post(url, json={"messages": [user]})
            return deep, not_utf8, parts, tool_first, odd, ok, gw.close_episode(key)

    deep, not_utf8, parts, tool_first, odd, ok, episode = asyncio.run(main())
    for bad, says in ((deep, "not valid JSON"), (not_utf8, "not valid JSON"), (parts, "'audio' is not supported"),
                      (tool_first, "`n` must be between 1 and 16")):
        assert bad.status_code == 400 and says in bad.json()["error"]["message"], bad.text
    assert odd.status_code == 200 and odd.json()["choices"][0]["message"]["content"] == "The answer is 3."
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "tool_calls"
    assert '"arguments": {oops}' in episode.samples[0].segments[0].text  # shown as the agent sent it
    assert "\ufffd" in episode.samples[0].segments[0].text


def test_the_gil_switch_interval_is_short_while_the_gateway_serves(tiny):
    import sys

    from rlfactory.serve.gateway import SWITCH_INTERVAL_S

    before = sys.getswitchinterval()
    assert before > SWITCH_INTERVAL_S  # Python's default, 5 ms

    async def main():
        async with serving(*tiny) as gw:
            return sys.getswitchinterval(), gw.url

    during, url = asyncio.run(main())
    assert url and during == SWITCH_INTERVAL_S and sys.getswitchinterval() == before


def test_a_one_choice_call_generates_in_its_own_task_and_replies_with_two_headers(tiny):
    """n=1: the request's task awaits the generator itself (asyncio.gather would wrap it in a task
    of its own, started a loop turn later); the reply's headers are content-length and
    content-type only (no server or date lines for every client to parse and search)."""
    model, tok = tiny
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Add 5 and 6."}]}

    async def main():
        async with serving(model, tok) as gw:
            submit, tasks = gw.generator.submit, []

            async def watched(request):
                tasks.append(asyncio.current_task())
                return await submit(request)

            gw.generator.submit = watched
            mine = asyncio.current_task()
            await gw.chat(gw.open_episode(), body)
            await gw.chat(gw.open_episode(), {**body, "n": 2})
            async with httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
                reply = await http.post(f"/episodes/{gw.open_episode()}/v1/chat/completions", json=body)
            return mine, tasks, reply

    mine, tasks, reply = asyncio.run(main())
    assert tasks[0] is mine and tasks[1] is not mine and tasks[2] is not mine  # n=2: one task per choice
    assert reply.status_code == 200 and sorted(reply.headers) == ["content-length", "content-type"]
