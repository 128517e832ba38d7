"""qwen3 ToolManager: parsing Hermes-style calls, rendering prompts and observations."""

from __future__ import annotations

import pytest

from rlfactory.chat import Answer, Malformed, ModelTurn, Qwen3ToolManager, ToolCalls
from rlfactory.tools.base import ToolCall, ToolResult, ToolSpec

CALL = '<tool_call>\n{"name": "search", "arguments": {"query": "Zor"}}\n</tool_call>'
TOOLS = [ToolSpec("search", "Search the web.", {"type": "object", "properties": {"query": {"type": "string"}}})]


@pytest.fixture(scope="module")
def qwen(tiny_tokenizer) -> Qwen3ToolManager:
    return Qwen3ToolManager(tiny_tokenizer)


def test_one_call_with_thinking_and_text_before_it(qwen):
    r = qwen.parse(f"<think>\nI need to look it up. {CALL}\n</think>\n\nLet me search.\n{CALL}")
    assert r == ToolCalls([ToolCall("search", {"query": "Zor"})], text="Let me search.")


def test_several_calls_in_one_turn(qwen):
    second = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 + 2"}}\n</tool_call>'
    r = qwen.parse(f"{CALL}\n{second}")
    assert isinstance(r, ToolCalls)
    assert [(c.name, c.arguments) for c in r.calls] == [("search", {"query": "Zor"}), ("calculator", {"expression": "1 + 2"})]


def test_calls_inside_think_are_not_calls(qwen):
    assert qwen.parse(f"<think>\nmaybe {CALL}\n</think>\n\nZor is a city.") == Answer("Zor is a city.")
    # The prompt opened <think> (text starts inside the block) and the model never closed it.
    assert qwen.parse(f"thinking {CALL}</think>\n\nDone.") == Answer("Done.")
    assert qwen.parse(f"Hmm <think> {CALL}") == Answer("Hmm")


def test_answers(qwen):
    assert qwen.parse("  The answer is 42.  ") == Answer("The answer is 42.")
    assert qwen.parse("<think>\nsum\n</think>\n\nSo: <answer> 42 </answer>") == Answer("42")
    assert qwen.parse("") == Answer("")


@pytest.mark.parametrize("text, reason", [
    ('<tool_call>\n{"name": "search", "arguments": {"query": }\n</tool_call>', "not valid JSON"),
    ("<tool_call>\n[1, 2]\n</tool_call>", "JSON object"),
    ('<tool_call>\n{"arguments": {}}\n</tool_call>', '"name"'),
    ('<tool_call>\n{"name": "search", "arguments": [1]}\n</tool_call>', "must be a JSON object"),
    ('<tool_call>\n{"name": "search", "arguments": "{oops"}\n</tool_call>', "a string that is not valid JSON"),
    ('<tool_call>\n{"name": "search", "arguments": {}}', "not closed"),
    ('{"name": "search", "arguments": {}}\n</tool_call>', "without an opening"),
])
def test_malformed_calls_say_why(qwen, text, reason):
    r = qwen.parse(text)
    assert isinstance(r, Malformed) and reason in r.reason


def test_one_bad_call_among_good_ones_is_malformed_and_named(qwen):
    r = qwen.parse(CALL + "\n<tool_call>\n{bad}\n</tool_call>")
    assert isinstance(r, Malformed) and r.reason.startswith("tool call 2:")


def test_argument_spellings(qwen):
    r = qwen.parse('<tool_call>\n{"name": "search", "arguments": "{\\"query\\": \\"Zor\\"}"}\n</tool_call>')
    assert r == ToolCalls([ToolCall("search", {"query": "Zor"})])
    r = qwen.parse('<tool_call>{"name": "search", "parameters": {"query": "Zor"}}</tool_call>')
    assert r == ToolCalls([ToolCall("search", {"query": "Zor"})])
    assert qwen.parse('<tool_call>{"name": "now"}</tool_call>') == ToolCalls([ToolCall("now", {})])


def test_unknown_tools_given_the_known_names(tiny_tokenizer, qwen):
    assert isinstance(qwen.parse(CALL), ToolCalls)  # no list of names: the runner decides
    r = qwen.parse(CALL, known_tools={"calculator"})
    assert isinstance(r, Malformed) and "'search'" in r.reason and "calculator" in r.reason
    strict = Qwen3ToolManager(tiny_tokenizer, known_tools=["search"])
    assert isinstance(strict.parse(CALL), ToolCalls)
    assert isinstance(strict.parse(CALL.replace("search", "serch")), Malformed)


def test_text_after_a_call(tiny_tokenizer, qwen):
    text = CALL + "\nI will wait for the result."
    assert qwen.parse(text) == ToolCalls([ToolCall("search", {"query": "Zor"})], text="I will wait for the result.")
    r = Qwen3ToolManager(tiny_tokenizer, trailing_text="malformed").parse(text)
    assert isinstance(r, Malformed) and "after the last </tool_call>" in r.reason
    assert isinstance(Qwen3ToolManager(tiny_tokenizer, trailing_text="malformed").parse(CALL + "\n"), ToolCalls)


def test_format_turn_round_trips_through_parse(qwen):
    turn = ModelTurn([ToolCall("search", {"query": "Zürich", "k": 3}), ToolCall("now", {})], "Two calls.", "why")
    text = qwen.format_turn(turn)
    assert text.startswith("<think>\nwhy\n</think>\n\nTwo calls.\n<tool_call>\n")
    assert qwen.parse(text) == ToolCalls(turn.calls, text="Two calls.")


def test_render_prompt_and_observation_real_qwen3(qwen3_tokenizer):
    qwen = Qwen3ToolManager(qwen3_tokenizer)
    text = qwen3_tokenizer.decode(qwen.render_prompt([{"role": "user", "content": "Where is Zor?"}], TOOLS))
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert '{"type": "function", "function": {"name": "search"' in text
    assert text.endswith("<|im_start|>user\nWhere is Zor?<|im_end|>\n<|im_start|>assistant\n")
    obs = qwen.render_observation([ToolResult("Zor is a city."), ToolResult.error("Error: timeout")])
    assert qwen3_tokenizer.decode(obs) == (
        "\n<|im_start|>user\n<tool_response>\nZor is a city.\n</tool_response>\n<tool_response>\nError: timeout"
        "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert qwen3_tokenizer.convert_tokens_to_ids("<|im_end|>") in qwen.stop_token_ids()
    assert qwen.stop_strings() == []


def test_thinking_disabled_puts_the_empty_think_block_in_prompt_and_observation(qwen3_tokenizer):
    qwen = Qwen3ToolManager(qwen3_tokenizer, enable_thinking=False)
    prompt = qwen3_tokenizer.decode(qwen.render_prompt([{"role": "user", "content": "hi"}], []))
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "# Tools" not in prompt  # no tools: no tools block
    assert qwen3_tokenizer.decode(qwen.render_observation([ToolResult("x")])).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not qwen.thinks and Qwen3ToolManager(qwen3_tokenizer).thinks


def test_tokenizer_without_template_gets_rlfactorys_qwen3_template(tiny_tokenizer):
    import copy

    bare = copy.deepcopy(tiny_tokenizer)
    bare.chat_template = None
    qwen = Qwen3ToolManager(bare)
    assert "<tool_response>" in qwen.template.template
    assert bare.decode(qwen.render_prompt([{"role": "user", "content": "hi"}], [])).endswith("<|im_start|>assistant\n")


def test_think_tags_inside_call_arguments_are_arguments(qwen):
    text = '<think>\nok\n</think>\n\n<tool_call>\n{"name": "search", "arguments": {"query": "what do <think> and </think> mean"}}\n</tool_call>'
    assert qwen.parse(text) == ToolCalls([ToolCall("search", {"query": "what do <think> and </think> mean"})])


def test_json_limits_are_malformed_with_a_reason_never_an_exception(qwen):
    big = qwen.parse('<tool_call>{"name":"f","arguments":{"x":' + "1" * 4301 + "}}</tool_call>")
    assert isinstance(big, Malformed) and "a number with 4301 digits (at most 4300)" in big.reason
    assert qwen.parse('<tool_call>{"name":"f","arguments":{"x":' + "1" * 4300 + "}}</tool_call>") == ToolCalls(
        [ToolCall("f", {"x": int("1" * 4300)})])
    deep_string = '<tool_call>{"name":"f","arguments":"' + "[" * 2000 + "]" * 2000 + '"}</tool_call>'
    deep = qwen.parse(deep_string)
    assert isinstance(deep, Malformed) and deep.reason == "the arguments of 'f' are a string that is nested deeper than 100 levels"
    deep = qwen.parse('<tool_call>{"name":"f","arguments":{"x":' + "[" * 150 + "]" * 150 + "}}</tool_call>")
    assert isinstance(deep, Malformed) and "nested deeper than 100 levels" in deep.reason
    for bad in ("NaN", "Infinity", "1e999"):
        r = qwen.parse('<tool_call>{"name":"f","arguments":{"x":' + bad + "}}</tool_call>")
        assert isinstance(r, Malformed) and bad in r.reason


def test_key_order_does_not_matter(qwen):
    r = qwen.parse('<tool_call>{"arguments": {"query": "Zor"}, "type": "function", "name": "search"}</tool_call>')
    assert r == ToolCalls([ToolCall("search", {"query": "Zor"})])


def test_observations_render_the_fixed_context_once(tiny_tokenizer):
    """Rendering an observation renders the chat template for its context once per manager, not per
    tool result (it runs on the event loop beside generation); the texts are unchanged."""
    qwen = Qwen3ToolManager(tiny_tokenizer)
    renders = []
    render = qwen.template.render
    qwen.template.render = lambda *a, **k: renders.append(a) or render(*a, **k)
    texts = [qwen.observation_text([ToolResult(text=f"passage {i}")]) for i in range(5)]
    # the context once, its skeleton once (template.py), then each fill checked against a full render
    assert len(renders) == 1 + 1 + 5
    fresh = Qwen3ToolManager(tiny_tokenizer)
    assert texts == [fresh.observation_text([ToolResult(text=f"passage {i}")]) for i in range(5)]
    assert "passage 3" in texts[3]
