"""What a vision-language ToolManager adds to the ToolManager contract: ids that come with images.

A VL family renders a prompt or an observation to `Rendered`: the token ids, with each image's
placeholder already expanded to as many pad tokens as the image processor's grid gives, and the
images those placeholders stand for, in order. `render_prompt` / `render_observation` still
return the ids alone, so a VL manager is an ordinary ToolManager everywhere images do not matter.

Images in chat messages follow the OpenAI / Hugging Face content-list form: a message's `content`
is a string or a list of parts, `{"type": "text", "text": ...}` and `{"type": "image", "image":
<value>}` (or `{"type": "image_url", "image_url": {"url": ...}}`), where the value is anything
`rlfactory.images.image_from_value` takes (an Image, PIL image, bytes, array, data URL, file path).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from rlfactory.images import Image, image_from_value
from rlfactory.tools.base import ToolResult, ToolSpec

DROPPED_NOTE = "[image not shown: it does not fit in the observation]"
"""What the model reads in place of an image that observation truncation dropped."""


@dataclass
class Rendered:
    """Token ids and the images their placeholders stand for (in order of their placeholders)."""

    ids: list[int]
    images: list[Image] = field(default_factory=list)
    grids: list[tuple[int, int, int]] = field(default_factory=list)
    """Each image's (t, h, w) patch grid as the image processor gives it."""


@runtime_checkable
class VisionToolManager(Protocol):
    """A ToolManager whose prompts and observations may hold images (e.g. `qwen2_5_vl`)."""

    family: str

    def render_prompt_images(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec]) -> Rendered:
        """`render_prompt` with the images of the messages' image parts."""
        ...

    def render_observation_images(self, results: Sequence[ToolResult]) -> Rendered:
        """`render_observation` with the results' images (`ToolResult.images`)."""
        ...

    def fit_images(self, results: Sequence[ToolResult], limit: int) -> tuple[list[ToolResult], list[int]]:
        """(`results` with images dropped, from the last, until the observation fits in `limit`
        tokens with nothing of the texts left but the notes; how many leading characters of each
        text are such notes). Each dropped image leaves DROPPED_NOTE at the start of its result's
        text; text truncation must keep those characters."""
        ...


@runtime_checkable
class PixelSource(Protocol):
    """What turns images into a vision-language model's pixel inputs (the `qwen2_5_vl` ToolManager):
    the trainer's batches and the local generator's prefill both ask it, so both see the same pixels."""

    def pixel_inputs(self, images: Sequence[Image]) -> dict[str, Any]:
        """`pixel_values` [patches, D] and `image_grid_thw` [images, 3] of `images`, in order."""
        ...


def is_image_part(part: Any) -> bool:
    return isinstance(part, dict) and (part.get("type") in ("image", "image_url") or "image" in part
                                       or "image_url" in part)


def split_images(messages: list[dict[str, Any]], base_dir: str | None = None
                 ) -> tuple[list[dict[str, Any]], list[Image]]:
    """(`messages` with each image part reduced to `{"type": "image"}`, the images in order).
    Raises `ImageError` (one line) for a part whose value is not a readable image."""
    out: list[dict[str, Any]] = []
    images: list[Image] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if is_image_part(part):
                    images.append(image_from_value(part, base_dir))
                    parts.append({"type": "image"})
                else:
                    parts.append(part)
            m = {**m, "content": parts}
        out.append(m)
    return out, images


def result_content(result: ToolResult) -> str | list[dict[str, Any]]:
    """A tool result as message content: its text, then its images (the text alone when none)."""
    if not result.images:
        return result.text
    return [{"type": "text", "text": result.text}] + [{"type": "image"} for _ in result.images]


def expand_pads(ids: list[int], pad_id: int, counts: Sequence[int]) -> list[int]:
    """`ids` with the k-th `pad_id` repeated `counts[k]` times. A ValueError when the number of
    pads is not the number of images (text that holds the pad token itself, e.g. a hostile row)."""
    found = ids.count(pad_id)
    if found != len(counts):
        raise ValueError(f"the rendered text holds {found} image placeholder(s) for {len(counts)} image(s): "
                         "a message or tool text contains the vision pad token itself")
    out: list[int] = []
    k = 0
    for t in ids:
        if t == pad_id:
            out.extend([pad_id] * counts[k])
            k += 1
        else:
            out.append(t)
    return out


def sample_with_images(messages: list[dict[str, Any]], steps: Sequence[Any]) -> tuple[list[dict[str, Any]], list[Any]]:
    """The token-contract sample with images: one in the last user message (after its text), two
    in the first tool result (a wide one and a small one), for the checker (contract.py)."""
    from PIL import Image as PILImage

    from rlfactory.images import image_from_pil

    wide = image_from_pil(PILImage.new("RGB", (40, 24), (200, 30, 30)))
    small = image_from_pil(PILImage.new("RGB", (16, 16), (30, 160, 40)))
    question = image_from_pil(PILImage.new("RGB", (32, 32), (40, 60, 210)))
    messages = [dict(m) for m in messages]
    last_user = max(i for i, m in enumerate(messages) if m.get("role") == "user")
    messages[last_user]["content"] = [{"type": "text", "text": str(messages[last_user]["content"])},
                                      {"type": "image", "image": question}]
    steps = list(steps)
    first = next(i for i, s in enumerate(steps) if not hasattr(s, "calls"))
    steps[first] = [replace(steps[first][0], images=[wide, small])] + list(steps[first][1:])
    return messages, steps


def render_prompt(tool_manager: Any, messages: list[dict[str, Any]], tools: Sequence[ToolSpec]) -> Rendered:
    """Any ToolManager's prompt as `Rendered` (with images only for a VisionToolManager)."""
    if isinstance(tool_manager, VisionToolManager):
        return tool_manager.render_prompt_images(messages, tools)
    return Rendered(list(tool_manager.render_prompt(messages, tools)))


def render_observation(tool_manager: Any, results: Sequence[ToolResult]) -> Rendered:
    """Any ToolManager's observation as `Rendered` (with images only for a VisionToolManager)."""
    if isinstance(tool_manager, VisionToolManager):
        return tool_manager.render_observation_images(results)
    return Rendered(list(tool_manager.render_observation(results)))
