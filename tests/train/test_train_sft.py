"""Warm start: demonstrations become token-level trajectories and SFT learns their model tokens."""

from __future__ import annotations

import pytest
import torch

from rlfactory.chat import make_tool_manager
from rlfactory.trajectory import Trajectory
from rlfactory.tiny import resolve_model
from rlfactory.tools.base import ToolSpec
from rlfactory.train.sft import demo_to_trajectory, sft_train
from rlfactory.config import SftConfig

SEARCH = ToolSpec("search", "Search the corpus.", {"type": "object", "properties": {"query": {"type": "string"}}})

DEMO = [
    {"role": "system", "content": "Answer with search."},
    {"role": "user", "content": "Where was Kano Tami born?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "search", "arguments": {"query": "Kano Tami"}}}]},
    {"role": "tool", "content": "Doc 1(Title: Kano Tami) Kano Tami was born in Duser."},
    {"role": "assistant", "content": "<answer>Duser</answer>"},
]


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model("tiny:1m")
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def test_demo_trajectory_masks_exactly_the_model_turns(tiny):
    _, tok = tiny
    tm = make_tool_manager(tok, "qwen3")
    traj = demo_to_trajectory(DEMO, tm, [SEARCH])
    assert [s.role for s in traj.segments] == ["prompt", "model", "observation", "model"]
    model_text = tok.decode([t for t, m in zip(traj.input_ids, traj.loss_mask) if m])
    assert '"query": "Kano Tami"' in model_text and "<answer>Duser</answer>" in model_text
    assert "Doc 1" not in model_text and "Where was" not in model_text
    # The same ids the chat template renders for the whole conversation (the token contract).
    assert tok.decode(traj.input_ids).count("<tool_response>") == 1
    # Round-trips as a trajectory line.
    assert Trajectory.from_json(traj.to_json()) == traj


def test_demo_without_assistant_turn_is_a_clear_error(tiny):
    _, tok = tiny
    with pytest.raises(ValueError, match="no assistant turn"):
        demo_to_trajectory(DEMO[:2], make_tool_manager(tok, "qwen3"), [SEARCH])


def test_sft_learns_the_demonstrated_tokens(tiny):
    model, tok = tiny
    tm = make_tool_manager(tok, "qwen3")
    traj = demo_to_trajectory(DEMO, tm, [SEARCH])
    cfg = SftConfig(steps=30, batch_size=1, lr=3e-3, warmup_steps=2, seed=0)
    torch.manual_seed(0)
    history = sft_train(model, [traj], tok.pad_token_id, cfg)
    assert len(history) == 30
    assert history[-1]["loss"] < 0.5 * history[0]["loss"]
    assert history[-1]["token_acc"] > history[0]["token_acc"]


def test_lr_schedule_linear_decays_to_a_tenth_and_constant_stays(tiny):
    from transformers import AutoModelForCausalLM

    _, tok = tiny
    traj = demo_to_trajectory(DEMO, make_tool_manager(tok, "qwen3"), [SEARCH])
    lrs = {}
    for schedule in ("linear", "constant"):
        model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny:1m"))
        cfg = SftConfig(steps=12, batch_size=1, lr=2e-3, warmup_steps=2, lr_schedule=schedule)
        lrs[schedule] = [h["lr"] for h in sft_train(model, [traj], tok.pad_token_id, cfg)]
    # The lr a row reports is the next step's: warm-up ends at step 2, then 10 steps to the end.
    assert lrs["constant"][1:] == pytest.approx([2e-3] * 11)
    assert lrs["linear"][:1] == lrs["constant"][:1]
    assert lrs["linear"][-1] == pytest.approx(2e-4)
    assert all(a > b for a, b in zip(lrs["linear"][1:], lrs["linear"][2:]))
    with pytest.raises(ValueError, match="lr_schedule"):
        SftConfig(lr_schedule="cosine")


def test_lr_schedule_wsd_holds_then_decays_over_its_last_steps(tiny):
    from transformers import AutoModelForCausalLM

    _, tok = tiny
    traj = demo_to_trajectory(DEMO, make_tool_manager(tok, "qwen3"), [SEARCH])
    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny:1m"))
    cfg = SftConfig(steps=12, batch_size=1, lr=2e-3, warmup_steps=2, lr_schedule="wsd", decay_steps=4)
    lrs = [h["lr"] for h in sft_train(model, [traj], tok.pad_token_id, cfg)]
    # The lr a row reports is the next step's: warm-up to step 2, stable through step 7, then
    # steps 8..11 decay linearly to a tenth (step 12, the last row's "next", is at the tenth).
    assert lrs[:1] == pytest.approx([2e-3])
    assert lrs[1:8] == pytest.approx([2e-3] * 7)
    assert lrs[8:] == pytest.approx([2e-3 * (1 - 0.9 * k / 4) for k in (1, 2, 3, 4)])
    with pytest.raises(ValueError, match="decay_steps"):
        SftConfig(steps=12, warmup_steps=2, lr_schedule="wsd", decay_steps=11)
    with pytest.raises(ValueError, match="decay_steps"):
        SftConfig(steps=12, lr_schedule="wsd", decay_steps=0)


def _observation_logprob(model, traj, pad_id) -> float:
    """Mean logprob of the observation tokens (the tool result) under `model`."""
    from rlfactory.train.batch import collate

    batch = collate([traj], pad_id)
    with torch.no_grad():
        logits = model(torch.tensor([traj.input_ids])).logits[0, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(traj.input_ids[1:]).unsqueeze(-1))[:, 0]
    start = traj.prompt_len
    obs = (batch.completion_mask[0].bool() & (batch.loss_mask[0] == 0)).nonzero()[:, 0] + start - 1
    return float(logp[obs].mean())


def test_full_text_steps_train_on_the_tool_results_too(tiny):
    from transformers import AutoModelForCausalLM

    _, tok = tiny
    path = resolve_model("tiny:1m")
    traj = demo_to_trajectory(DEMO, make_tool_manager(tok, "qwen3"), [SEARCH])
    after = {}
    for full in (0, 20):
        model = AutoModelForCausalLM.from_pretrained(path)
        before = _observation_logprob(model, traj, tok.pad_token_id)
        torch.manual_seed(0)
        history = sft_train(model, [traj], tok.pad_token_id,
                            SftConfig(steps=20, full_text_steps=full, batch_size=1, lr=3e-3, warmup_steps=2))
        assert [h["full_text"] for h in history] == [True] * full + [False] * (20 - full)
        after[full] = _observation_logprob(model, traj, tok.pad_token_id) - before
    # The full-text run learns the tool result's tokens; model-only SFT moves them
    # only as far as they resemble the model tokens (the name in the query).
    assert after[20] > 1.0
    assert after[20] > after[0] + 1.0


def test_passes_by_length_make_the_same_step_as_one_padded_pass(tiny):
    """A guess beside a two-search demonstration: by-length passes skip the guess's padding and sum
    to the gradient of one padded pass (same weights after the steps, float rounding apart)."""
    from transformers import AutoModelForCausalLM

    from rlfactory.train.batch import collate
    from rlfactory.train.sft import sft_passes

    _, tok = tiny
    tm = make_tool_manager(tok, "qwen3")
    guess = DEMO[:2] + [{"role": "assistant", "content": "<answer>Rofan</answer>"}]
    long = DEMO[:4] + [DEMO[2], {"role": "tool", "content": "Doc 1(Title: Duser) Duser is a city in Lemara. " * 6}, DEMO[4]]
    demos = [demo_to_trajectory(d, tm, [SEARCH]) for d in (guess, DEMO, long, guess)]
    lengths = sorted(len(d.input_ids) - d.prompt_len for d in demos)  # after the shared prompt
    assert lengths[-1] > 10 * lengths[0]

    batch = collate(demos, tok.pad_token_id)
    passes = sft_passes(batch, SftConfig(batch_size=4))
    assert len(passes) > 1 and sorted(len(p.loss_mask) for p in passes) != [4]
    padded = lambda b: b.completion_ids.numel() + b.prompt_ids.numel()
    assert sum(padded(p) for p in passes) < padded(batch)
    assert sum(float(p.loss_mask.sum()) for p in passes) == float(batch.loss_mask.sum())
    assert sft_passes(batch, SftConfig(group_by_length=False)) == [batch]
    capped = sft_passes(batch, SftConfig(micro_batch_tokens=1))
    assert len(capped) == 4  # a row over the cap gets a pass of its own

    path = resolve_model("tiny:1m")
    weights, losses = {}, {}
    for by_length in (False, True):
        model = AutoModelForCausalLM.from_pretrained(path)
        cfg = SftConfig(steps=3, batch_size=4, lr=1e-3, warmup_steps=1, seed=0, group_by_length=by_length)
        history = sft_train(model, demos, tok.pad_token_id, cfg)
        weights[by_length] = torch.cat([p.detach().flatten() for p in model.parameters()])
        losses[by_length] = [h["loss"] for h in history]
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)
    # Adam divides by the gradient's own scale, so rounding-level gradient differences move a
    # weight by up to ~1e-5 here (measured: 5.7e-6 at most, 9e-10 on average) of ~3e-3 in all.
    assert torch.allclose(weights[True], weights[False], atol=2e-5, rtol=0)
    assert not torch.equal(weights[True], torch.cat([p.detach().flatten() for p in AutoModelForCausalLM.from_pretrained(path).parameters()]))


def test_sft_pass_settings_are_checked():
    with pytest.raises(ValueError, match="micro_batch_tokens must be >= 1"):
        SftConfig(micro_batch_tokens=0)
    with pytest.raises(ValueError, match="needs sft.group_by_length"):
        SftConfig(micro_batch_tokens=512, group_by_length=False)
