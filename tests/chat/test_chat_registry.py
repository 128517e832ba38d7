"""make_tool_manager: named families, guessing from the model, user classes from module:Class."""

from __future__ import annotations

import copy
import textwrap

import pytest

from rlfactory.chat import Llama3ToolManager, Qwen3ToolManager, SearchR1ToolManager, ToolCalls, make_tool_manager
from rlfactory.chat.registry import guess_family
from rlfactory.config import ConfigError


def test_named_families_and_options(tiny_tokenizer):
    assert isinstance(make_tool_manager(tiny_tokenizer, "qwen3"), Qwen3ToolManager)
    m = make_tool_manager(tiny_tokenizer, "searchr1", tool_name="retrieve")
    assert isinstance(m, SearchR1ToolManager) and m.parse("<search>x</search>").calls[0].name == "retrieve"
    assert make_tool_manager(tiny_tokenizer, "qwen3", enable_thinking=False).enable_thinking is False
    with pytest.raises(ValueError, match="unknown ToolManager family 'mistral'"):
        make_tool_manager(tiny_tokenizer, "mistral")


def test_family_from_model_type_or_template(tiny_tokenizer, qwen3_tokenizer, llama3_tokenizer):
    assert isinstance(make_tool_manager(tiny_tokenizer, model_type="qwen3"), Qwen3ToolManager)
    assert isinstance(make_tool_manager(tiny_tokenizer), Qwen3ToolManager)  # from the template
    assert isinstance(make_tool_manager(qwen3_tokenizer, None, "qwen2"), Qwen3ToolManager)
    assert isinstance(make_tool_manager(llama3_tokenizer), Llama3ToolManager)
    assert guess_family(llama3_tokenizer, "llama") == "llama3"
    bare = copy.deepcopy(tiny_tokenizer)
    bare.chat_template = None
    assert guess_family(bare) == "qwen3"  # from the vocabulary's <|im_start|>


def test_unknown_model_is_an_error_that_says_what_to_set():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")))
    with pytest.raises(ValueError, match="set model.family"):
        make_tool_manager(tok, model_type="gpt2")


def test_user_class_from_module_colon_class(tiny_tokenizer, tmp_path, monkeypatch):
    (tmp_path / "my_family.py").write_text(textwrap.dedent("""
        from rlfactory.chat import Qwen3ToolManager

        class Shouty(Qwen3ToolManager):
            family = "shouty"
            def __init__(self, tokenizer, volume=1):
                super().__init__(tokenizer)
                self.volume = volume

        class NotAManager:
            def __init__(self, tokenizer):
                pass
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    m = make_tool_manager(tiny_tokenizer, "my_family:Shouty", volume=11)
    assert m.family == "shouty" and m.volume == 11
    assert isinstance(m.parse('<tool_call>{"name": "a"}</tool_call>'), ToolCalls)
    with pytest.raises(ValueError, match="lacks render_prompt"):
        make_tool_manager(tiny_tokenizer, "my_family:NotAManager")
    with pytest.raises(ConfigError, match="^model.family: 'my_family' has no class 'Missing'"):
        make_tool_manager(tiny_tokenizer, "my_family:Missing")
    with pytest.raises(ConfigError, match="^model.family: no module named 'no_such_module_xyz'"):
        make_tool_manager(tiny_tokenizer, "no_such_module_xyz:Thing")
