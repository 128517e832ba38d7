"""llama3 ToolManager: Llama 3.1 JSON calls, `ipython` results, on the real Llama 3 tokenizers."""

from __future__ import annotations

import pytest

from rlfactory.chat import Answer, Llama3ToolManager, Malformed, ModelTurn, ToolCalls
from rlfactory.tools.base import ToolCall, ToolResult, ToolSpec

TOOLS = [ToolSpec("search", "Search the web.", {"type": "object", "properties": {"query": {"type": "string"}}})]
CALL = '{"name": "search", "parameters": {"query": "Zor"}}'


@pytest.fixture(scope="module")
def llama(llama31_tokenizer) -> Llama3ToolManager:
    return Llama3ToolManager(llama31_tokenizer)


def test_parse_calls(llama):
    zor = ToolCall("search", {"query": "Zor"})
    assert llama.parse(CALL) == ToolCalls([zor])
    assert llama.parse("<|python_tag|>" + CALL) == ToolCalls([zor])
    assert llama.parse('{"name": "search", "arguments": {"query": "Zor"}}') == ToolCalls([zor])
    two = llama.parse(CALL + '\n{"name": "now", "parameters": {}}')
    assert isinstance(two, ToolCalls) and [c.name for c in two.calls] == ["search", "now"]
    listed = llama.parse(f'[{CALL}, {{"name": "now", "parameters": {{}}}}]')
    assert isinstance(listed, ToolCalls) and [c.name for c in listed.calls] == ["search", "now"]
    assert llama.parse("Let me check.\n" + CALL) == ToolCalls([zor], text="Let me check.")


def test_parse_answers_and_malformed(llama31_tokenizer, llama):
    assert llama.parse("Zor is a city in {the north}.") == Answer("Zor is a city in {the north}.")
    assert llama.parse('{"result": 3} is what I got') == Answer('{"result": 3} is what I got')
    assert llama.parse("<think>maybe " + CALL + "</think>It is Zor.") == Answer("It is Zor.")
    bad = llama.parse('{"name": "search", "parameters": {"query": "Zor"}')
    assert isinstance(bad, Malformed) and "not valid JSON" in bad.reason
    assert isinstance(llama.parse('{"name": "search", "parameters": 3}'), Malformed)
    assert isinstance(llama.parse("[]"), Answer)  # not a call attempt
    unknown = llama.parse(CALL, known_tools=["calculator"])
    assert isinstance(unknown, Malformed) and "unknown tool 'search'" in unknown.reason
    assert llama.parse(CALL + " and then more") == ToolCalls([ToolCall("search", {"query": "Zor"})], text="and then more")
    strict = Llama3ToolManager(llama31_tokenizer, trailing_text="malformed")
    assert isinstance(strict.parse(CALL + " and then more"), Malformed)


ZOR = ToolCall("search", {"query": "Zor"})


@pytest.mark.parametrize("text", [
    '{"parameters": {"query": "Zor"}, "name": "search"}',
    '{"type": "function", "name": "search", "parameters": {"query": "Zor"}}',
    '{"name": "search", "type": "function", "arguments": "{\\"query\\": \\"Zor\\"}"}',
    '{"type": "function", "function": {"arguments": {"query": "Zor"}, "name": "search"}}',
    '<|python_tag|>{"parameters": {"query": "Zor"}, "name": "search"}',
    '{\n  "parameters": {\n    "query": "Zor"\n  },\n  "name": "search"\n}',
    '  [{"parameters": {"query": "Zor"}, "name": "search"}]',
])
def test_calls_in_any_key_order_and_spelling(llama, text):
    assert llama.parse(text) == ToolCalls([ZOR])


@pytest.mark.parametrize("text", [
    'The user is {"name": "Alice"}.',
    '{"name": "Alice"}',
    'Here is the record:\n{"name": "Alice", "age": 31}\nThat is all.',
    'You could call {"name": "search", "parameters": {"query": "Zor"}} but I know it: Zor.',
    '{"type": "person", "name": "Alice", "parameters": {"age": 31}}',
])
def test_json_with_a_name_key_in_an_answer_is_not_a_call(llama, text):
    assert llama.parse(text) == Answer(text.strip())


def test_calls_after_other_json_and_separated_by_semicolons(llama):
    text = 'Known: {"name": "Alice"}\n{"name": "Alice", "age": 31}\n' + CALL + '; {"name": "now", "parameters": {}}'
    r = llama.parse(text)
    assert isinstance(r, ToolCalls) and [c.name for c in r.calls] == ["search", "now"]
    assert r.text == 'Known: {"name": "Alice"}\n{"name": "Alice", "age": 31}'
    assert llama.parse(CALL + '\n{"name": "Alice"}') == ToolCalls([ZOR], text='{"name": "Alice"}')


def test_broken_calls_and_python_tag_without_a_call_are_malformed(llama):
    for text in ('{"parameters": {"query": "Zor"}, "name": "search"', '[{"name": "search", "parameters": {]'):
        r = llama.parse(text)
        assert isinstance(r, Malformed) and "not valid JSON" in r.reason
    r = llama.parse("<|python_tag|>brave_search.call(query='Zor')")
    assert isinstance(r, Malformed) and "must be followed by a JSON tool call" in r.reason
    r = llama.parse('{"name": "f", "parameters": {"x": ' + "1" * 4301 + "}}")
    assert isinstance(r, Malformed) and "4301 digits" in r.reason
    r = llama.parse('{"name": "f", "parameters": "' + "[" * 2000 + "]" * 2000 + '"}')
    assert isinstance(r, Malformed) and "nested deeper than 100 levels" in r.reason


def test_format_turn_round_trips(llama):
    turn = ModelTurn([ToolCall("search", {"query": "Zürich"}), ToolCall("now", {})])
    assert llama.parse(llama.format_turn(turn)) == ToolCalls(turn.calls)


def test_render_prompt_puts_tools_in_the_first_user_message(llama31_tokenizer, llama):
    text = llama31_tokenizer.decode(llama.render_prompt([{"role": "user", "content": "Where is Zor?"}], TOOLS))
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n")
    assert text.count("<|begin_of_text|>") == 1
    assert '"name": "search"' in text and text.index('"name": "search"') > text.index("<|start_header_id|>user")
    assert text.endswith("Where is Zor?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


def test_observation_is_one_ipython_turn_per_result(llama31_tokenizer, llama):
    obs = llama.render_observation([ToolResult("Zor is a city."), ToolResult.error("Error: timeout")])
    assert llama31_tokenizer.decode(obs) == (
        "<|start_header_id|>ipython<|end_header_id|>\n\nZor is a city.<|eot_id|>"
        "<|start_header_id|>ipython<|end_header_id|>\n\nError: timeout<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    eot = llama31_tokenizer.convert_tokens_to_ids("<|eot_id|>")
    assert eot in llama.stop_token_ids()


def test_template_choice(llama3_tokenizer):
    # The package's plain Llama 3 template cannot render tool calls: the builtin one is used ...
    assert "tool_calls" not in llama3_tokenizer.chat_template
    assert "Environment: ipython" in Llama3ToolManager(llama3_tokenizer).template.template
    # ... unless asked for; then a call turn is plain assistant content.
    own = Llama3ToolManager(llama3_tokenizer, chat_template="tokenizer")
    assert own.template.template == llama3_tokenizer.chat_template
    assert own.assistant_message(ModelTurn([ToolCall("search", {"query": "Zor"})])) == {
        "role": "assistant", "content": '{"name": "search", "parameters": {"query": "Zor"}}'}
