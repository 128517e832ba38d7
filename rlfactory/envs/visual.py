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

Options for a demo a tiny model learns from on a CPU (examples/visual_demo.yaml): `ink: code`
(the digit is a code shown by the square's fine checker; the shrunk copy is byte-identical
whatever the code; `checker` draws the digit so), `id_style: code`, `episode_picture` (zoom
without a picture id), `solver_zoom`, `guess_rate` (demonstrations that guess without looking).

The env needs a vision-language model family (`qwen2_5_vl` / `qwen3_vl`, e.g. `tiny-vl:1m`):
its prompts hold an image part.
"""

from __future__ import annotations

import base64
import io
import random
from dataclasses import dataclass, replace
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import numpy as np

from rlfactory.chat.base import ParseResult
from rlfactory.envs.base import Env, EnvTools
from rlfactory.envs.data import qa_row
from rlfactory.envs.registry import register_env
from rlfactory.rewards.base import Reward
from rlfactory.rewards.rule import RuleReward
from rlfactory.tools.base import ToolCall, ToolResult
from rlfactory.trajectory import Status, Trajectory

if TYPE_CHECKING:
    from rlfactory.tools.runner import ToolRunner

_EPISODE_PICTURE: ContextVar[str | None] = ContextVar("visual_episode_picture", default=None)

DATA_SOURCE = "rlfactory_visual"
SYSTEM_PROMPT = ("You see pictures too small to read. Use the zoom tool to see a part of a picture at full "
                 "resolution. Give the final answer as <answer>digit</answer>.")
QUESTION = ("Picture {picture} is {size}x{size} pixels, shown here at {view}x{view}. A small coloured square "
            "somewhere in it holds one digit. Which digit is it?")
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
CHECKER_SCALE = 4
CHECKER_W, CHECKER_H = 3 * CHECKER_SCALE + 2 * MARGIN, 5 * CHECKER_SCALE + 2 * MARGIN  # 16 x 24 px
INKS = ("solid", "checker", "code")
CELL_INKS = ("checker", "code")
"""Inks drawn in 2x2 px checker cells: their squares sit at 4k + 2 (MARGIN off a CHECKER_SCALE grid)."""
CHECKER_CONTRAST = 70
CODE_OFFSETS = ((-115, -115, -115), (-115, 0, 0), (-58, -115, 0), (-115, 58, -58), (0, -115, -115),
                (0, -115, 115), (-58, 115, 0), (-115, 115, 58), (-115, 0, -115), (-115, -58, 115))
"""`code` ink: the offset from the square's colour of each of the ten codes' checker cells (+ on one
half of the cells, - on the other): no two codes are each other's negation, so each shows its own
checker at full resolution, and every 2x2 block averages to the square's colour."""
CODE_LOW, CODE_HIGH = 120, 136
"""`code` ink gives the square a shade with every channel in CODE_LOW..CODE_HIGH (`code_colour`), so
shade +- offset never clips."""
GRID = 8
"""The solver's zoom windows start at multiples of this (fewer distinct coordinates to learn)."""
COLOURS = {"red": (220, 30, 30), "green": (20, 160, 40), "blue": (30, 60, 220), "orange": (240, 140, 0),
           "magenta": (200, 30, 200), "teal": (0, 150, 150)}


def palette(n: int) -> list[str]:
    """The square's colours of an env with `n` of them: the six named ones, then (past six) `mix-k`
    colours drawn from a fixed seed with every channel in 40..215, so the checker ink shows in all
    three channels. More colours make more distinct pictures when there are few places."""
    return sorted(COLOURS)[:n] + [f"mix-{k}" for k in range(max(0, n - len(COLOURS)))]


def rgb(colour: str) -> tuple[int, int, int]:
    """A colour name of `palette` as RGB."""
    if colour in COLOURS:
        return COLOURS[colour]
    rng = random.Random(f"visual-colour-{colour}")
    return (rng.randint(40, 215), rng.randint(40, 215), rng.randint(40, 215))


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
    code: str | None = None
    """The picture's id when the env names pictures by code (`id_style: code`)."""

    @property
    def picture_id(self) -> str:
        return self.code or f"{self.split}-{self.index}"

    @property
    def key(self) -> tuple[int, int, int, str]:
        """What the model has to find: a test picture never shares it with a training one."""
        return (self.digit, self.x, self.y, self.colour)


def square_size(ink: str = "solid") -> tuple[int, int]:
    """The digit square's width and height in pixels for an ink style."""
    return (CHECKER_W, CHECKER_H) if ink in CELL_INKS else (PATCH_W, PATCH_H)


def code_colour(colour: str) -> np.ndarray:
    """The square's shade under `code` ink: the colour's place in the palette (named colours first,
    then `mix-k`) written in base 17, one digit per channel from CODE_LOW: a distinct shade for each
    of the first 17**3 colours, so no held-out picture shares its code and shade with a training one."""
    named = sorted(COLOURS)
    k = named.index(colour) if colour in COLOURS else len(named) + int(colour.removeprefix("mix-"))
    levels = CODE_HIGH - CODE_LOW + 1
    return np.array([CODE_LOW + (k // levels ** c) % levels for c in range(3)], dtype=np.int16)


def draw(item: Item, size: int, ink: str = "solid") -> np.ndarray:
    """The full-resolution picture, (size, size, 3) uint8.

    `solid` ink: the digit in white or black, 3x3 px per font cell. `checker` ink: 4x4 px per font
    cell, a 1-px checkerboard of the square's colour plus and minus a contrast, so every 2x2 block
    of it averages to the square's colour exactly. Its cells start at multiples of 4 (the square at
    4k + 2): the digit vanishes from a copy shrunk by any even factor (box filter), and at full
    resolution each 4x4 px patch of a window starting at a multiple of 4 is one font cell.

    `code` ink draws no glyph: the digit is a code, the whole square a 1-px checkerboard of its
    colour (`code_colour`) plus and minus the code's offset (`CODE_OFFSETS`): every 2x2 block
    averages to the colour, so a copy shrunk by an even factor shows a plain square whatever the
    code, while every patch of the square at full resolution shows the code's two colours."""
    rng = np.random.default_rng(item.noise_seed)
    canvas = rng.integers(200, 245, (size, size, 1), dtype=np.uint8).repeat(3, axis=2)
    w, h = square_size(ink)
    if ink == "code":
        base, off = code_colour(item.colour), np.array(CODE_OFFSETS[item.digit], dtype=np.int16)
        hi, lo = (base + off).astype(np.uint8), (base - off).astype(np.uint8)
        canvas[item.y:item.y + h, item.x:item.x + w] = np.tile(np.array([[hi, lo], [lo, hi]]), (h // 2, w // 2, 1))
        return canvas
    canvas[item.y:item.y + h, item.x:item.x + w] = np.array(rgb(item.colour), dtype=np.uint8)
    scale = CHECKER_SCALE if ink == "checker" else SCALE
    if ink == "checker":
        base = np.array(rgb(item.colour), dtype=np.int16)
        d = np.minimum(CHECKER_CONTRAST, np.minimum(base, 255 - base))  # per channel, so nothing clips
        hi, lo = (base + d).astype(np.uint8), (base - d).astype(np.uint8)
        cell = np.tile(np.array([[hi, lo], [lo, hi]], dtype=np.uint8), (scale // 2, scale // 2, 1))
    else:
        ink_rgb = np.array((255, 255, 255) if sum(rgb(item.colour)) < 400 else (0, 0, 0), dtype=np.uint8)
        cell = np.broadcast_to(ink_rgb, (scale, scale, 3))
    for r, line in enumerate(_FONT[item.digit]):
        for c, bit in enumerate(line):
            if bit == "#":
                top, left = item.y + MARGIN + r * scale, item.x + MARGIN + c * scale
                canvas[top:top + scale, left:left + scale] = cell
    return canvas


def make_items(seed: int, n_train: int, n_test: int, size: int, ink: str = "solid",
               id_style: str = "split", place_step: int | None = None,
               colours: int = len(COLOURS)) -> dict[str, list[Item]]:
    """Both splits from one seed; every picture's key (digit, place, colour) is used once. With
    `checker` ink the squares sit at 4k + 2 (their font cells at multiples of 4); `place_step` spaces
    the places further apart (fewer of them); `colours`: how many of `palette`; with `id_style:
    code` every picture gets a distinct code of 3 digits (4 past 900 pictures), drawn alike for
    both splits."""
    w, h = square_size(ink)
    if size < max(w, h) + (MARGIN if ink in CELL_INKS else 0) + 1:
        raise ValueError(f"visual env: size {size} is too small for a {w}x{h} px square")
    if id_style == "code" and n_train + n_test > 9000:
        raise ValueError(f"visual env: id_style code names at most 9000 pictures, got {n_train + n_test}")
    step, offset = (CHECKER_SCALE, MARGIN) if ink in CELL_INKS else (1, 0)
    step = place_step or step
    names = palette(colours)
    places = ((size - w - offset) // step + 1) * ((size - h - offset) // step + 1)
    keys = 10 * places * len(names)
    if n_train + n_test > keys:  # every picture has its own key: more would never be drawn
        raise ValueError(f"visual env: n_train + n_test ({n_train + n_test}) is more than the {keys} distinct "
                         f"pictures (10 digits x {places} places x {len(names)} colours) at size {size}")
    rng = random.Random(seed)
    first = 100 if n_train + n_test <= 900 else 1000
    codes = random.Random(f"{seed}-codes").sample(range(first, 10 * first), n_train + n_test) if id_style == "code" else []
    seen: set[tuple[int, int, int, str]] = set()
    out: dict[str, list[Item]] = {}
    for split, n in (("train", n_train), ("test", n_test)):
        items: list[Item] = []
        while len(items) < n:
            item = Item(split, len(items), rng.randrange(10), rng.randrange((size - w - offset) // step + 1) * step + offset,
                        rng.randrange((size - h - offset) // step + 1) * step + offset, rng.choice(names),
                        rng.getrandbits(32))
            if item.key not in seen:
                seen.add(item.key)
                if codes:
                    item = replace(item, code=str(codes.pop()))
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
    answers with text only, the control run), `ink` (`solid`; `checker`: a digit no shrunk copy
    shows, see `draw`; `code`: no glyph, the digit is a code shown by the square's fine checker,
    which no shrunk copy shows either), `id_style` (`split`: ids like test-3; `code`: 3- or 4-digit codes drawn alike
    for both splits, so a model that copies ids from training questions copies test ones too),
    `question` (a format string with {picture}, {size} and {view}), `guess_rate` (0: the share of
    demonstrations that answer at once with a guessed digit), `max_turns` (3), `system_prompt`,
    `episode_picture` (false; true: `zoom(x, y, size)` takes no picture id and shows the episode's
    own picture), `solver_zoom` (32: the side of the solver's window; `size` zooms on the whole
    picture at 0, 0), `place_step` (px between the square's places: 4 with checker ink, 1 with
    solid; larger: fewer places), `colours` (6: the square's colours, `palette`), `family` (unused)."""

    name = "visual"

    def __init__(self, *, seed: int = 0, n_train: int = 1000, n_test: int = 100, size: int = 160, view: int = 40,
                 tool_images: bool = True, ink: str = "solid", id_style: str = "split", question: str | None = None,
                 guess_rate: float = 0.0, episode_picture: bool = False, solver_zoom: int = 32,
                 max_turns: int = 3, system_prompt: str | None = None, place_step: int | None = None,
                 colours: int = len(COLOURS), family: str | None = None) -> None:
        if not 16 <= view <= size:
            raise ValueError(f"visual env: view must be between 16 and size ({size}), got {view}")
        if not isinstance(tool_images, bool):
            raise ValueError(f"visual env: tool_images must be true or false, got {tool_images!r}")
        if ink not in INKS:
            raise ValueError(f"visual env: ink must be one of {', '.join(INKS)}, got {ink!r}")
        if id_style not in ("split", "code"):
            raise ValueError(f"visual env: id_style must be split or code, got {id_style!r}")
        unit = CHECKER_SCALE if ink in CELL_INKS else 1
        if place_step is not None and (not isinstance(place_step, int) or place_step < 1 or place_step % unit):
            raise ValueError(f"visual env: place_step must be a positive multiple of {unit} with {ink} ink, "
                             f"got {place_step!r}")
        if not isinstance(colours, int) or colours < 1:
            raise ValueError(f"visual env: colours must be a positive integer, got {colours!r}")
        self.place_step, self.colours = place_step, colours
        if not 0.0 <= guess_rate <= 1.0:
            raise ValueError(f"visual env: guess_rate must be between 0 and 1, got {guess_rate!r}")
        template = question or QUESTION
        try:
            template.format(picture="p", size=1, view=1)
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"visual env: question must be a format string with {{picture}}, {{size}} and "
                             f"{{view}} only: {e!r}") from None
        self.seed, self.n_train, self.n_test, self.size, self.view = seed, n_train, n_test, size, view
        self.tool_images, self.max_turns, self.ink, self.id_style = tool_images, max_turns, ink, id_style
        if not isinstance(episode_picture, bool):
            raise ValueError(f"visual env: episode_picture must be true or false, got {episode_picture!r}")
        if not (8 <= solver_zoom <= min(MAX_ZOOM, size)):
            raise ValueError(f"visual env: solver_zoom must be between 8 and {min(MAX_ZOOM, size)}, got {solver_zoom!r}")
        self.question_template, self.guess_rate = template, guess_rate
        self.episode_picture, self.solver_zoom = episode_picture, solver_zoom
        self.system_prompt = system_prompt or SYSTEM_PROMPT
        self._items: dict[str, list[Item]] | None = None
        self._by_id: dict[str, Item] = {}
        self._zoom_fn: Any = None

    def items(self) -> dict[str, list[Item]]:
        if self._items is None:
            self._items = make_items(self.seed, self.n_train, self.n_test, self.size, self.ink, self.id_style,
                                     self.place_step, self.colours)
            self._by_id = {it.picture_id: it for items in self._items.values() for it in items}
        return self._items

    def item(self, picture: str) -> Item:
        """The item a picture id (`train-12`, or a code) names; a ValueError saying which ids exist."""
        self.items()
        found = self._by_id.get(picture.strip())
        if found is None:
            names = ("codes from the questions" if self.id_style == "code" else
                     f"ids look like train-0..train-{self.n_train - 1}, test-0..test-{self.n_test - 1}")
            raise ValueError(f"no picture {picture!r} ({names})")
        return found

    def question(self, item: Item) -> str:
        return self.question_template.format(picture=item.picture_id, size=self.size, view=self.view)

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

    def picture(self, item: Item) -> np.ndarray:
        """The item's full-resolution picture in this env's size and ink."""
        return draw(item, self.size, self.ink)

    def prompt_png(self, item: Item) -> bytes:
        """The prompt's picture: the whole canvas shrunk to view x view."""
        return png(downscale(self.picture(item), self.view))

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
        if size > self.size:
            raise ValueError(f"size must be at most the picture's {self.size}, got {size}")
        if not (0 <= x < self.size and 0 <= y < self.size):
            raise ValueError(f"({x}, {y}) is outside the {self.size}x{self.size} picture")
        x0, y0 = min(x, self.size - size), min(y, self.size - size)  # a window past the edge slides back in
        where = f"{picture}: x {x0}..{x0 + size - 1}, y {y0}..{y0 + size - 1}"
        if not self.tool_images:
            return f"{where} (this run's zoom shows no picture)"
        region = self.picture(item)[y0:y0 + size, x0:x0 + size]
        return [where, np.ascontiguousarray(region)]

    def tools(self) -> EnvTools:
        return EnvTools(python=[self.episode_zoom() if self.episode_picture else self.zoom])

    def episode_zoom(self) -> Any:
        """`zoom` without the picture id (`episode_picture: true`): the tool the prompt lists. `step`
        runs its calls on the episode's picture; called any other way it has no picture and says so."""

        def zoom(x: int, y: int, size: int = 32) -> str | list[Any]:
            """Show a square part of the picture at full resolution.

            Args:
                x: left edge of the square, in the full picture's pixels
                y: top edge of the square, in the full picture's pixels
                size: side of the square in pixels (8 to 64)
            """
            raise ValueError("this zoom shows the episode's own picture: run it through the visual env's step")

        return zoom

    def end_episode(self, trajectory: Trajectory, turn: ParseResult) -> Status | None:
        """Before each turn's calls run: note the episode's picture for `step` (`episode_picture`).
        A context variable: each episode's coroutine (and the tasks it starts) sees its own."""
        picture = (trajectory.info.get("extra_info") or {}).get("picture") if isinstance(trajectory.info, dict) else None
        _EPISODE_PICTURE.set(picture if isinstance(picture, str) else None)
        return None

    async def step(self, calls: list[ToolCall], runner: ToolRunner) -> list[ToolResult]:
        if not self.episode_picture:
            return await runner.run(calls)
        picture = _EPISODE_PICTURE.get()
        out = []
        for call in calls:
            if call.name != "zoom" or picture is None:
                out.extend(await runner.run([call]))  # its own one-line error (or the unbound zoom's)
                continue
            args = {k: v for k, v in (call.arguments or {}).items() if k != "picture"}
            out.append(await self._zoom_tool().call({"picture": picture, **args}))
        return out

    def _zoom_tool(self) -> Any:
        if self._zoom_fn is None:
            from rlfactory.tools.function import function_tool

            self._zoom_fn = function_tool(self.zoom, run_in_thread=False)
        return self._zoom_fn

    def reward(self) -> Reward:
        return RuleReward({"exact_match": 1.0})

    def window(self, item: Item) -> tuple[int, int]:
        """The solver's zoom window (`solver_zoom` px): at multiples of GRID, holding the square, nearest to
        centred; a window smaller than the square lies inside it."""
        w, h = square_size(self.ink)
        side = self.solver_zoom

        def start(pos: int, extent: int) -> int:
            lo, hi = max(0, pos + extent - side), min(pos, self.size - side)  # windows that hold the square
            centred = pos + extent // 2 - side // 2
            fits = [a for a in range(0, self.size - side + 1, GRID) if lo <= a <= hi]
            return min(fits, key=lambda a: abs(a - centred)) if fits else max(lo, min(centred, hi))

        return start(item.x, w), start(item.y, h)

    def guesses(self, item: Item) -> int | None:
        """The digit the solver guesses without zooming for this picture (a `guess_rate` share of
        the pictures, drawn from the seed), or None when it zooms."""
        rng = random.Random(f"{self.seed}-guess-{item.picture_id}")
        return rng.randrange(10) if rng.random() < self.guess_rate else None

    def solve(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """Zoom on a 32 px window holding the square (`window`), then answer its digit; for the
        `guess_rate` share of pictures, answer at once with a guessed digit instead. The tool turn
        holds what zoom returned: its text, and the zoomed picture as an image part (none in the
        `tool_images: false` control)."""
        item = self._row_item(row)
        guess = self.guesses(item)
        if guess is not None:
            return self.reset(row) + [{"role": "assistant", "content": f"<answer>{guess}</answer>"}]
        x, y = self.window(item)
        args: dict[str, Any] = {} if self.episode_picture else {"picture": item.picture_id}
        args.update({"x": x, "y": y} if self.solver_zoom == 32 else {"x": x, "y": y, "size": self.solver_zoom})
        result = self.zoom(item.picture_id, x, y, self.solver_zoom)
        content: str | list[dict[str, Any]] = result if isinstance(result, str) else [
            {"type": "text", "text": result[0]}, {"type": "image", "image": result[1]}]
        return self.reset(row) + [
            {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function", "function": {"name": "zoom", "arguments": args}}]},
            {"role": "tool", "name": "zoom", "content": content},
            {"role": "assistant", "content": f"<answer>{item.digit}</answer>"},
        ]
