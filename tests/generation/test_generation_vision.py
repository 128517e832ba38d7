"""The local generator's vision prefill (issue 31) on the tiny Qwen2.5-VL: multi-turn image
trajectories (kept caches between turns, rows with and without images in one batch) sample tokens
whose logprobs equal the trainer's (the per-trajectory forward with pixels and 3-D M-RoPE positions,
and the batched update's forward); each image goes through the vision encoder once, in the prefill
of its turn, never in a decode step."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlfactory.chat.contract import SAMPLE_TOOLS
from rlfactory.chat.qwen_vl import QwenVLToolManager
from rlfactory.config import SamplingConfig
from rlfactory.generation.local import LocalGenerator
from rlfactory.protocols import GenRequest
from rlfactory.tools.base import ToolResult
from rlfactory.train.batch import collate
from rlfactory.train.image_logprobs import trajectory_logprobs
from rlfactory.train.logprobs import batched_logprobs
from rlfactory.trajectory import Segment, Trajectory
from vl_parts import picture, tiny_vl

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    return tiny_vl(tmp_path_factory.mktemp("tinyvl") / "m")[:2]


SCRIPTS = {
    # trajectory -> (prompt picture or None, each later turn's tool pictures)
    "a": (picture(48, 32, (9, 99, 9)), [[picture(24, 40, (200, 0, 0)), picture(16, 16, (0, 0, 200))], []]),
    "b": (picture(20, 60, (30, 60, 90)), [[], [picture(64, 16, (1, 2, 3))]]),
    "c": (None, [[], []]),  # text only, in the same batch
}


async def roll(gen: LocalGenerator, tm: QwenVLToolManager, name: str, seed: int, session: bool) -> Trajectory:
    """Three model turns of 5 sampled tokens, tool results with the script's pictures between them."""
    first, tools = SCRIPTS[name]
    content = [{"type": "text", "text": f"Look ({name})."}] + ([{"type": "image", "image": first}] if first else [])
    prompt = tm.render_prompt_images([{"role": "user", "content": content}], SAMPLE_TOOLS)
    segments = [Segment("prompt", prompt.ids, images=prompt.images or None)]
    for turn in range(len(tools) + 1):
        ids = [t for s in segments for t in s.token_ids]
        images = [im for s in segments for im in s.images or ()]
        req = GenRequest(ids, 5, SamplingConfig(), stop_token_ids=[], session=name if session else None,
                         seed=seed + turn, images=images or None)
        out = await gen.submit(req)
        segments.append(Segment("model", out.token_ids, logprobs=out.logprobs))
        if turn < len(tools):
            obs = tm.render_observation_images([ToolResult(f"result {turn}", images=tools[turn])])
            segments.append(Segment("observation", obs.ids, images=obs.images or None))
    gen.forget(name)
    return Trajectory(f"{name}-0", name, segments=segments)


def rollouts(model, tm, session: bool = True,
             device: str = "cpu") -> tuple[list[Trajectory], list[torch.Tensor], LocalGenerator]:
    gen = LocalGenerator(model, 0, tokenizer=tm.tokenizer, pixels=tm, device=device)
    grids: list[torch.Tensor] = []
    hook = model.model.visual.register_forward_hook(lambda m, args, kwargs, out: grids.append(kwargs["grid_thw"]),
                                                    with_kwargs=True)

    async def main():
        return await asyncio.gather(*(roll(gen, tm, name, 10 * k, session) for k, name in enumerate(SCRIPTS)))

    try:
        trajs = asyncio.run(main())
    finally:
        hook.remove()
        gen.close()
    return list(trajs), grids, gen


@pytest.mark.parametrize("session", [True, False])
def test_generator_logprobs_equal_the_trainers_on_multi_turn_image_trajectories(vl, session):
    model, tm = vl
    trajs, _, gen = rollouts(model, tm, session)
    if session:
        assert gen.stats["reused_tokens"] > 0  # later turns prefilled only their new tokens
    sampled = [torch.tensor([x for s in t.segments if s.role == "model" for x in s.logprobs]) for t in trajs]
    with torch.no_grad():
        per_traj = [trajectory_logprobs(model, tm, t) for t in trajs]
        batch = collate(trajs, pad_id=0, pixels=tm)
        batched = batched_logprobs(model, batch, None)
    for b, (got, want) in enumerate(zip(sampled, per_traj)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got, batched[b][batch.loss_mask[b].bool()], atol=1e-4, rtol=1e-4)


def test_each_image_is_encoded_once_in_the_prefill_of_its_turn(vl):
    model, tm = vl
    trajs, grids, gen = rollouts(model, tm)
    images = [im for t in trajs for im in t.images()]
    encoded = torch.cat(grids) if grids else torch.zeros(0, 3)
    assert len(encoded) == len(images) == 5  # each image once, though every later turn's request holds it
    assert sorted(map(tuple, encoded.tolist())) == sorted(tm.grid(im) for im in images)
    image_turns = sum(1 for t in trajs for s in t.segments if s.images)
    assert 1 <= len(grids) <= image_turns < gen.stats["steps"]  # never per decode step


def test_requests_with_images_need_an_image_processor_and_a_vision_model(vl):
    from generation_fakes import tiny_random_lm

    model, tm = vl
    gen = LocalGenerator(model, 0, tokenizer=tm.tokenizer)
    req = GenRequest([1, 2, 3], 2, images=[picture(16, 16, (0, 0, 0))])
    with pytest.raises(ValueError, match="no image processor"):
        asyncio.run(gen.submit(req))
    gen.close()
    with pytest.raises(ValueError, match="takes no pixels"):
        LocalGenerator(tiny_random_lm(), 0, pixels=tm)
