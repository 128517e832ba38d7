"""Pixels in the batched update (issue 31): the trainer's forward (train/logprobs.py, shared prompts,
padding, micro-batches) of a batch that mixes multi-turn image trajectories and text-only ones on
the tiny Qwen2.5-VL gives each row the logprobs of the per-trajectory forward with its pixels and
the model's own 3-D M-RoPE positions (train/image_logprobs.py), and the update's gradients reach
the vision tower."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2_5_VLForConditionalGeneration

from rlfactory.chat.contract import SAMPLE_TOOLS
from rlfactory.chat.template import ModelTurn
from rlfactory.config import RunConfig, load_config
from rlfactory.tools.base import ToolCall, ToolResult
from rlfactory.train.batch import collate
from rlfactory.train.image_logprobs import trajectory_logprobs
from rlfactory.train.learner import Learner
from rlfactory.train.logprobs import batched_logprobs, policy_forward
from rlfactory.train.parallel import SingleProcess
from rlfactory.train.step import reward_tensors
from rlfactory.trajectory import Segment, Trajectory
from train_fixtures import run_config
from vl_parts import picture, tiny_vl

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    return tiny_vl(tmp_path_factory.mktemp("tinyvl") / "m")


def trajectory(tm, tid: str, prompt_image=None, observations=(), answer="red", question="Which colour?") -> Trajectory:
    """prompt (with `prompt_image`) -> call -> observation with `observations[k]` images -> ... -> answer."""
    content = [{"type": "text", "text": question}] + ([{"type": "image", "image": prompt_image}] if prompt_image else [])
    prompt = tm.render_prompt_images([{"role": "user", "content": content}], SAMPLE_TOOLS)
    segs = [Segment("prompt", prompt.ids, images=prompt.images or None)]
    for k, images in enumerate(observations):
        call = tm.model_turn_ids(ModelTurn([ToolCall("zoom", {"x": k})]))
        obs = tm.render_observation_images([ToolResult(f"zoomed {k}", images=list(images))])
        segs += [Segment("model", call, logprobs=[-1.0] * len(call)), Segment("observation", obs.ids, images=obs.images or None)]
    final = tm.model_turn_ids(ModelTurn([], answer))
    segs.append(Segment("model", final, logprobs=[-1.0] * len(final)))
    return Trajectory(tid, "g", segments=segs)


def mixed_batch(tm) -> list[Trajectory]:
    square = picture(48, 32, (9, 99, 9))
    return [
        # two samples of one image prompt, each with its own multi-turn image observations
        trajectory(tm, "a", square, [[picture(24, 40, (200, 0, 0)), picture(16, 16, (0, 0, 200))], [picture(32, 32, (5, 5, 5))]]),
        trajectory(tm, "b", square, [[picture(16, 24, (0, 200, 0))]], answer="green, since the zoom shows it"),
        # text only: no image anywhere (padding rows of another length)
        trajectory(tm, "c", None, [[]], answer="blue"),
        # the same prompt ids with another picture of the same size: its own prompt row
        trajectory(tm, "d", picture(48, 32, (250, 250, 0)), [[picture(64, 16, (1, 2, 3))]]),
        # an image prompt, no tool call
        trajectory(tm, "e", picture(20, 60, (30, 60, 90)), [], answer="yellow"),
    ]


def per_row(model, tm, trajs):
    with torch.no_grad():
        return [trajectory_logprobs(model, tm, t) for t in trajs]


@pytest.mark.parametrize("share_prefix", [True, False])
def test_batched_logprobs_of_image_rows_equal_the_per_trajectory_forward(vl, share_prefix):
    model, tm, _ = vl
    trajs = mixed_batch(tm)
    batch = collate(trajs, pad_id=0, pixels=tm)
    assert batch.prompt_ids.shape[0] == 4  # a and b share their prompt; d's same ids with another image do not
    assert batch.images is not None and batch.images.completions[2] is None
    want = per_row(model, tm, trajs)
    for micro in (None, 2):
        got = batched_logprobs(model, batch, micro, share_prefix=share_prefix)
        for b, w in enumerate(want):
            row = got[b][batch.loss_mask[b].bool()]
            assert row.shape == w.shape
            torch.testing.assert_close(row, w, atol=2e-5, rtol=1e-4)


def test_the_pixels_matter_and_the_vision_tower_gets_gradients(vl):
    model, tm, _ = vl
    trajs = mixed_batch(tm)[:2]
    batch = collate(trajs, pad_id=0, pixels=tm)
    with torch.no_grad():
        right, _ = policy_forward(model, batch)
    other = mixed_batch(tm)[:2]
    other[0].segments[2].images = [picture(24, 40, (0, 255, 255)), picture(16, 16, (255, 0, 255))]  # same sizes, same ids
    with torch.no_grad():
        changed, _ = policy_forward(model, collate(other, pad_id=0, pixels=tm))
    sel = batch.loss_mask.bool()
    assert not torch.allclose(right[0][sel[0]], changed[0][sel[0]], atol=1e-5)
    torch.testing.assert_close(right[1], changed[1])  # the other row's pixels did not change
    model.zero_grad()
    logp, _ = policy_forward(model, batch)
    (-logp[sel].sum()).backward()
    grads = [p.grad for p in model.model.visual.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    model.zero_grad()


def test_images_without_an_image_processor_are_one_clear_error(vl):
    _, tm, _ = vl
    with pytest.raises(ValueError, match="no image processor"):
        collate(mixed_batch(tm)[:1], pad_id=0)


def test_a_text_model_refuses_a_batch_with_images(vl):
    from train_fixtures import tiny_qwen3

    _, tm, _ = vl
    batch = collate(mixed_batch(tm)[:1], pad_id=0, pixels=tm)
    with pytest.raises(ValueError, match="needs a vision-language model"):
        policy_forward(tiny_qwen3(), batch)


def test_the_learner_trains_on_image_trajectories(vl, tmp_path):
    _, tm, folder = vl
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder)
    cfg = load_config(RunConfig, run_config(tmp_path, algo={"group_size": 2, "epochs": 2}))
    learner = Learner(cfg, model, pad_id=0, parallel=SingleProcess(), pixels=tm)
    trajs = mixed_batch(tm)[:2]
    trajs[0].reward, trajs[1].reward = 1.0, 0.0
    want = per_row(model, tm, trajs)
    before = [p.detach().clone() for p in model.model.visual.parameters()]
    rewards, groups, valid = reward_tensors(trajs)
    learner.learn(1, trajs, torch.zeros(2, dtype=torch.long), rewards, groups, valid, valid.clone())
    # the trainer's logprobs before the update are the per-trajectory ones with pixels
    for t, w in zip(trajs, want):
        got = torch.tensor([x for s in t.segments if s.role == "model" for x in s.trainer_logprobs])
        torch.testing.assert_close(got, w, atol=2e-5, rtol=1e-4)
    assert any(not torch.equal(a, p) for a, p in zip(before, model.model.visual.parameters()))


def test_the_critic_sees_the_pixels_too(vl):
    from rlfactory.train.critic import Critic

    model, tm, _ = vl
    critic = Critic(model)
    torch.nn.init.normal_(critic.head.weight)  # a zero head gives 0 whatever it sees
    trajs = mixed_batch(tm)[:2]
    other = mixed_batch(tm)[:2]
    other[0].segments[2].images = [picture(24, 40, (0, 255, 255)), picture(16, 16, (255, 0, 255))]
    with torch.no_grad():
        a = critic.values(collate(trajs, pad_id=0, pixels=tm), None)
        b = critic.values(collate(other, pad_id=0, pixels=tm), None)
    plen = len(trajs[0].segments[0].token_ids)
    first_pad = trajs[0].input_ids.index(tm.pad_id, plen) - plen  # completion column of the changed picture
    obs_end = sum(len(s.token_ids) for s in trajs[0].segments[:3]) - plen
    torch.testing.assert_close(a[0, : first_pad + 1], b[0, : first_pad + 1])  # states before it
    torch.testing.assert_close(a[1], b[1])
    assert not torch.allclose(a[0, obs_end:], b[0, obs_end:])
