"""The trajectory viewer shows each model turn's own reward and its terms (issue 29), in real
headless Chromium against a real `rlfactory ui` process; the run folder is written by the real
Trajectory JSON writer."""

from __future__ import annotations

import json

import pytest

from rlfactory.trajectory import Segment, ToolCallRecord, Trajectory, write_jsonl

pytestmark = [pytest.mark.chromium, pytest.mark.slow]


def test_the_viewer_shows_per_turn_rewards(page, studio, runs_root):
    run = runs_root / "turns"
    (run / "trajectories").mkdir(parents=True)
    (run / "config.yaml").write_text("model: {path: tiny:1m}\nenv: {name: search}\nalgo: {advantage: gigpo}\n"
                                     "reward: {turn_terms: {retrieval_hit: 1.0}}\ntrainer: {steps: 1}\n")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 1.0, "turn_reward/mean": 0.75}) + "\n")
    segs = [Segment("prompt", [1, 2], "Q"), Segment("model", [3, 4], "search", [-0.5, -0.25], 0, reward=1.5,
                                                      reward_terms={"step": 0.5, "retrieval_hit": 1.0}),
            Segment("observation", [5], "results"), Segment("model", [6], "answer", [-0.1], 0)]
    t = Trajectory("g-0", "g", segs, [ToolCallRecord("search", {"query": "q"}, "ok", 0.1, turn=1)], turns=2, reward=1.0,
                   reward_terms={"exact_match": 1.0}, advantage=0.5)
    write_jsonl(run / "trajectories" / "step_000001.jsonl", [t])
    page.goto(f"{studio.url}/#/run/turns?tab=traj&step=1")
    page.wait_for_selector("#groups .member")
    page.click("#groups .member[data-index='0']")
    page.wait_for_selector("#segments .seg.model")
    heads = [page.inner_text(f"#segments .seg.model >> nth={i} >> .seghead") for i in range(2)]
    assert "turn reward 1.5000" in heads[0] and "step 0.5000" in heads[0] and "retrieval_hit 1)" in heads[0]
    assert "turn reward" not in heads[1]  # an unscored turn says nothing
