"""Chat templates that rlfactory ships.

- `qwen3.jinja`: the Qwen3 chat template (tool calling in Hermes style), copied verbatim from the
  Qwen3 tokenizer config (Apache-2.0). rlfactory's tiny model uses it.
- `llama3.jinja`: a Llama 3.1-style tool-calling template (JSON calls
  `{"name": ..., "parameters": ...}`, tool results in the `ipython` role), for Llama 3 tokenizers
  whose own template has no tool support.
- `qwen3_vl.jinja`: the Qwen3 template with Qwen3-VL's handling of content lists (image parts render
  `<|vision_start|><|image_pad|><|vision_end|>`, in user, system and tool messages); the
  `qwen2_5_vl` family uses it when a model's own template renders no tools (Qwen2.5-VL's), and
  rlfactory's tiny vision-language model ships it.
- `qwen3_vl_compact.jinja`: `qwen3_vl.jinja` with the tools listed as one line of signatures
  (`Tools: zoom(picture, x, y, size)`) instead of JSON schemas and instructions; calls and results
  render the same. `tiny-vl:1m-compact` ships it (short prompts for the CPU visual demo).
"""

from __future__ import annotations

from importlib import resources


def load_template(name: str) -> str:
    """The text of the shipped template `name` (`qwen3`, `llama3`, `qwen3_vl` or `qwen3_vl_compact`)."""
    return resources.files(__package__).joinpath(f"{name}.jinja").read_text(encoding="utf-8")
