"""Checkpoints (atomic, keep-last, RNG), the run log's resume truncation, the prompt sampler."""

from __future__ import annotations

import json
import random

import numpy as np
import torch

from rlfactory.train.checkpoint import (
    CheckpointMeta,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    set_rng_state,
)
from rlfactory.train.data import PromptSampler
from rlfactory.train.model import apply_lora, load_full_weights, load_lora_weights
from rlfactory.config import LoraSection
from rlfactory.train.runlog import RunLog, read_metrics
from train_fixtures import make_traj, tiny_qwen3


def _save(run_dir, step, model, keep=2):
    meta = CheckpointMeta(step=step, policy_version=step, data_position=4 * step, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return save_checkpoint(run_dir, meta, model, None, {"optimizer": opt.state_dict()}, keep_last=keep)


def test_checkpoint_roundtrip_keeps_last_k_and_ignores_partial(tmp_path):
    model = tiny_qwen3()
    for step in (1, 2, 3):
        _save(tmp_path, step, model)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3]
    # a crash mid-write leaves a temp folder or a folder without meta.json: neither counts
    (tmp_path / "checkpoints" / ".tmp-step_000004-123").mkdir()
    (tmp_path / "checkpoints" / "step_000005").mkdir()
    assert latest_checkpoint(tmp_path).name == "step_000003"
    meta, state = load_checkpoint(latest_checkpoint(tmp_path))
    assert meta.step == 3 and meta.data_position == 12 and "optimizer" in state and "rng" in state
    other = tiny_qwen3(seed=1)
    load_full_weights(other, latest_checkpoint(tmp_path) / "model")
    for (n, a), b in zip(model.named_parameters(), other.parameters()):
        assert torch.equal(a, b), n
    _save(tmp_path, 6, model)  # saving prunes temp leftovers too
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_rng_state_is_saved_and_restored(tmp_path):
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    path = _save(tmp_path, 1, tiny_qwen3())
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    _, state = load_checkpoint(path)
    set_rng_state(state["rng"])
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_lora_checkpoint_saves_and_loads_the_adapter(tmp_path):
    policy = apply_lora(tiny_qwen3(), LoraSection(r=4, alpha=8))
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.add_(0.01)
    path = _save(tmp_path, 1, policy)
    assert (path / "model" / "adapter_config.json").is_file()
    fresh = apply_lora(tiny_qwen3(), LoraSection(r=4, alpha=8))
    load_lora_weights(fresh, path / "model")
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.allclose(policy(input_ids=ids).logits, fresh(input_ids=ids).logits)
    with fresh.disable_adapter():
        assert not torch.allclose(policy(input_ids=ids).logits, fresh(input_ids=ids).logits)


def test_runlog_resume_cuts_what_came_after_the_checkpoint(tmp_path):
    log = RunLog(tmp_path)
    for step in (1, 2, 3):
        log.log(step, {"reward/mean": float(step)})
        log.trajectories(step, [make_traj([("prompt", [1]), ("model", [2])])])
    log.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "rew')  # torn line of a killed process
    log = RunLog(tmp_path, resume_step=2)
    log.log(3, {"reward/mean": 30.0})
    log.close()
    assert [(r["step"], r["reward/mean"]) for r in read_metrics(tmp_path / "metrics.jsonl")] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    assert sorted(p.name for p in (tmp_path / "trajectories").iterdir()) == ["step_000001.jsonl", "step_000002.jsonl"]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])


def test_prompt_sampler_is_a_function_of_seed_and_step():
    rows = [{"id": i} for i in range(5)]
    a, b = PromptSampler(rows, 3, seed=7), PromptSampler(rows, 3, seed=7)
    seq = [[r["id"] for r in a.rows_for(s)] for s in range(4)]
    assert [[r["id"] for r in b.rows_for(s)] for s in (3, 1, 0, 2)] == [seq[3], seq[1], seq[0], seq[2]]
    flat = [i for s in seq for i in s]
    assert sorted(flat[:5]) == list(range(5)) and sorted(flat[5:10]) == list(range(5))  # whole passes
    assert seq != [[r["id"] for r in PromptSampler(rows, 3, seed=8).rows_for(s)] for s in range(4)]
    assert a.position(4) == 12
