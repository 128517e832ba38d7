"""The visual env (issue 31): generated pictures with a small digit square, a prompt copy too
small to read, and a `zoom` tool returning a region at full resolution; deterministic splits with
no held-out picture in training; the solver earns full reward through a real rollout on the tiny
vision-language model's ToolManager (scripted model turns: the local generator's vision prefill is
other work); `tool_images: false` is the control run."""

from __future__ import annotations

import asyncio
import io
import re

import numpy as np
import pytest
from PIL import Image as PILImage
from transformers import AutoTokenizer

from rlfactory.chat.qwen_vl import QwenVLToolManager
from rlfactory.chat.template import ModelTurn
from rlfactory.config import ConfigError, RolloutConfig, SamplingConfig
from rlfactory.envs.registry import make_env
from rlfactory.envs.visual import PATCH_H, PATCH_W, VisualEnv, draw
from rlfactory.protocols import GenRequest, GenResult
from rlfactory.rollout.engine import RolloutEngine
from rlfactory.tiny.vl import make_tiny_vl_model
from rlfactory.tools import ToolCall, ToolRunner
from rlfactory.tools.function import function_tool


def test_rows_are_deterministic_and_held_out_pictures_never_train():
    env = make_env("visual", seed=3, n_train=300, n_test=40)
    assert isinstance(env, VisualEnv)
    train, test = env.load_split("train"), env.load_split("test")
    assert (len(train), len(test)) == (300, 40)
    again = make_env("visual", seed=3, n_train=300, n_test=40)
    assert again.load_split("test") == test and again.reset(test[5]) == env.reset(test[5])
    assert make_env("visual", seed=4, n_train=300, n_test=40).load_split("test") != test
    keys = {split: {env.item(r["extra_info"]["picture"]).key for r in rows} for split, rows in (("train", train), ("test", test))}
    assert len(keys["train"]) == 300 and len(keys["test"]) == 40 and not keys["train"] & keys["test"]
    prompts = {split: {env.prompt_png(env.item(r["extra_info"]["picture"])) for r in rows}
               for split, rows in (("train", train), ("test", test))}
    assert not prompts["train"] & prompts["test"]
    row = test[0]
    item = env.item(row["extra_info"]["picture"])
    assert row["golden_answers"] == [str(item.digit)] and row["extra_info"]["split"] == "test"
    system, user = env.reset(row)
    assert system["role"] == "system" and user["content"][0]["text"] == row["question"]
    assert "test-0" in row["question"] and "160x160" in row["question"]
    small = PILImage.open(io.BytesIO(env.prompt_png(item)))
    assert small.size == (40, 40) and user["content"][1]["image"].startswith("data:image/png;base64,")
    # the square is there at full resolution, in its colour, and the digit's ink differs from it
    full = draw(item, 160)
    patch = full[item.y:item.y + PATCH_H, item.x:item.x + PATCH_W].reshape(-1, 3)
    assert len({tuple(p) for p in patch}) == 2


def test_zoom_returns_the_region_at_full_resolution_and_errors_are_one_line():
    env = make_env("visual", n_train=5, n_test=5)
    item = env.item("test-2")
    x, y = min(item.x, 160 - 24), min(item.y, 160 - 24)
    where, region = env.zoom("test-2", x, y, 24)
    assert np.array_equal(region, draw(item, 160)[y:y + 24, x:x + 24]) and where == f"test-2: x {x}..{x + 23}, y {y}..{y + 23}"
    where, region = env.zoom("test-2", 150, 150, 32)  # slides back inside the picture
    assert region.shape == (32, 32, 3) and where == "test-2: x 128..159, y 128..159"
    tool = function_tool(env.zoom)
    assert set(tool.parameters["properties"]) == {"picture", "x", "y", "size"}
    for args, why in (({"picture": "test-9", "x": 0, "y": 0}, "no picture 'test-9'"),
                      ({"picture": "test-1", "x": 0, "y": 0, "size": 100}, "size must be between 8 and 64"),
                      ({"picture": "test-1", "x": 170, "y": 0}, "outside the 160x160 picture")):
        result = asyncio.run(tool.call(args))
        assert result.is_error and why in result.text and "\n" not in result.text
    with pytest.raises(ConfigError, match="takes no option 'tool_image'; did you mean 'tool_images'"):
        make_env("visual", tool_image=False)


@pytest.fixture(scope="module")
def tm(tmp_path_factory):
    folder = make_tiny_vl_model(tmp_path_factory.mktemp("tinyvl") / "m", "1m", seed=0)
    return QwenVLToolManager(AutoTokenizer.from_pretrained(folder), enable_thinking=False)


class SolverGenerator:
    """Replays the env solver's assistant turns for whichever picture the prompt names, as the ids
    `model_turn_ids` gives them (what the model would sample)."""

    def __init__(self, tm: QwenVLToolManager, env: VisualEnv, rows: list[dict]) -> None:
        self.tm, self.env, self.tokenizer = tm, env, tm.tokenizer
        self.demos = {r["extra_info"]["picture"]: [m for m in env.solve(r) if m["role"] == "assistant"] for r in rows}

    async def submit(self, req: GenRequest) -> GenResult:
        text = self.tm.tokenizer.decode(req.prompt_ids)
        picture = next(p for p in self.demos if re.search(rf"\b{re.escape(p)}\b", text))
        m = self.demos[picture][req.prompt_ids.count(self.tm.template.token_id("<tool_response>"))]
        calls = [ToolCall(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []]
        ids = self.tm.model_turn_ids(ModelTurn(calls, m["content"]))
        return GenResult(ids, [-0.5] * len(ids), "stop", self.tm.tokenizer.decode(ids), ids[-1])

    async def generate(self, reqs):
        return [await self.submit(r) for r in reqs]


def solved_rollouts(tm, env: VisualEnv, rows: list[dict]):
    async def main():
        async with ToolRunner(env.tools().python) as runner:
            engine = RolloutEngine(SolverGenerator(tm, env, rows), tm, runner, env,
                                   RolloutConfig(max_observation_tokens=512), SamplingConfig())
            trajs = await engine.run(rows, 1)
            return trajs, [await env.reward().score(t) for t in trajs]

    return asyncio.run(main())


def test_the_solver_earns_full_reward_through_a_rollout_with_the_zoomed_pictures(tm):
    env = make_env("visual", n_train=10, n_test=4)
    rows = env.load_split("test")
    trajs, scores = solved_rollouts(tm, env, rows)
    assert [s.total for s in scores] == [1.0] * 4
    for row, traj in zip(rows, trajs):
        assert traj.status == "ok" and [s.role for s in traj.segments] == ["prompt", "model", "observation", "model"]
        prompt, _, obs, _ = traj.segments
        assert [(im.width, im.height) for im in prompt.images] == [(40, 40)]
        assert [tc.status for tc in traj.tool_calls] == ["ok"]
        (zoomed,) = obs.images
        args = traj.tool_calls[0].arguments
        item = env.item(row["extra_info"]["picture"])
        want = draw(item, 160)[args["y"]:args["y"] + 32, args["x"]:args["x"] + 32]
        assert np.array_equal(np.asarray(PILImage.open(io.BytesIO(zoomed.data)).convert("RGB")), want)
        # the zoomed window holds the whole square
        assert args["x"] <= item.x and item.x + PATCH_W <= args["x"] + 32 and args["y"] <= item.y and item.y + PATCH_H <= args["y"] + 32
        for seg in (prompt, obs):
            assert seg.token_ids.count(tm.pad_id) == sum(tm.image_tokens(im) for im in seg.images)
    # a wrong digit scores 0: the reward is the exact match, not the format
    wrong = trajs[0]
    wrong.segments[-1].text = wrong.segments[-1].text.replace(str(env.item("test-0").digit), "x")
    assert asyncio.run(env.reward().score(wrong)).total == 0.0


def test_the_control_run_zooms_without_pictures(tm):
    env = make_env("visual", n_train=10, n_test=2, tool_images=False)
    trajs, scores = solved_rollouts(tm, env, env.load_split("test"))
    for traj in trajs:
        prompt, _, obs, _ = traj.segments
        assert len(prompt.images) == 1 and obs.images is None
        assert "this run's zoom shows no picture" in obs.text and tm.pad_id not in obs.token_ids
    assert [s.total for s in scores] == [1.0, 1.0]  # the solver knows the digit; a model would have to guess


@pytest.mark.parametrize("tool_images", [True, False])
def test_the_solvers_demonstration_is_the_rollout_token_for_token_and_image_for_image(tm, tool_images):
    """`rlfactory sft` trains on what a rollout of the same turns holds: the demo's tool message
    carries the zoomed picture (an image part), rendered with its pads as the rollout renders it."""
    from rlfactory.tools.base import spec_of
    from rlfactory.train.sft import demo_to_trajectory

    env = make_env("visual", n_train=10, n_test=3, tool_images=tool_images)
    rows = env.load_split("test")
    trajs, _ = solved_rollouts(tm, env, rows)
    specs = [spec_of(function_tool(env.zoom))]
    for row, rolled in zip(rows, trajs):
        demo = demo_to_trajectory(env.solve(row), tm, specs)
        assert [s.role for s in demo.segments] == [s.role for s in rolled.segments]
        assert demo.input_ids == rolled.input_ids
        for d, r in zip(demo.segments, rolled.segments):
            assert [im.sha256 for im in d.images or ()] == [im.sha256 for im in r.images or ()]
        assert len(demo.images()) == (2 if tool_images else 1)
