"""The `template` ToolManager family: prompts, model turns and observations from the tokenizer's own
chat template, verified by the token-contract checker against real templates (Qwen3, Llama 3.x,
SmolLM2's plain ChatML, a Mistral-style template), and loud failures where a template cannot keep
the prefix property."""

from __future__ import annotations

import copy

import pytest

from rlfactory.chat import (
    Answer, Malformed, ModelTurn, TemplateToolManager, TokenContractError, ToolCalls, check_token_contract,
    make_tool_manager,
)
from rlfactory.chat.contract import SAMPLE_MESSAGES, SAMPLE_TOOLS, sample_steps
from rlfactory.chat.registry import guess_family
from rlfactory.chat.templates import load_template
from rlfactory.tools.base import ToolCall, ToolResult

# SmolLM2-135M/360M-Instruct's template, verbatim: plain ChatML, no tools, prints any role as is.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# A Mistral-style template (tools before the last user turn, `[TOOL_CALLS][...]` calls, results in
# `[TOOL_RESULTS]`), written with the tiny tokenizer's eos as the end of turn.
MISTRAL_TEMPLATE = """{{ bos_token or '' }}{%- for m in messages %}
{%- if m.role == 'system' %}[SYSTEM_PROMPT]{{ m.content }}[/SYSTEM_PROMPT]
{%- elif m.role == 'user' %}{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST]{{ m.content }}[/INST]
{%- elif m.role == 'assistant' %}{{ m.content }}{% if m.tool_calls %}[TOOL_CALLS][{% for c in m.tool_calls %}{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}{% if not loop.last %}, {% endif %}{% endfor %}]{% endif %}{{ eos_token }}
{%- elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]
{%- endif %}{%- endfor %}"""

# Like MISTRAL_TEMPLATE, but it numbers tool results across the whole conversation: the text of a
# later observation depends on earlier turns, so it cannot be a fixed delta.
COUNTING_TEMPLATE = MISTRAL_TEMPLATE.replace("[TOOL_RESULTS]{{ m.content }}", "[TOOL_RESULTS {{ loop.index }}]{{ m.content }}")


def with_template(tokenizer, template):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def smollm2_like(tiny_tokenizer):
    return with_template(tiny_tokenizer, SMOLLM2_TEMPLATE)


def assert_contract(manager, tokenizer):
    check_token_contract(manager, tokenizer)
    steps = sample_steps(manager.thinks)
    ids = list(manager.render_prompt(SAMPLE_MESSAGES, SAMPLE_TOOLS))
    for step in steps:
        ids += manager.model_turn_ids(step) if isinstance(step, ModelTurn) else manager.render_observation(step)
    text = tokenizer.decode(ids)
    assert "Stiorn" in text and "search timed out" in text and "Zürich" in text  # not vacuous
    assert ids == manager.reference_ids(SAMPLE_MESSAGES, SAMPLE_TOOLS, steps)
    return text


def test_contract_with_the_real_qwen3_template(qwen3_tokenizer):
    m = TemplateToolManager(qwen3_tokenizer)
    assert m.profile.renders_tools and m.profile.renders_calls and m.profile.renders_reasoning and not m.injected
    assert m.call_format.name == "hermes" and m.thinks
    text = assert_contract(m, qwen3_tokenizer)
    assert "<tool_response>" in text and "<think>" in text


def test_contract_with_real_llama3_templates(llama3_tokenizer, llama31_tokenizer):
    for tok in (llama3_tokenizer, llama31_tokenizer):  # the packages' plain templates ignore tools: injected
        m = TemplateToolManager(tok)
        assert m.injected and m.end_of_turn == "<|eot_id|>"
        assert "<tool_response>" in assert_contract(m, tok)
    # rlfactory's Llama 3.1-style template renders tools and one call per message natively.
    m = TemplateToolManager(llama31_tokenizer, chat_template=load_template("llama3"))
    assert not m.injected and m.call_format.name == "llama3_json" and not m.profile.multi_calls
    text = assert_contract(m, llama31_tokenizer)
    assert '"parameters"' in text and "ipython" in text


def test_templates_that_ignore_tools_get_them_in_the_system_prompt(smollm2_like):
    assert guess_family(smollm2_like, model_type="llama") == "template"  # ChatML, whatever model_type says
    m = make_tool_manager(smollm2_like, model_type="llama")
    assert isinstance(m, TemplateToolManager) and m.injected and m.call_format.name == "hermes"
    prompt = smollm2_like.decode(m.render_prompt(SAMPLE_MESSAGES, SAMPLE_TOOLS))
    assert prompt.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n")
    assert '{"type": "function", "function": {"name": "search"' in prompt and "<tool_call>" in prompt
    obs = smollm2_like.decode(m.render_observation([ToolResult("4,200 people"), ToolResult("founded by Stiorn")]))
    assert obs == ("\n<|im_start|>user\n<tool_response>\n4,200 people\n</tool_response>\n<tool_response>\n"
                   "founded by Stiorn\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    text = assert_contract(m, smollm2_like)
    assert "<|im_start|>tool" not in text
    turn = smollm2_like.decode(m.model_turn_ids(ModelTurn([ToolCall("search", {"query": "Brathor"})])))
    assert turn == '<tool_call>\n{"name": "search", "arguments": {"query": "Brathor"}}\n</tool_call><|im_end|>'
    assert m.parse(turn.removesuffix("<|im_end|>")) == ToolCalls([ToolCall("search", {"query": "Brathor"})])
    assert m.parse("It is 4,200.") == Answer("It is 4,200.")
    # Messages with OpenAI-style calls and tool results (as an env's solver writes them) render the same way.
    convo = SAMPLE_MESSAGES + [
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "search", "arguments": {"query": "Brathor"}}}]},
        {"role": "tool", "content": "4,200 people"},
    ]
    rendered = smollm2_like.decode(m.render_prompt(convo, SAMPLE_TOOLS))
    assert rendered.endswith("<|im_start|>user\n<tool_response>\n4,200 people\n</tool_response><|im_end|>\n"
                             "<|im_start|>assistant\n")


def test_a_json_list_inside_tool_call_smollm2_17b_style(smollm2_like):
    m = TemplateToolManager(smollm2_like, call_format="hermes_list")
    assert "return a json list" in smollm2_like.decode(m.render_prompt(SAMPLE_MESSAGES, SAMPLE_TOOLS))
    assert_contract(m, smollm2_like)
    calls = [ToolCall("lookup", {"query": "Brathor", "attribute": "founder"}), ToolCall("search", {"query": "x"})]
    text = smollm2_like.decode(m.model_turn_ids(ModelTurn(calls)))
    assert text.startswith('<tool_call>[{"name": "lookup"')
    assert m.parse(text.removesuffix("<|im_end|>")) == ToolCalls(calls)


def test_a_mistral_style_template(tiny_tokenizer):
    tok = with_template(tiny_tokenizer, MISTRAL_TEMPLATE)
    assert guess_family(tok) == "template"
    m = TemplateToolManager(tok)
    assert m.call_format.name == "mistral" and not m.injected and m.profile.multi_calls
    text = assert_contract(m, tok)
    assert "[TOOL_CALLS][" in text and "[TOOL_RESULTS]" in text
    turn = ModelTurn([ToolCall("search", {"query": "a"}), ToolCall("lookup", {"query": "b"})], "Two at once.")
    written = tok.decode(m.model_turn_ids(turn)).removesuffix(m.end_of_turn)
    assert m.parse(written) == ToolCalls(turn.calls, text="Two at once.")


def test_a_template_that_cannot_keep_the_prefix_property_fails_loudly(tiny_tokenizer, qwen3_tokenizer):
    tok = with_template(tiny_tokenizer, COUNTING_TEMPLATE)
    with pytest.raises(TokenContractError, match=r"for model my-org/counting: .*\(observation segment #1\): the chat template renders .4. .*OOL_RESULTS "):
        check_token_contract(TemplateToolManager(tok), tok, model_name="my-org/counting")
    # Qwen3 without thinking: its generation prompt writes an empty think block that the template
    # drops from earlier turns; the template family says so (the qwen3 family handles it).
    m = TemplateToolManager(qwen3_tokenizer, template_kwargs={"enable_thinking": False})
    with pytest.raises(TokenContractError, match=r"for model Qwen/Qwen3-0.6B: token contract broken at position \d+"
                                                 r" \(prompt segment #1\).*'<think>'"):
        check_token_contract(m, qwen3_tokenizer, model_name="Qwen/Qwen3-0.6B")
    check_token_contract(make_tool_manager(qwen3_tokenizer, "qwen3", enable_thinking=False), qwen3_tokenizer)


def test_family_guess_comes_from_the_template(tiny_tokenizer, qwen3_tokenizer, llama3_tokenizer):
    assert guess_family(qwen3_tokenizer, "llama") == "qwen3"  # the template wins over model_type
    assert guess_family(llama3_tokenizer, "qwen2") == "llama3"
    assert guess_family(with_template(tiny_tokenizer, MISTRAL_TEMPLATE), "mistral") == "template"
    list_style = SMOLLM2_TEMPLATE + "{# <tool_call>[ <tool_response> #}"
    assert guess_family(with_template(tiny_tokenizer, list_style)) == "template"


def test_parse_handles_reasoning_errors_and_unknown_tools(qwen3_tokenizer):
    m = TemplateToolManager(qwen3_tokenizer, known_tools=["search"])
    assert m.parse('<think>\nmaybe <tool_call>{"name": "x"}</tool_call>\n</think>\n\nDone.') == Answer("Done.")
    assert isinstance(m.parse('<tool_call>{"name": "other", "arguments": {}}</tool_call>'), Malformed)
    assert isinstance(m.parse('<tool_call>{"name": "search", "arguments": {</tool_call>'), Malformed)
    assert isinstance(m.parse('<tool_call>{"name": "search"'), Malformed)
    ok = m.parse('Looking.\n<tool_call>\n{"name": "search", "arguments": {"query": "q"}}\n</tool_call><|im_end|>')
    assert ok == ToolCalls([ToolCall("search", {"query": "q"})], text="Looking.")
