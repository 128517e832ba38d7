"""The training model's logprobs of a multi-turn image trajectory on the tiny Qwen2.5-VL: one forward
with the trajectory's pixels and the model's own 3-D M-RoPE positions equals the same computed turn
by turn with a KV cache (each turn's images going in with that turn)."""

from __future__ import annotations

import pytest
import torch

from rlfactory.chat.contract import SAMPLE_TOOLS
from rlfactory.chat.template import ModelTurn
from rlfactory.tools.base import ToolCall, ToolResult
from rlfactory.train.image_logprobs import incremental_logits, rope_positions, trajectory_logprobs
from rlfactory.trajectory import Segment, Trajectory
from vl_parts import picture, tiny_vl

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    return tiny_vl(tmp_path_factory.mktemp("tinyvl") / "m")[:2]


def image_trajectory(tm) -> Trajectory:
    prompt = tm.render_prompt_images([{"role": "user", "content": [
        {"type": "text", "text": "Which colour is the small square?"}, {"type": "image", "image": picture(48, 32, (9, 99, 9))}]}],
        SAMPLE_TOOLS)
    call = tm.model_turn_ids(ModelTurn([ToolCall("zoom", {"x": 3})]))
    obs = tm.render_observation_images([ToolResult("zoomed", images=[picture(24, 40, (200, 0, 0)), picture(16, 16, (0, 0, 200))])])
    answer = tm.model_turn_ids(ModelTurn([], "red"))
    return Trajectory("g-0", "g", segments=[
        Segment("prompt", prompt.ids, images=prompt.images), Segment("model", call, logprobs=[0.0] * len(call)),
        Segment("observation", obs.ids, images=obs.images), Segment("model", answer, logprobs=[0.0] * len(answer))])


def test_full_forward_equals_turn_by_turn_with_the_kv_cache(vl):
    model, tm = vl
    traj = image_trajectory(tm)
    with torch.no_grad():
        full = trajectory_logprobs(model, tm, traj)
        inputs = tm.model_inputs(traj.input_ids, traj.images())
        cuts, at = [], 0
        for s in traj.segments[:-1]:
            at += len(s.token_ids)
            cuts.append(at)
        logits = incremental_logits(model, inputs, cuts, tm.merge_size)
    ids = inputs["input_ids"][0]
    lp = torch.log_softmax(logits[:-1].float(), -1).gather(-1, ids[1:, None])[:, 0]
    steps = lp[torch.tensor(traj.loss_mask[1:], dtype=torch.bool)]
    assert full.shape == (sum(traj.loss_mask),)
    torch.testing.assert_close(steps, full, atol=2e-5, rtol=1e-4)


def test_positions_are_the_models_3d_ones_and_they_matter(vl):
    model, tm = vl
    traj = image_trajectory(tm)
    inputs = tm.model_inputs(traj.input_ids, traj.images())
    pos = rope_positions(model, inputs)
    assert pos.shape == (3, 1, len(traj.input_ids))
    assert not torch.equal(pos[1], pos[2])  # height and width differ inside an image
    assert int(pos[0, 0, -1]) < len(traj.input_ids) - 1  # an image advances the position by less than its pads
    with torch.no_grad():
        right = trajectory_logprobs(model, tm, traj)
        flat = dict(inputs)
        flat.pop("mm_token_type_ids")  # transformers then falls back to 1-D positions
        logits = model(**flat).logits[0, :-1]
    wrong = torch.log_softmax(logits, -1).gather(-1, inputs["input_ids"][0, 1:, None])[:, 0]
    wrong = wrong[torch.tensor(traj.loss_mask[1:], dtype=torch.bool)]
    assert not torch.allclose(right, wrong, atol=1e-4)


def test_a_cut_inside_an_image_is_refused(vl):
    model, tm = vl
    traj = image_trajectory(tm)
    inputs = tm.model_inputs(traj.input_ids, traj.images())
    first_pad = traj.input_ids.index(tm.pad_id)
    with pytest.raises(ValueError, match="inside an image"):
        incremental_logits(model, inputs, [first_pad + 1], tm.merge_size)
