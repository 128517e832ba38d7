"""`trainer.backend: ray` on a local Ray cluster on this CPU: two rollout workers, one tool pool
(the calculator MCP server), three training steps in lock-step mode, against the in-process
trainer with the same seed.

What is equal, and why not more: the prompts, every sampled token, statuses, tool calls,
rewards, advantages, losses, gradient norms and the trained weights are exactly equal (each
trajectory's draws are seeded on their own, so splitting a step's rows over workers does not
change them). The sampler's recorded logprobs are not bit-equal: float32 matrix products and
attention over a batch of 4 rows and over two batches of 2 (other padding widths, other shared
prefixes) round differently in the last bits (~1e-6). They enter only the `mismatch/*`
metrics (the learner recomputes its own logprobs), which are compared within 1e-5.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from rlfactory.cli.main import main

TRAIN_TESTS = Path(__file__).resolve().parents[1] / "train"
if str(TRAIN_TESTS) not in sys.path:
    sys.path.insert(0, str(TRAIN_TESTS))

from train_fixtures import run_config  # noqa: E402

pytestmark = pytest.mark.slow

CALCULATOR = {"mcpServers": {"calc": {"command": sys.executable, "args": ["-m", "rlfactory.tools.servers.calculator"],
                                      "include": ["evaluate"]}}}
RAY_ONLY = {"weight_sync/mb", "weight_sync/seconds"}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trajectories(run: Path, step: int) -> list[dict]:
    return read_jsonl(run / "trajectories" / f"step_{step:06d}.jsonl")


def test_ray_backend_lockstep_metrics_equal_the_in_process_trainer(ray_cluster, tmp_path, capsys):
    sections = dict(tools={"mcp": CALCULATOR}, trainer={"steps": 3, "save_every": 0, "seed": 7, "eval_every": 3,
                                                        "eval_limit": 2},
                    rollout={"mode": "lockstep"})
    local_cfg = run_config(tmp_path, "local", **sections)
    ray_cfg = run_config(tmp_path, "ray", **{**sections, "trainer": {**sections["trainer"], "backend": "ray"},
                                             "ray": {"rollout_workers": 2, "tool_pools": 1}})
    assert main(["train", local_cfg]) == 0
    assert main(["train", ray_cfg]) == 0
    assert "trained 3 step(s)" in capsys.readouterr().out

    local, ray = read_jsonl(tmp_path / "local" / "metrics.jsonl"), read_jsonl(tmp_path / "ray" / "metrics.jsonl")
    assert [r["step"] for r in local] == [r["step"] for r in ray] == [1, 2, 3]
    for a, b in zip(local, ray):
        assert set(b) - set(a) == RAY_ONLY and set(a) <= set(b)
        for key, value in a.items():
            if key.startswith(("time/", "perf/", "system/", "wall_time")):  # what the clock and the machine decide
                continue
            if key.startswith("mismatch/"):
                assert b[key] == pytest.approx(value, abs=1e-5), key
            else:
                assert b[key] == value, (a["step"], key, value, b[key])
    assert all(r["optim/grad_norm"] > 0 and r["traj/model_tokens"] > 0 for r in local)
    assert all(r["weight_sync/mb"] > 0 for r in ray)
    # The evaluation after step 3 (greedy, on the workers through the same engine) agrees too.
    (ea,), (eb,) = read_jsonl(tmp_path / "local" / "eval.jsonl"), read_jsonl(tmp_path / "ray" / "eval.jsonl")
    timing = ("time/", "system/", "wall_time")
    assert {k: v for k, v in ea.items() if not k.startswith(timing)} == {k: v for k, v in eb.items() if not k.startswith(timing)}
    assert ea["questions"] == 2

    for step in (1, 2, 3):
        a, b = trajectories(tmp_path / "local", step), trajectories(tmp_path / "ray", step)
        assert [t["id"] for t in a] == [t["id"] for t in b]
        for ta, tb in zip(a, b):
            assert [s["token_ids"] for s in ta["segments"]] == [s["token_ids"] for s in tb["segments"]]
            assert (ta["status"], ta["reward"], ta["advantage"]) == (tb["status"], tb["reward"], tb["advantage"])
            versions = {s["policy_version"] for s in tb["segments"] if s["role"] == "model"}
            assert versions == {step - 1}  # the workers sampled with the weights pushed after step - 1

    from safetensors.torch import load_file

    last = "checkpoints/step_000003/model/model.safetensors"
    wa, wb = load_file(tmp_path / "local" / last), load_file(tmp_path / "ray" / last)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
