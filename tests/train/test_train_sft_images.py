"""Images in SFT demonstrations (issue 31): the visual env's solver demonstrations on the tiny
Qwen2.5-VL carry their pictures (the prompt's and the zoomed one) into the SFT forward: the vision
tower sees exactly those pixels, in the full-text steps too, and the image pads never enter the loss."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

from rlfactory.chat.qwen_vl import QwenVLToolManager
from rlfactory.config import SftConfig
from rlfactory.envs.registry import make_env
from rlfactory.tiny.vl import make_tiny_vl_model
from rlfactory.tools.base import spec_of
from rlfactory.tools.function import function_tool
from rlfactory.train.sft import demo_to_trajectory, full_text_view, sft_train

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    folder = make_tiny_vl_model(tmp_path_factory.mktemp("tinyvl") / "m", "1m", seed=0)
    return folder, QwenVLToolManager(AutoTokenizer.from_pretrained(folder), enable_thinking=False)


def visual_demo(tm):
    env = make_env("visual", n_train=4, n_test=1)
    row = env.load_split("train")[0]
    return demo_to_trajectory(env.solve(row), tm, [spec_of(function_tool(env.zoom))])


def test_the_full_text_view_keeps_the_images_out_of_the_loss(vl):
    _, tm = vl
    demo = visual_demo(tm)
    view = full_text_view(demo, tm.pad_id)
    assert view.input_ids == demo.input_ids
    assert [im.sha256 for im in view.images()] == [im.sha256 for im in demo.images()] and len(demo.images()) == 2
    pads = [i for i, t in enumerate(view.input_ids) if t == tm.pad_id]
    assert pads and not any(view.loss_mask[i] for i in pads)
    # every other token after the first is learned: the prompt's and the observation's text too
    assert sum(view.loss_mask) == len(view.input_ids) - 1 - len(pads) > sum(demo.loss_mask)
    with pytest.raises(ValueError, match="needs the model's image token id"):
        full_text_view(demo)


def test_sft_feeds_the_demos_pixels_to_the_vision_tower(vl):
    folder, tm = vl
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder)
    demo = visual_demo(tm)
    prompt_images, zoomed = demo.segments[0].images, demo.segments[2].images
    seen: list[torch.Tensor] = []
    hook = model.model.visual.register_forward_hook(lambda mod, args, out: seen.append(args[0].detach().clone()))
    try:
        cfg = SftConfig(steps=2, batch_size=1, full_text_steps=1, warmup_steps=1, lr=1e-3)
        history = sft_train(model, [demo], 0, cfg, pixels=tm)
    finally:
        hook.remove()
    # the full-text step's prompt is one token: both pictures go in with the completion pass; the
    # next step's: the prompt's picture (prompt pass), then the zoomed one (completion pass)
    both = tm.pixel_inputs(prompt_images + zoomed)["pixel_values"]
    want = [both, tm.pixel_inputs(prompt_images)["pixel_values"], tm.pixel_inputs(zoomed)["pixel_values"]]
    assert len(seen) == 3
    for got, w in zip(seen, want):
        torch.testing.assert_close(got, w)
    assert [row["full_text"] for row in history] == [True, False]
    assert all(torch.isfinite(torch.tensor(row["loss"])) for row in history)


def test_sft_without_the_image_processor_says_why(vl):
    folder, tm = vl
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder)
    with pytest.raises(ValueError, match="no image processor"):
        sft_train(model, [visual_demo(tm)], 0, SftConfig(steps=1, batch_size=1, full_text_steps=0))
