"""`qwen2_5_vl` ToolManager (also `qwen3_vl`): the Qwen3 tool format with images, for Qwen2.5-VL and
Qwen3-VL models.

Calls, answers and thinking are the `qwen3` family's (Hermes `<tool_call>{json}</tool_call>`); it
does that part. Images appear where the chat template puts `<|vision_start|><|image_pad|>
<|vision_end|>`: in a user or system message's image parts (a dataset row's question), and in
`<tool_response>` blocks after the result's text (`ToolResult.images`). Each `<|image_pad|>` is
then expanded to `grid_t * grid_h * grid_w / merge_size**2` pads, the grid being what the model's
image processor (its `preprocessor_config.json`) gives that image: the model's vision encoder
replaces those pads by as many image embeddings, so the count must match exactly.

The template: the tokenizer's own when it renders both tools and image parts (Qwen3-VL's does);
otherwise rlfactory's `qwen3_vl.jinja` (Qwen2.5-VL's own template renders no tools).

Observation truncation never cuts an image: `fit_images` drops whole images (the last first) with a
short note in their place until the observation fits; the text is then cut as for any family.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from rlfactory.chat.base import ParseResult
from rlfactory.chat.qwen3 import END_OF_TURN, Qwen3ToolManager
from rlfactory.chat.template import ModelTurn, openai_tools
from rlfactory.chat.templates import load_template
from rlfactory.chat.vision import DROPPED_NOTE, Rendered, expand_pads, result_content, split_images
from rlfactory.config import ConfigError
from rlfactory.images import Image, ImageError
from rlfactory.tools.base import ToolCall, ToolResult, ToolSpec

IMAGE_PAD = "<|image_pad|>"
PROCESSOR_FILE = "preprocessor_config.json"
_GRID_CACHE = 1024


def _template_for(tokenizer: Any, chat_template: str | None) -> str:
    own = getattr(tokenizer, "chat_template", None)
    if chat_template:
        return chat_template
    if isinstance(own, str) and "<tool_call>" in own and IMAGE_PAD in own:
        return own
    return load_template("qwen3_vl")


def load_image_processor(tokenizer: Any) -> Any:
    """The image processor saved beside the tokenizer (`preprocessor_config.json`), offline. A
    ConfigError (one line naming the folder) when there is none or it cannot be read."""
    from transformers import AutoImageProcessor

    where = getattr(tokenizer, "name_or_path", "") or ""
    try:
        return AutoImageProcessor.from_pretrained(where, local_files_only=True)
    except (OSError, ValueError) as e:
        need = "the qwen2_5_vl ToolManager turns images into pixels with the model's image processor"
        if where and Path(where).is_dir() and not (Path(where) / PROCESSOR_FILE).is_file():
            raise ConfigError(f"the vision-language model folder {where!r} has no {PROCESSOR_FILE} ({need}, whose "
                              f"settings are saved there beside the tokenizer: copy it from the checkpoint it "
                              f"came from)") from None
        # transformers' reasons run over several lines; the first names the file and the problem
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{need}: reading it from {where!r} failed: {first}") from None


def save_image_processor(tokenizer: Any, folder: str | Path) -> bool:
    """Copy the image processor's settings (`preprocessor_config.json`) from the folder the
    tokenizer was loaded from into `folder`, where the model and tokenizer are being saved, so that
    the saved vision-language model loads with them (sft's model, every checkpoint). False when the
    tokenizer's folder has none (a text-only model): nothing to copy."""
    import shutil

    src = Path(getattr(tokenizer, "name_or_path", "") or "") / PROCESSOR_FILE
    if not src.is_file():
        return False
    dst = Path(folder) / PROCESSOR_FILE
    if src.resolve() != dst.resolve():
        shutil.copyfile(src, dst)
    return True


class QwenVLToolManager:
    """ToolManager for Qwen2.5-VL / Qwen3-VL chat formats: Qwen3 tool calls plus images."""

    family = "qwen2_5_vl"

    def __init__(
        self,
        tokenizer: Any,
        *,
        image_processor: Any = None,
        enable_thinking: bool | None = None,
        known_tools: Collection[str] | None = None,
        trailing_text: Literal["allow", "malformed"] = "allow",
        chat_template: str | None = None,
        image_dir: str | None = None,
    ):
        """`image_processor`: the model's (default: loaded from the tokenizer's folder). `image_dir`:
        where relative image paths in dataset rows are read from (default: the working directory).
        The other options are the `qwen3` family's."""
        self.text = Qwen3ToolManager(tokenizer, enable_thinking=enable_thinking, known_tools=known_tools,
                                     trailing_text=trailing_text, chat_template=_template_for(tokenizer, chat_template))
        self.tokenizer = tokenizer
        self.template = self.text.template
        self.image_processor = image_processor if image_processor is not None else load_image_processor(tokenizer)
        self.merge_size = int(getattr(self.image_processor, "merge_size", 2))
        self.image_dir = image_dir
        self.pad_id = self.template.token_id(IMAGE_PAD)
        if self.pad_id is None:
            raise ValueError(f"the qwen2_5_vl ToolManager needs a tokenizer with the {IMAGE_PAD} token "
                             f"(a Qwen2.5-VL / Qwen3-VL tokenizer); {getattr(tokenizer, 'name_or_path', '')!r} has none")
        self._grids: OrderedDict[str, tuple[int, int, int]] = OrderedDict()

    # -- ToolManager protocol --------------------------------------------------------------
    def render_prompt(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec]) -> list[int]:
        return self.render_prompt_images(messages, tools).ids

    def parse(self, text: str, known_tools: Collection[str] | None = None) -> ParseResult:
        return self.text.parse(text, known_tools)

    def render_observation(self, results: Sequence[ToolResult]) -> list[int]:
        return self.render_observation_images(results).ids

    def stop_token_ids(self) -> list[int]:
        return self.text.stop_token_ids()

    def stop_strings(self) -> list[str]:
        return []

    # -- images ----------------------------------------------------------------------------
    def render_prompt_images(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec]) -> Rendered:
        """Prompt ids with image pads expanded, and the messages' images. Raises ImageError (one
        line) for an image part that is not a readable image."""
        plain, images = split_images(messages, self.image_dir)
        text = self.template.render(plain, openai_tools(tools), add_generation_prompt=True)
        return self._expand(self.template.encode(text), images)

    def render_observation_images(self, results: Sequence[ToolResult]) -> Rendered:
        results = [self._shown(r) for r in results]
        images = [im for r in results for im in r.images]
        return self._expand(self.template.encode(self.observation_text(results)), images)

    def fit_images(self, results: Sequence[ToolResult], limit: int) -> tuple[list[ToolResult], list[int]]:
        shown = [self._shown(r) for r in results]
        out = list(shown)
        notes = [r.text[: len(r.text) - len(o.text)] for r, o in zip(shown, results)]  # _shown's own lines
        dropped = [""] * len(out)
        while any(r.images for r in out):
            bare = [replace(r, text=n + d) for r, n, d in zip(out, notes, dropped)]
            if len(self.render_observation(bare)) <= limit:
                break
            i = max(k for k, r in enumerate(out) if r.images)
            dropped[i] += DROPPED_NOTE + "\n"
            out[i] = replace(out[i], images=out[i].images[:-1])
        out = [replace(r, text=d + r.text) for r, d in zip(out, dropped)]
        return out, [len(n) + len(d) for n, d in zip(notes, dropped)]

    def grid(self, image: Image) -> tuple[int, int, int]:
        """The image's (t, h, w) patch grid, as the image processor gives it (cached by content hash)."""
        cached = self._grids.get(image.sha256)
        if cached is not None:
            self._grids.move_to_end(image.sha256)
            return cached
        try:
            out = self.image_processor(images=[image.to_pil()], return_tensors="pt")
        except ValueError as e:  # e.g. an aspect ratio past the processor's 200:1
            raise ImageError(f"the image processor refuses a {image.width}x{image.height} image: {e}") from None
        t, h, w = (int(x) for x in out["image_grid_thw"][0].tolist())
        self._grids[image.sha256] = (t, h, w)
        if len(self._grids) > _GRID_CACHE:
            self._grids.popitem(last=False)
        return t, h, w

    def image_tokens(self, image: Image) -> int:
        """How many pad tokens stand for `image`."""
        t, h, w = self.grid(image)
        return t * h * w // (self.merge_size ** 2)

    def pixel_inputs(self, images: Sequence[Image]) -> dict[str, Any]:
        """The model's image inputs for `images`: `pixel_values` (num_patches, C*T*P*P) and
        `image_grid_thw` (num_images, 3), as the image processor computes them (deterministic)."""
        out = self.image_processor(images=[im.to_pil() for im in images], return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}

    def model_inputs(self, ids: Sequence[int], images: Sequence[Image]) -> dict[str, Any]:
        """Keyword arguments of the model's forward for one sequence and its images, in order:
        `input_ids` [1, L], `mm_token_type_ids` [1, L] (1 on image pads: without it transformers
        cannot build the 3-D M-RoPE positions and falls back to 1-D ones), and, when there are
        images, `pixel_values` and `image_grid_thw` (`pixel_inputs`)."""
        import torch

        input_ids = torch.tensor([list(ids)], dtype=torch.long)
        out: dict[str, Any] = {"input_ids": input_ids, "mm_token_type_ids": (input_ids == self.pad_id).int()}
        if images:
            out.update(self.pixel_inputs(images))
        return out

    def _shown(self, result: ToolResult) -> ToolResult:
        """`result` without the images the processor refuses, each replaced by a line saying why."""
        if not result.images:
            return result
        kept, notes = [], []
        for im in result.images:
            try:
                self.grid(im)
                kept.append(im)
            except ImageError as e:
                notes.append(f"[image not shown: {e}]")
        if not notes:
            return result
        return replace(result, images=kept, text="".join(n + "\n" for n in notes) + result.text)

    def _expand(self, ids: list[int], images: list[Image]) -> Rendered:
        grids = [self.grid(im) for im in images]
        counts = [t * h * w // (self.merge_size ** 2) for t, h, w in grids]
        return Rendered(expand_pads(ids, self.pad_id, counts), images, grids)

    # -- formats ------------------------------------------------------------------------------
    def observation_text(self, results: Sequence[ToolResult]) -> str:
        """Tool turn(s) plus the next assistant header, one unexpanded pad per image."""
        context = [{"role": "user", "content": "?"},
                   self.text.assistant_message(ModelTurn([ToolCall("f", {})], reasoning="."))]
        tool_messages = [{"role": "tool", "content": result_content(r)} for r in results]
        return self.template.delta_after_turn(context, tool_messages, END_OF_TURN)

    def format_turn(self, turn: ModelTurn) -> str:
        return self.text.format_turn(turn)

    def assistant_message(self, turn: ModelTurn) -> dict[str, Any]:
        return self.text.assistant_message(turn)

    # -- token contract -------------------------------------------------------------------------
    @property
    def thinks(self) -> bool:
        return self.text.thinks

    def model_turn_ids(self, turn: ModelTurn) -> list[int]:
        return self.text.model_turn_ids(turn)

    def reference_ids(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec],
                      steps: Sequence[ModelTurn | Sequence[ToolResult]]) -> list[int]:
        """The whole conversation rendered at once by the template, image pads expanded."""
        plain, images = split_images(messages, self.image_dir)
        conv = list(plain)
        for step in steps:
            if isinstance(step, ModelTurn):
                conv.append(self.assistant_message(step))
            else:
                shown = [self._shown(r) for r in step]
                images += [im for r in shown for im in r.images]
                conv.extend({"role": "tool", "content": result_content(r)} for r in shown)
        ids = self.template.reference_ids(conv, openai_tools(tools), END_OF_TURN)
        return self._expand(ids, images).ids


class Qwen3VLToolManager(QwenVLToolManager):
    """The same format under Qwen3-VL's name."""

    family = "qwen3_vl"
