"""GRPO on the visual env (issue 31) runs the real loop end to end on tiny-vl: the local generator
prefills the pictures (prompt and zoomed ones), the trainer recomputes the sampled tokens'
logprobs with the same pixels and positions (mismatch ~0), and the update runs."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from rlfactory.config import RunConfig, load_config
from rlfactory.train.loop import Trainer
from rlfactory.train.run import load_env_data
from rlfactory.train.session import open_rollout
from train_fixtures import run_config

pytestmark = pytest.mark.usefixtures("one_thread")


def test_one_grpo_step_on_the_visual_env_samples_and_trains_with_the_pictures(tmp_path):
    cfg = load_config(RunConfig, run_config(
        tmp_path, model={"path": "tiny-vl:1m"}, env={"name": "visual", "options": {"n_train": 8, "n_test": 2}},
        reward={"terms": {"exact_match": 1.0, "train_fixtures:low_ids": 1.0}},  # varies: the update moves
        rollout={"max_turns": 2, "max_new_tokens": 24, "max_total_tokens": 1024, "mode": "async"},
        algo={"group_size": 2, "epochs": 2}, trainer={"steps": 1, "prompts_per_step": 2}))

    async def main():
        async with open_rollout(cfg, reward_mode="required") as session:
            trainer = Trainer(cfg, session, session.reward, load_env_data(session.env, "train"))
            visual = session.model.model.visual
            before = [p.detach().clone() for p in visual.parameters()]
            metrics, trajs = await trainer.step(1)
            moved = any(not torch.equal(a, p) for a, p in zip(before, visual.parameters()))
            return metrics, trajs, dict(session.generator.stats), moved

    metrics, trajs, stats, moved = asyncio.run(main())
    assert len(trajs) == 4 and all(t.segments[0].images for t in trajs)
    assert stats["tokens"] > 0
    # the trainer's logprobs of the sampled tokens are the sampler's: same pixels, same positions
    assert metrics["mismatch/max_abs_diff"] < 1e-3, metrics
    assert math.isfinite(metrics["loss/policy"]) and metrics["loss/policy"] != 0.0
    assert moved  # the update reached the vision tower through the pixels
