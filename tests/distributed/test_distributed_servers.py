"""Ray rollout workers on a generation server: `trainer.backend: ray` with `generator.backend:
server`. Each worker's generator is the ServerGenerator that open_rollout builds from the config
(no model in the workers); the learner pushes its weights to the server after each update (the
servers' weight sync, not the object store); tools go through the tool pool."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from rlfactory.cli.main import main
from rlfactory.trajectory import read_jsonl
from rlfactory.serve.process import ServeProcess
from rlfactory.serve.weights import weights_digest

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_ray_workers_generate_on_a_server_that_gets_the_learners_weights(ray_cluster, tmp_path, capsys):
    script = ["--threads", "1", "--seed", "0", "--logits-processor", "scripted_calculator:policy"]
    with ServeProcess("tiny:1m", script, cwd=str(EXAMPLES)) as server:
        run = tmp_path / "run"
        rc = main(["train", str(EXAMPLES / "servers.yaml"), f"generator.urls=[{server.url}]", f"trainer.run_dir={run}",
                   "trainer.steps=2", "trainer.prompts_per_step=2", "algo.group_size=2", "rollout.max_new_tokens=64",
                   "rollout.max_total_tokens=700", "trainer.progress=false", "trainer.backend=ray",
                   "ray.rollout_workers=2"])
        assert rc == 0, capsys.readouterr().err
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in metrics] == [1, 2]
        assert all(m["weight_sync/ok"] == 1 and m["weight_sync/failed"] == 0 for m in metrics)
        for step in (1, 2):
            trajs = read_jsonl(run / "trajectories" / f"step_{step:06d}.jsonl")
            assert {s.policy_version for t in trajs for s in t.segments if s.role == "model"} == {step - 1}
            for t in trajs:  # the scripted server made each call the calculator, through the tool pool
                assert t.status == "ok" and [(c.name, c.status) for c in t.tool_calls] == [("evaluate", "ok")]
                assert t.reward == 1.0
        health = httpx.get(server.url + "/health", timeout=30).json()
        assert health["policy_version"] == 2 and health["turns"] >= 16  # 2 steps x 4 trajectories x 2 turns
        final = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_000002" / "model", dtype=torch.float32)
        digest = httpx.get(server.url + "/weights_digest", timeout=60).json()
        assert digest == {"sha256": weights_digest(final), "policy_version": 2}
