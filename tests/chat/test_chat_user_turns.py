"""A user turn in the middle of an episode (an env's `next_user_turn`): `render_user_turn` is the exact
delta the chat template adds after an assistant turn for the user message and the next assistant
header, on real templates (Qwen3 with and without thinking, Llama 3.1, SmolLM2's plain ChatML)."""

from __future__ import annotations

import copy

import pytest

from rlfactory.chat import Llama3ToolManager, ModelTurn, Qwen3ToolManager, TemplateToolManager
from rlfactory.chat.base import UserTurnRenderer
from rlfactory.tools.base import ToolCall, ToolResult, ToolSpec

TOOLS = [ToolSpec("cd", "Change directory.", {"type": "object", "properties": {"folder": {"type": "string"}}})]
OPENING = [{"role": "user", "content": "Go to the folder 'docs'."}]
NEXT = "Now list what is in it, please."

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def episode_ids(m, answer: str) -> list[int]:
    """prompt + call turn + its result + answer turn + the next user turn, as the engine builds them."""
    call = ModelTurn([ToolCall("cd", {"folder": "docs"})])
    ids = list(m.render_prompt(OPENING, TOOLS)) + m.model_turn_ids(call)
    ids += m.render_observation([ToolResult("{'current_working_directory': 'docs'}")])
    ids += m.model_turn_ids(ModelTurn(content=answer))
    return ids + m.render_user_turn(NEXT)


def whole(m, answer: str) -> list[dict]:
    call = ModelTurn([ToolCall("cd", {"folder": "docs"})])
    return OPENING + [m.assistant_message(call), {"role": "tool", "content": "{'current_working_directory': 'docs'}"},
                      m.assistant_message(ModelTurn(content=answer)), {"role": "user", "content": NEXT}]


def test_llama31_user_turn_keeps_the_prefix_property(llama31_tokenizer):
    m = Llama3ToolManager(llama31_tokenizer)
    assert isinstance(m, UserTurnRenderer)
    conv = whole(m, "Done.")
    conv[2] = {"role": "ipython", "content": conv[2]["content"]}
    reference = m.template.encode(m.template.render(conv, [t.openai_schema() for t in TOOLS], add_generation_prompt=True))
    ids = episode_ids(m, "Done.")
    assert ids == reference
    assert llama31_tokenizer.decode(m.render_user_turn(NEXT)) == (
        f"<|start_header_id|>user<|end_header_id|>\n\n{NEXT}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


def test_smollm2_chatml_user_turn_keeps_the_prefix_property(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = SMOLLM2_TEMPLATE
    m = TemplateToolManager(tok)
    assert m.injected
    reference = m.template.encode(m.render_text(whole(m, "Done."), TOOLS, add_generation_prompt=True))
    assert episode_ids(m, "Done.") == reference
    assert tok.decode(m.render_user_turn(NEXT)) == f"\n<|im_start|>user\n{NEXT}<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("thinking", [False, True])
def test_qwen3_user_turn_is_what_the_template_adds_after_the_answer(qwen3_tokenizer, thinking):
    # Qwen3's template drops the reasoning of turns before the last user message, so the whole
    # conversation re-rendered differs earlier on; what follows the answer's end must not.
    m = Qwen3ToolManager(qwen3_tokenizer, enable_thinking=thinking)
    text = qwen3_tokenizer.decode(m.render_user_turn(NEXT))
    expected = f"\n<|im_start|>user\n{NEXT}<|im_end|>\n<|im_start|>assistant\n"
    assert text == expected + ("" if thinking else "<think>\n\n</think>\n\n")
    full = m.template.render(whole(m, "Done."), [t.openai_schema() for t in TOOLS], add_generation_prompt=True)
    assert full.endswith("Done.<|im_end|>" + text)
    assert m.render_user_turn(NEXT) == m.template.encode(text)  # encodes to the same ids on its own
