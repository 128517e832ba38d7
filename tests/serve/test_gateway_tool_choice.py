"""`tool_choice` through the real OpenAI SDK against the gateway on the tiny:1m model, steered by
ScriptedPolicy with a scripted sequence of replies: none hides the tools and returns calls as text;
required and a named function sample again until the reply complies (what the agent sees is what
the episode records), a 422 naming the cause when no sample does; a tool_choice without tools or
naming an unknown function is a 400, as with OpenAI."""

from __future__ import annotations

import asyncio

import openai
import pytest
from gateway_fixtures import serving
from openai import AsyncOpenAI

from rlfactory.rollout.scripted import TurnPlan

pytestmark = pytest.mark.usefixtures("one_thread")

TOOLS = [{"type": "function", "function": {"name": name, "description": f"{name} two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
    for name in ("add", "mul")]
MESSAGES = [{"role": "user", "content": "Add 3 and 4."}]


def call(name: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {{"a": 3, "b": 4}}}}\n</tool_call>'


def replies(*texts: str):
    """A plan that writes `texts` in order (the last one again after that), keeping each prompt."""
    prompts: list[str] = []

    def plan(ctx: str) -> TurnPlan:
        prompts.append(ctx)
        return TurnPlan(free=0, forced=texts[min(len(prompts), len(texts)) - 1])

    plan.prompts = prompts
    return plan


def message(err: openai.APIStatusError) -> str:
    return err.response.json()["error"]["message"]


def chat(tiny, plan, retries: int = 3, **create):
    """One SDK call in a fresh episode; (the reply or the SDK's exception, the episode, the stats)."""
    model, tok = tiny

    async def main():
        async with serving(model, tok, plan, tool_choice_retries=retries) as gw:
            key = gw.open_episode()
            async with AsyncOpenAI(base_url=gw.base_url(key), api_key="unused", max_retries=0) as client:
                try:
                    out = await client.chat.completions.create(model="tiny", messages=MESSAGES, **create)
                except openai.APIStatusError as e:
                    out = e
            return out, gw.close_episode(key), gw.stats

    return asyncio.run(main())


def test_none_renders_no_tools_and_returns_calls_as_text(tiny):
    plan = replies(call("add"))
    reply, episode, _ = chat(tiny, plan, tools=TOOLS, tool_choice="none")
    msg = reply.choices[0].message
    assert msg.tool_calls is None and reply.choices[0].finish_reason == "stop" and '"name": "add"' in msg.content
    assert "<tools>" not in plan.prompts[0] and "Add 3 and 4." in plan.prompts[0]
    [sample] = episode.samples
    assert "<tools>" not in sample.segments[0].text and sample.tool_calls == []
    # auto (the default) shows them
    plan = replies(call("add"))
    reply, _, _ = chat(tiny, plan, tools=TOOLS)
    assert "<tools>" in plan.prompts[0] and reply.choices[0].message.tool_calls[0].function.name == "add"


def test_required_samples_again_until_the_reply_is_a_call(tiny):
    plan = replies("I would rather not.", "Still no.", call("mul"))
    reply, episode, stats = chat(tiny, plan, tools=TOOLS, tool_choice="required")
    assert reply.choices[0].finish_reason == "tool_calls" and reply.choices[0].message.tool_calls[0].function.name == "mul"
    assert stats.tool_choice_retries == 2 and len(plan.prompts) == 3 and len(set(plan.prompts)) == 1
    # the episode records the reply the agent saw, not the ones set aside
    [sample] = episode.samples
    [turn] = [s for s in sample.segments if s.role == "model"]
    assert '"name": "mul"' in turn.text and "rather" not in turn.text
    assert [c.name for c in sample.tool_calls] == ["mul"]


def test_a_named_function_is_the_one_called(tiny):
    plan = replies(call("mul"), call("add"))
    reply, episode, stats = chat(tiny, plan, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}})
    assert [c.function.name for c in reply.choices[0].message.tool_calls] == ["add"] and stats.tool_choice_retries == 1
    assert [c.name for c in episode.samples[0].tool_calls] == ["add"]


def test_a_model_that_never_complies_gets_a_422_that_says_so(tiny):
    plan = replies("No tools today.")
    err, episode, stats = chat(tiny, plan, retries=2, tools=TOOLS, tool_choice="required")
    assert isinstance(err, openai.UnprocessableEntityError)
    assert ("tool_choice required: the model wrote no tool call, in all 3 samples of this turn "
            "(gateway tool_choice_retries=2); its last reply began 'No tools today.'") == message(err)
    assert len(plan.prompts) == 3 and episode.samples == [] and stats.tool_choice_retries == 2
    err, _, _ = chat(tiny, replies(call("mul")), retries=0, tools=TOOLS,
                     tool_choice={"type": "function", "function": {"name": "add"}})
    assert isinstance(err, openai.UnprocessableEntityError) and "the model called 'mul', not 'add'" in message(err)
    assert err.response.json()["error"]["type"] == "unprocessable_entity_error"


def test_bad_tool_choices_are_400s_that_name_the_cause(tiny):
    err, _, _ = chat(tiny, replies("x"), tool_choice="required")
    assert isinstance(err, openai.BadRequestError) and "`tool_choice` is required but the request has no `tools`" == message(err)
    err, _, _ = chat(tiny, replies("x"), tools=TOOLS, tool_choice={"type": "function", "function": {"name": "div"}})
    assert isinstance(err, openai.BadRequestError)
    assert "`tool_choice` names function 'div', which is not in `tools` (add, mul)" == message(err)
    err, _, _ = chat(tiny, replies("x"), tools=TOOLS, tool_choice={"type": "function"})
    assert isinstance(err, openai.BadRequestError) and message(err).startswith("`tool_choice` must be auto, none, required")
