"""The visual env: a large picture with one small coloured square holding a digit, shown to the
model too downscaled to read, and a `zoom` tool that returns a region of it at full resolution
(issue 31). The model has to find the square in the small picture and zoom in to read the digit.

Pictures are generated from the seed (a light noisy background, the square at a random place in
one of six colours, the digit drawn from a 3x5 pixel font scaled 3x): deterministic train and test
splits, and no test picture shares its digit, place and colour with a training one. The prompt's
picture is the whole canvas shrunk `size / view` times (a 13x19 px square becomes about 3x5 px:
its colour shows where it is, its digit is gone). Reward: exact match of the `<answer>` with the
digit.

`tool_images: false` is the control run: `zoom` still answers, with text only (no picture), so a
comparison shows what the pictures bring. The solver (demonstrations for `rlfactory sft`) zooms on
a window centred on the square and answers; its tool message holds what zoom returned, the
zoomed picture included (an image part), so `rlfactory sft` trains with the pixels.

The env needs a vision-language model family (`qwen2_5_vl` / `qwen3_vl`, e.g. `tiny-vl:1m`):
its prompts hold an image part.
"""

from __future__ import annotations

import base64
import io
import random
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlfactory.envs.base import Env, EnvTools
from rlfactory.envs.data import qa_row
from rlfactory.envs.registry import register_env
from rlfactory.rewards.base import Reward
from rlfactory.rewards.rule import RuleReward

DATA_SOURCE = "rlfactory_visual"
SYSTEM_PROMPT = ("You see pictures too small to read. Use the zoom tool to see a part of a picture at full "
                 "resolution. Give the final answer as <answer>digit</answer>.")
MAX_ZOOM = 64
"""The largest window `zoom` returns (a Qwen2-VL processor set to at most 64x64 px keeps it whole)."""

# 3x5 bitmaps of the digits, one string of rows each ('#' = ink).
_FONT = {
    0: ("###", "#.#", "#.#", "#.#", "###"), 1: (".#.", "##.", ".#.", ".#.", "###"),
    2: ("###", "..#", "###", "#..", "###"), 3: ("###", "..#", "###", "..#", "###"),
    4: ("#.#", "#.#", "###", "..#", "..#"), 5: ("###", "#..", "###", "..#", "###"),
    6: ("###", "#..", "###", "#.#", "###"), 7: ("###", "..#", "..#", "..#", "..#"),
    8: ("###", "#.#", "###", "#.#", "###"), 9: ("###", "#.#", "###", "..#", "###"),
}
SCALE = 3
MARGIN = 2
PATCH_W, PATCH_H = 3 * SCALE + 2 * MARGIN, 5 * SCALE + 2 * MARGIN  # 13 x 19 px
COLOURS = {"red": (220, 30, 30), "green": (20, 160, 40), "blue": (30, 60, 220), "orange": (240, 140, 0),
           "magenta": (200, 30, 200), "teal": (0, 150, 150)}


@dataclass(frozen=True)
class Item:
    """One picture: where its square is, in which colour, which digit, and its background's seed."""

    split: str
    index: int
    digit: int
    x: int
    y: int
    colour: str
    noise_seed: int

    @property
    def picture_id(self) -> str:
        return f"{self.split}-{self.index}"

    @property
    def key(self) -> tuple[int, int, int, str]:
        """What the model has to find: a test picture never shares it with a training one."""
        return (self.digit, self.x, self.y, self.colour)


def draw(item: Item, size: int) -> np.ndarray:
    """The full-resolution picture, (size, size, 3) uint8."""
    rng = np.random.default_rng(item.noise_seed)
    canvas = rng.integers(200, 245, (size, size, 1), dtype=np.uint8).repeat(3, axis=2)
    colour = np.array(COLOURS[item.colour], dtype=np.uint8)
    canvas[item.y:item.y + PATCH_H, item.x:item.x + PATCH_W] = colour
    ink = np.array((255, 255, 255) if sum(COLOURS[item.colour]) < 400 else (0, 0, 0), dtype=np.uint8)
    for r, line in enumerate(_FONT[item.digit]):
        for c, bit in enumerate(line):
            if bit == "#":
                top, left = item.y + MARGIN + r * SCALE, item.x + MARGIN + c * SCALE
                canvas[top:top + SCALE, left:left + SCALE] = ink
    return canvas


def make_items(seed: int, n_train: int, n_test: int, size: int) -> dict[str, list[Item]]:
    """Both splits from one seed; every picture's key (digit, place, colour) is used once."""
    if size < max(PATCH_W, PATCH_H) + 1:
        raise ValueError(f"visual env: size {size} is too small for a {PATCH_W}x{PATCH_H} px square")
    rng = random.Random(seed)
    seen: set[tuple[int, int, int, str]] = set()
    out: dict[str, list[Item]] = {}
    for split, n in (("train", n_train), ("test", n_test)):
        items: list[Item] = []
        while len(items) < n:
            item = Item(split, len(items), rng.randrange(10), rng.randrange(size - PATCH_W + 1),
                        rng.randrange(size - PATCH_H + 1), rng.choice(sorted(COLOURS)), rng.getrandbits(32))
            if item.key not in seen:
                seen.add(item.key)
                items.append(item)
        out[split] = items
    return out


def png(arr: np.ndarray) -> bytes:
    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def downscale(arr: np.ndarray, view: int) -> np.ndarray:
    """The picture shrunk to view x view (box filter: each pixel the mean of the ones it covers)."""
    from PIL import Image as PILImage

    return np.asarray(PILImage.fromarray(arr).resize((view, view), PILImage.Resampling.BOX))


@register_env("visual")
class VisualEnv(Env):
    """Options: `seed` (0), `n_train` (1000), `n_test` (100), `size` (160: the picture's side in
    pixels), `view` (40: the side of the prompt's shrunk copy), `tool_images` (true; false: `zoom`
    answers with text only, the control run), `max_turns` (3), `system_prompt`, `family` (unused)."""

    name = "visual"

    def __init__(self, *, seed: int = 0, n_train: int = 1000, n_test: int = 100, size: int = 160, view: int = 40,
                 tool_images: bool = True, max_turns: int = 3, system_prompt: str | None = None,
                 family: str | None = None) -> None:
        if not 16 <= view <= size:
            raise ValueError(f"visual env: view must be between 16 and size ({size}), got {view}")
        if not isinstance(tool_images, bool):
            raise ValueError(f"visual env: tool_images must be true or false, got {tool_images!r}")
        self.seed, self.n_train, self.n_test, self.size, self.view = seed, n_train, n_test, size, view
        self.tool_images, self.max_turns = tool_images, max_turns
        self.system_prompt = system_prompt or SYSTEM_PROMPT
        self._items: dict[str, list[Item]] | None = None

    def items(self) -> dict[str, list[Item]]:
        if self._items is None:
            self._items = make_items(self.seed, self.n_train, self.n_test, self.size)
        return self._items

    def item(self, picture: str) -> Item:
        """The item a picture id (`train-12`) names; a ValueError saying which ids exist."""
        split, _, index = picture.strip().rpartition("-")
        items = self.items().get(split)
        if items is None or not index.isdigit() or int(index) >= len(items):
            raise ValueError(f"no picture {picture!r} (ids look like train-0..train-{self.n_train - 1}, "
                             f"test-0..test-{self.n_test - 1})")
        return items[int(index)]

    def question(self, item: Item) -> str:
        return (f"Picture {item.picture_id} is {self.size}x{self.size} pixels, shown here at {self.view}x{self.view}. "
                "A small coloured square somewhere in it holds one digit. Which digit is it?")

    def load_split(self, split: str) -> list[dict[str, Any]]:
        if split not in ("train", "test"):
            raise ValueError(f"visual env: unknown split {split!r} (train, test)")
        return [qa_row(data_source=DATA_SOURCE, split=split, index=it.index, question=self.question(it),
                       answers=[str(it.digit)], prompt_text=self.question(it), ability="vision",
                       extra={"picture": it.picture_id, "x": it.x, "y": it.y, "colour": it.colour})
                for it in self.items()[split]]

    def _row_item(self, row: dict[str, Any]) -> Item:
        picture = (row.get("extra_info") or {}).get("picture")
        if not isinstance(picture, str):
            raise ValueError("visual env: the row has no extra_info.picture (rows come from its load_split)")
        return self.item(picture)

    def prompt_png(self, item: Item) -> bytes:
        """The prompt's picture: the whole canvas shrunk to view x view."""
        return png(downscale(draw(item, self.size), self.view))

    def reset(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        item = self._row_item(row)
        url = "data:image/png;base64," + base64.b64encode(self.prompt_png(item)).decode()
        return [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": [{"type": "text", "text": self.question(item)},
                                             {"type": "image", "image": url}]}]

    def zoom(self, picture: str, x: int, y: int, size: int = 32) -> str | list[Any]:
        """Show a square part of a picture at full resolution.

        Args:
            picture: the picture's id, as the question names it (e.g. train-12)
            x: left edge of the square, in the full picture's pixels
            y: top edge of the square, in the full picture's pixels
            size: side of the square in pixels (8 to 64)
        """
        item = self.item(picture)
        if not 8 <= size <= MAX_ZOOM:
            raise ValueError(f"size must be between 8 and {MAX_ZOOM}, got {size}")
        if not (0 <= x < self.size and 0 <= y < self.size):
            raise ValueError(f"({x}, {y}) is outside the {self.size}x{self.size} picture")
        x0, y0 = min(x, self.size - size), min(y, self.size - size)  # a window past the edge slides back in
        where = f"{picture}: x {x0}..{x0 + size - 1}, y {y0}..{y0 + size - 1}"
        if not self.tool_images:
            return f"{where} (this run's zoom shows no picture)"
        region = draw(item, self.size)[y0:y0 + size, x0:x0 + size]
        return [where, np.ascontiguousarray(region)]

    def tools(self) -> EnvTools:
        return EnvTools(python=[self.zoom])

    def reward(self) -> Reward:
        return RuleReward({"exact_match": 1.0})

    def solve(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """Zoom on a 32 px window centred on the square, then answer its digit. The tool turn holds
        what zoom returned: its text, and the zoomed picture as an image part (none in the
        `tool_images: false` control)."""
        item = self._row_item(row)
        x = max(0, min(item.x + PATCH_W // 2 - 16, self.size - 32))
        y = max(0, min(item.y + PATCH_H // 2 - 16, self.size - 32))
        args = {"picture": item.picture_id, "x": x, "y": y, "size": 32}
        result = self.zoom(**args)
        content: str | list[dict[str, Any]] = result if isinstance(result, str) else [
            {"type": "text", "text": result[0]}, {"type": "image", "image": result[1]}]
        return self.reset(row) + [
            {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function", "function": {"name": "zoom", "arguments": args}}]},
            {"role": "tool", "name": "zoom", "content": content},
            {"role": "assistant", "content": f"<answer>{item.digit}</answer>"},
        ]
