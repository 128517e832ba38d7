"""Pick and build a ToolManager: a named family, a user's `module:Class`, or one guessed from the model."""

from __future__ import annotations

from typing import Any

from rlfactory.chat.base import ToolManager
from rlfactory.chat.llama3 import Llama3ToolManager
from rlfactory.chat.qwen3 import Qwen3ToolManager
from rlfactory.chat.qwen_vl import Qwen3VLToolManager, QwenVLToolManager
from rlfactory.chat.searchr1 import SearchR1ToolManager
from rlfactory.chat.template_family import TemplateToolManager
from rlfactory.registry import Registry

FAMILIES: Registry[type] = Registry("ToolManager family", "model.family", "class", remember_refs=False)
for _name, _cls in (("qwen3", Qwen3ToolManager), ("llama3", Llama3ToolManager), ("searchr1", SearchR1ToolManager),
                    ("template", TemplateToolManager), ("qwen2_5_vl", QwenVLToolManager),
                    ("qwen3_vl", Qwen3VLToolManager)):
    FAMILIES.add(_name, _cls)
# config.model_type -> family, used only when the tokenizer has no chat template to go by
_MODEL_TYPES = {
    "qwen3": "qwen3", "qwen3_moe": "qwen3", "qwen2": "qwen3", "qwen2_moe": "qwen3",
    "llama": "llama3", "llama4": "llama3",
    "qwen2_5_vl": "qwen2_5_vl", "qwen2_vl": "qwen2_5_vl", "qwen3_vl": "qwen3_vl",
}


def guess_family(tokenizer: Any, model_type: str | None = None) -> str:
    """The family for a model, read from its chat template (never from `model_type` when there is
    one: SmolLM2 is `model_type: llama` but speaks ChatML):

    - Qwen vision markup (`<|vision_start|>`) with ChatML -> qwen2_5_vl (Qwen2.5-VL's own template
      renders no tools; the family then uses rlfactory's `qwen3_vl` template);
    - Hermes/Qwen markup (`<|im_start|>` with `<tool_call>` and `<tool_response>`) -> qwen3;
    - Llama 3 headers (`<|start_header_id|>`) -> llama3;
    - any other template (plain ChatML without tools, Mistral, Gemma, ...) -> template, which works
      from the template itself and puts the tool list in the system prompt when it ignores tools.
    Without a template: the vocabulary's markers, then `model_type`; else a ValueError."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # named templates: the default one speaks for the model
        template = template.get("default") or next(iter(template.values()), "")
    if template:
        if "<|im_start|>" in template and "<|vision_start|>" in template:
            return "qwen2_5_vl"
        if "<|im_start|>" in template and "<tool_call>" in template and "<tool_response>" in template \
                and "<tool_call>[" not in template:
            return "qwen3"
        if "<|start_header_id|>" in template:
            return "llama3"
        return "template"
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    if "<|im_start|>" in vocab:
        return "qwen3"
    if "<|start_header_id|>" in vocab:
        return "llama3"
    if model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type]
    raise ValueError(f"cannot tell the ToolManager family of this model (model_type={model_type!r}, no chat "
                     f"template); set model.family to one of {sorted(FAMILIES)} or module:Class")


def make_tool_manager(tokenizer: Any, family: str | None = None, model_type: str | None = None,
                      **opts: Any) -> ToolManager:
    """Build the ToolManager for `tokenizer`. `family`: qwen3 | llama3 | searchr1 | template | qwen2_5_vl |
    qwen3_vl | module:Class, or None to guess from `model_type` / the chat template. `opts` go to the
    class's constructor."""
    name = family or guess_family(tokenizer, model_type)
    cls = FAMILIES.lookup(name)
    manager = cls(tokenizer, **opts)
    missing = [m for m in ("render_prompt", "parse", "render_observation", "stop_token_ids") if not hasattr(manager, m)]
    if missing:
        raise ValueError(f"{name!r} is not a ToolManager: it lacks {', '.join(missing)}")
    return manager
