"""The visual env's options for the CPU demo (issue 31): checker ink (the prompt's shrunk copy is
the same whatever the digit, so a model that does not zoom cannot beat chance), 4-digit picture
codes, the solver's grid-aligned window and its guesses (guess_rate), the question's format; and
the demo's model, `tiny-vl:1m-compact`, whose one-line tool listing keeps demonstrations short."""

from __future__ import annotations

import asyncio
import io
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image as PILImage
from transformers import AutoTokenizer

from rlfactory.chat.qwen_vl import QwenVLToolManager
from rlfactory.envs.registry import make_env
from rlfactory.envs.visual import CODE_OFFSETS, COLOURS, GRID, VisualEnv, code_colour, draw, square_size
from rlfactory.tiny.vl import make_tiny_vl_model
from rlfactory.tools.function import function_tool

DEMO = dict(size=64, view=32, ink="checker", id_style="code", question="Digit in {picture}?")


def test_checker_ink_hides_the_digit_from_the_shrunk_copy_and_shows_it_in_full():
    env = make_env("visual", seed=1, n_train=40, n_test=10, **DEMO)
    w, h = square_size("checker")
    for item in env.items()["train"][:10]:
        assert item.x % 4 == 2 and item.y % 4 == 2 and item.x + w <= 64 and item.y + h <= 64
        twins = [replace(item, digit=d) for d in range(10)]
        # the prompt's picture is byte-identical for all ten digits: nothing to read, whatever the model
        assert len({env.prompt_png(t) for t in twins}) == 1
        # at full resolution the ten squares differ pairwise, and each holds its colour and two ink shades
        squares = [draw(t, 64, "checker")[item.y:item.y + h, item.x:item.x + w] for t in twins]
        assert len({s.tobytes() for s in squares}) == 10
        assert len({tuple(p) for p in squares[8].reshape(-1, 3)}) == 3
        assert tuple(squares[1][0, 0]) == COLOURS[item.colour]
    # the same with other even shrink factors
    for size, view in ((96, 24), (64, 16), (160, 40)):
        big = make_env("visual", seed=2, n_train=5, n_test=1, size=size, view=view, ink="checker")
        item = big.items()["train"][0]
        assert len({big.prompt_png(replace(item, digit=d)) for d in range(10)}) == 1
    # at full resolution each font cell is one 4x4 patch: ink cells hold two shades, the others one
    item = env.items()["train"][0]
    cells = draw(replace(item, digit=1), 64, "checker")[item.y + 2:item.y + 22, item.x + 2:item.x + 14]
    shades = [[len({tuple(p) for p in cells[r:r + 4, c:c + 4].reshape(-1, 3)}) for c in range(0, 12, 4)]
              for r in range(0, 20, 4)]
    assert shades == [[1, 2, 1], [2, 2, 1], [1, 2, 1], [1, 2, 1], [2, 2, 2]]  # the font's 1
    # solid ink (the default) is not hidden so: its ink darkens or lightens the shrunk square
    solid = make_env("visual", seed=1, n_train=5, n_test=1, size=64, view=16)
    item = solid.items()["train"][0]
    assert len({solid.prompt_png(replace(item, digit=d)) for d in range(10)}) > 1


def test_code_ink_hides_the_code_from_the_shrunk_copy_and_shows_it_in_every_patch():
    env = make_env("visual", seed=3, n_train=60, n_test=10, size=32, view=16, ink="code", place_step=16, colours=100)
    w, h = square_size("code")
    for item in env.items()["train"][:10]:
        twins = [replace(item, digit=d) for d in range(10)]
        # the prompt's copy is byte-identical for the ten codes: the square shows its colour only
        assert len({env.prompt_png(t) for t in twins}) == 1
        shrunk = np.asarray(PILImage.open(io.BytesIO(env.prompt_png(item))).convert("RGB"))
        assert np.array_equal(shrunk[item.y // 2 + 1, item.x // 2 + 1], code_colour(item.colour))
        squares = [draw(t, 32, "code")[item.y:item.y + h, item.x:item.x + w].astype(int) for t in twins]
        assert len({s.tobytes() for s in squares}) == 10
        for d, sq in enumerate(squares):
            # every 4x4 patch of the square holds the code's two colours: colour + offset, colour - offset
            base, off = code_colour(item.colour), np.array(CODE_OFFSETS[d])
            for r in range(0, h, 4):
                for c in range(0, w, 4):
                    patch = {tuple(p) for p in sq[r:r + 4, c:c + 4].reshape(-1, 3)}
                    assert patch == {tuple(base + off), tuple(base - off)}
    # the demo's solver zooms inside the square (a 16 px window): every pixel it returns shows the code
    env = make_env("visual", seed=3, n_train=60, n_test=10, size=32, view=16, ink="code", place_step=16, colours=100,
                   solver_zoom=16)
    item = env.items()["test"][0]
    x, y = env.window(item)
    assert (x, y) == (2, 10) and item.x <= x and x + 16 <= item.x + w and item.y <= y and y + 16 <= item.y + h
    region = env.zoom(item.picture_id, x, y, 16)[1].astype(int)
    base, off = code_colour(item.colour), np.array(CODE_OFFSETS[item.digit])
    assert {tuple(p) for p in region.reshape(-1, 3)} == {tuple(base + off), tuple(base - off)}
    # each colour has its own shade, so the held-out pictures' (code, shade) pairs are not the training ones'
    from rlfactory.envs.visual import palette
    assert len({tuple(code_colour(c)) for c in palette(1000)}) == 1000
    demo = make_env("visual", seed=0, n_train=800, n_test=100, size=32, view=16, ink="code", place_step=16, colours=100)
    seen = {(i.digit, tuple(code_colour(i.colour))) for i in demo.items()["train"]}
    assert not any((i.digit, tuple(code_colour(i.colour))) in seen for i in demo.items()["test"])
    # no code's offset is another's negation (its checker would be the other's, shifted by a pixel)
    assert not {tuple(-np.array(o)) for o in CODE_OFFSETS} & set(CODE_OFFSETS)


def test_picture_codes_are_distinct_three_digits_for_both_splits_and_name_the_picture():
    env = make_env("visual", seed=0, n_train=300, n_test=50, **DEMO)
    train, test = env.load_split("train"), env.load_split("test")
    codes = [r["extra_info"]["picture"] for r in train + test]
    assert len(set(codes)) == 350 and all(len(c) == 3 and c.isdigit() for c in codes)
    row = test[3]
    code = row["extra_info"]["picture"]
    assert row["question"] == f"Digit in {code}?" and env.item(code).split == "test"
    assert make_env("visual", seed=0, n_train=300, n_test=50, **DEMO).load_split("test") == test
    where, region = env.zoom(code, 8, 16)
    assert where == f"{code}: x 8..39, y 16..47" and region.shape == (32, 32, 3)
    result = asyncio.run(function_tool(env.zoom).call({"picture": "test-3", "x": 0, "y": 0}))
    assert result.is_error and "no picture 'test-3' (codes from the questions)" in result.text
    big = make_env("visual", seed=0, n_train=900, n_test=1, **DEMO)  # past 900 pictures: 4 digits
    assert {len(r["extra_info"]["picture"]) for r in big.load_split("train")} == {4}
    with pytest.raises(ValueError, match="at most 9000 pictures"):
        make_env("visual", n_train=9000, n_test=1, id_style="code").items()


def test_one_line_errors_for_bad_options():
    for options, why in (({"ink": "bold"}, "ink must be one of solid, checker, code"),
                         ({"id_style": "name"}, "id_style must be split or code"),
                         ({"guess_rate": 1.5}, "guess_rate must be between 0 and 1"),
                         ({"question": "Digit in {pic}?"}, "question must be a format string")):
        with pytest.raises(ValueError, match=why) as e:
            make_env("visual", **options)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("options", [{}, DEMO])
def test_the_solver_zooms_on_a_grid_aligned_window_that_holds_the_square(options):
    env = make_env("visual", seed=5, n_train=200, n_test=1, **options)
    size, ink = env.size, env.ink
    w, h = square_size(ink)
    for row in env.load_split("train"):
        item = env.item(row["extra_info"]["picture"])
        call = env.solve(row)[2]["tool_calls"][0]["function"]["arguments"]
        x, y = call["x"], call["y"]
        assert set(call) == {"picture", "x", "y"}  # size: zoom's default 32
        assert x % GRID == 0 and y % GRID == 0 and x + 32 <= size and y + 32 <= size
        assert x <= item.x and item.x + w <= x + 32 and y <= item.y and item.y + h <= y + 32


def test_guess_rate_demonstrations_answer_at_once_with_a_seeded_guess():
    env = make_env("visual", seed=0, n_train=400, n_test=1, guess_rate=0.6, **DEMO)
    rows = env.load_split("train")
    demos = [env.solve(r) for r in rows]
    guessed = [d for d in demos if len(d) == 3]
    assert 0.5 < len(guessed) / len(rows) < 0.7
    for d in guessed:
        assert d[-1]["role"] == "assistant" and "tool_calls" not in d[-1]
    # guesses are uniform digits, not the answer: right about one time in ten
    right = sum(d[-1]["content"] == f"<answer>{env.item(r['extra_info']['picture']).digit}</answer>"
                for r, d in zip(rows, demos) if len(d) == 3)
    assert right / len(guessed) < 0.2 and len(Counter(d[-1]["content"] for d in guessed)) == 10
    assert [len(env.solve(r)) for r in rows[:50]] == [len(d) for d in demos[:50]]  # the same guesses again
    assert [env.solve(r)[-1]["content"] for r in rows[:50]] == [d[-1]["content"] for d in demos[:50]]
    always = make_env("visual", seed=0, n_train=50, n_test=1)  # guess_rate 0 (the default): every demo zooms
    assert all(len(always.solve(r)) == 5 for r in always.load_split("train"))


def test_the_compact_tiny_vl_lists_tools_in_one_line_and_keeps_demonstrations_short(tmp_path):
    from rlfactory.tools.base import spec_of
    from rlfactory.train.sft import demo_to_trajectory

    folder = make_tiny_vl_model(tmp_path / "m", "1m-compact", seed=0)
    tm = QwenVLToolManager(AutoTokenizer.from_pretrained(folder), enable_thinking=False)
    env: VisualEnv = make_env("visual", seed=0, n_train=20, n_test=1, system_prompt="Zoom, then answer.", **DEMO)
    specs = [spec_of(function_tool(env.zoom))]
    row = next(r for r in env.load_split("train") if len(env.solve(r)) == 5)
    demo = demo_to_trajectory(env.solve(row), tm, specs)
    text = tm.tokenizer.decode(demo.input_ids)
    assert text.startswith("<|im_start|>system\nZoom, then answer.\nTools: zoom(picture, x, y, size)<|im_end|>\n")
    assert '<tool_call>\n{"name": "zoom", "arguments": {"picture": "' in text
    assert len(demo.input_ids) < 200  # tiny-vl:1m's Qwen3 tool schema alone is ~450 tokens
    prompt, _, obs, _ = demo.segments
    assert [(im.width, im.height) for im in prompt.images + obs.images] == [(32, 32), (32, 32)]
    zoomed = np.asarray(PILImage.open(io.BytesIO(obs.images[0].data)).convert("RGB"))
    call = env.solve(row)[2]["tool_calls"][0]["function"]["arguments"]
    assert np.array_equal(zoomed, env.zoom(**call)[1])


def test_episode_picture_zoom_shows_each_concurrent_episodes_own_picture(tmp_path):
    """`episode_picture: true`: zoom(x, y, size) has no picture id; the env's step runs it on the
    episode's own picture. Eight episodes at once (guesses off): each zoomed picture is its own,
    each scripted answer scores 1, and each demonstration equals its rollout token for token."""
    from test_visual import solved_rollouts

    from rlfactory.tools.base import spec_of
    from rlfactory.train.sft import demo_to_trajectory

    folder = make_tiny_vl_model(tmp_path / "m", "1m-compact", seed=0)
    tm = QwenVLToolManager(AutoTokenizer.from_pretrained(folder), enable_thinking=False)
    env: VisualEnv = make_env("visual", seed=0, n_train=20, n_test=8, episode_picture=True, solver_zoom=64,
                              **{**DEMO, "view": 16})
    tool = function_tool(env.tools().python[0])
    assert tool.name == "zoom" and set(tool.parameters["properties"]) == {"x", "y", "size"}
    rows = env.load_split("test")
    trajs, scores = solved_rollouts(tm, env, rows)
    assert [s.total for s in scores] == [1.0] * 8
    for row, traj in zip(rows, trajs):
        item = env.item(row["extra_info"]["picture"])
        assert traj.tool_calls[0].arguments == {"x": 0, "y": 0, "size": 64}
        (zoomed,) = traj.segments[2].images
        assert np.array_equal(np.asarray(PILImage.open(io.BytesIO(zoomed.data)).convert("RGB")), draw(item, 64, "checker"))
        demo = demo_to_trajectory(env.solve(row), tm, [spec_of(tool)])
        assert demo.input_ids == traj.input_ids
    assert "Tools: zoom(x, y, size)" in tm.tokenizer.decode(trajs[0].input_ids)
    # outside an episode the tool has no picture: one line
    result = asyncio.run(tool.call({"x": 0, "y": 0}))
    assert result.is_error and "shows the episode's own picture" in result.text and "\n" not in result.text
    with pytest.raises(ValueError, match="solver_zoom must be between 8 and 64"):
        make_env("visual", size=64, solver_zoom=80)


def test_more_pictures_than_distinct_keys_is_one_line_not_an_endless_draw():
    # size 32, checker ink: 4 x 2 places, so 10 x 8 x 6 = 480 (digit, place, colour) keys
    env = make_env("visual", seed=0, n_train=400, n_test=81, size=32, view=16, ink="checker")
    with pytest.raises(ValueError, match=r"n_train \+ n_test \(481\) is more than the 480 distinct pictures") as e:
        env.items()
    assert "\n" not in str(e.value)
    assert len(make_env("visual", seed=0, n_train=400, n_test=80, size=32, view=16, ink="checker").items()["test"]) == 80


def test_place_step_spaces_the_places_and_colours_past_six_show_the_checker_in_every_channel():
    from rlfactory.envs.visual import palette, rgb

    env = make_env("visual", seed=0, n_train=200, n_test=100, size=32, view=16, ink="checker", solver_zoom=32,
                   place_step=16, colours=30)
    items = env.items()
    assert {(it.x, it.y) for split in items.values() for it in split} == {(2, 2)}  # one place at this size
    assert {it.colour for it in items["train"]} <= set(palette(30)) and len({it.colour for it in items["train"]}) > 20
    keys = {it.key for it in items["train"]}
    assert not keys & {it.key for it in items["test"]}
    assert palette(6) == sorted(COLOURS) and palette(8)[6:] == ["mix-0", "mix-1"]
    for name in palette(30)[6:]:
        assert all(40 <= c <= 215 for c in rgb(name))
    item = next(it for it in items["train"] if it.colour.startswith("mix-"))
    square = draw(item, 32, "checker")[item.y:item.y + 24, item.x:item.x + 16].astype(int)
    ink = square.std(axis=(0, 1))
    assert (ink > 10).all()  # the digit's checker varies every channel
    # six colours (the default) draw the same pictures as before the option existed
    assert [it.key for it in make_env("visual", seed=3, n_train=30, n_test=5).items()["train"]] == \
        [it.key for it in make_env("visual", seed=3, n_train=30, n_test=5, colours=6).items()["train"]]


def test_bad_place_step_and_colours_are_one_line():
    for options, why in (({"ink": "checker", "place_step": 6}, "place_step must be a positive multiple of 4"),
                         ({"place_step": 0}, "place_step must be a positive multiple of 1"),
                         ({"colours": 0}, "colours must be a positive integer")):
        with pytest.raises(ValueError, match=why) as e:
            make_env("visual", **options)
        assert "\n" not in str(e.value)
