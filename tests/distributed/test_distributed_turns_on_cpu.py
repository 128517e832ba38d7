"""Turn-level credit under `trainer.backend: ray` on a local Ray cluster: a rollout worker sends back
trajectories whose turns the trainer scores (process rewards) and trains on with gigpo; one step
equals the in-process trainer's (the same reasoning as test_distributed_train_on_cpu.py).

One rollout worker, so that it decodes the step's four rows as one batch, as the in-process
generator does. Split over two workers (two batches of 2), the sampler's logprobs round otherwise
in the last bits (~5e-7) and on tiny:1m's nearly flat distribution that flipped a sampled token
(1052 -> 1051, the last of trajectory 2 at seed 3) once the GQA decode attention changed the
rounding: a different trajectory, hence a different gradient (grad norm 8.124 vs 8.244), not a
different training step. Splitting rows over workers is test_distributed_train_on_cpu.py's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rlfactory.cli.main import main

TRAIN_TESTS = Path(__file__).resolve().parents[1] / "train"
if str(TRAIN_TESTS) not in sys.path:
    sys.path.insert(0, str(TRAIN_TESTS))

from train_fixtures import run_config  # noqa: E402

pytestmark = pytest.mark.slow


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_ray_backend_trains_gigpo_on_process_rewards_as_the_in_process_trainer(ray_cluster, tmp_path):
    sections = dict(trainer={"steps": 1, "save_every": 0, "seed": 3}, rollout={"mode": "lockstep"},
                    algo={"advantage": "gigpo", "turn_gamma": 0.9},
                    reward={"turn_terms": {"train_fixtures:turn_low_ids": 1.0, "tool_success": 0.5}})
    local_cfg = run_config(tmp_path, "local", **sections)
    ray_cfg = run_config(tmp_path, "ray", **{**sections, "trainer": {**sections["trainer"], "backend": "ray"},
                                             "ray": {"rollout_workers": 1, "tool_pools": 1}})
    assert main(["train", local_cfg]) == 0 and main(["train", ray_cfg]) == 0
    (a,), (b,) = read_jsonl(tmp_path / "local" / "metrics.jsonl"), read_jsonl(tmp_path / "ray" / "metrics.jsonl")
    assert "turn_reward/train_fixtures:turn_low_ids" in a and a["optim/grad_norm"] > 0
    for key, value in a.items():
        if key.startswith(("time/", "perf/", "system/", "wall_time")):
            continue
        if key.startswith("mismatch/"):
            assert b[key] == pytest.approx(value, abs=1e-5), key
        else:
            assert b[key] == value, (key, value, b[key])
    ta, tb = (read_jsonl(tmp_path / r / "trajectories" / "step_000001.jsonl") for r in ("local", "ray"))
    turns = lambda ts: [(s["reward"], s["reward_terms"]) for t in ts for s in t["segments"] if s["role"] == "model"]  # noqa: E731
    assert turns(ta) == turns(tb) and all(r is not None for r, _ in turns(ta))
    assert [t["advantage"] for t in ta] == [t["advantage"] for t in tb]
