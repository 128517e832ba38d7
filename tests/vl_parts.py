"""The tiny vision-language model the image tests share: rlfactory's tiny-vl:1m made in a temporary
folder (Qwen2.5-VL architecture, eval mode) with its VL ToolManager, and a plain-colour picture."""

from __future__ import annotations

from pathlib import Path

from PIL import Image as PILImage
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

from rlfactory.chat.qwen_vl import QwenVLToolManager
from rlfactory.images import Image, image_from_pil
from rlfactory.tiny.vl import make_tiny_vl_model


def tiny_vl(folder: Path) -> tuple[Qwen2_5_VLForConditionalGeneration, QwenVLToolManager, Path]:
    folder = make_tiny_vl_model(folder, "1m", seed=0)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder).eval()
    return model, QwenVLToolManager(AutoTokenizer.from_pretrained(folder), enable_thinking=False), folder


def picture(w: int, h: int, color) -> Image:
    return image_from_pil(PILImage.new("RGB", (w, h), color))
