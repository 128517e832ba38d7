"""`rlfactory train` / `rlfactory eval` end to end on tiny:1m with the python env, and the loop's
handling of infra errors."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlfactory.cli.main import main
from rlfactory.config import RunConfig, load_config
from rlfactory.rewards.rule import RuleReward
from rlfactory.run_state import describe, read_run_state
from rlfactory.train.runlog import read_metrics
from rlfactory.train.step import TrainingStep
from train_fixtures import FixedEngine, fixed_trainer, make_traj, record_updates, run_config

HERE = Path(__file__).parent
REQUIRED = [
    "reward/mean", "reward/std", "reward/numeric", "reward/train_fixtures:low_ids", "accuracy", "adv/mean", "adv/std",
    "loss/total", "policy/clipfrac", "policy/entropy", "optim/grad_norm", "optim/lr", "perf/gen_tokens_per_s",
    "perf/train_tokens_per_s", "traj/tool_calls", "traj/turns", "status/ok", "status/truncated", "status/infra_error",
    "mismatch/abs_diff", "mismatch/kl", "time/step_s",
]
# Everything but wall-clock figures must repeat exactly under the same seed.
TIMING = ("time/", "perf/", "system/", "wall_time")  # what the clock and the machine decide


def _deterministic(records):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in records]


def test_train_writes_the_run_dir_and_eval_reports(tmp_path, capsys):
    cfg_path = run_config(tmp_path, trainer={"keep_last": 1, "eval_every": 2, "eval_limit": 2})
    assert main(["train", cfg_path]) == 0
    run = tmp_path / "run"
    (evaluation,) = read_metrics(run / "eval.jsonl")  # eval_every=2: once, after step 2
    assert evaluation["step"] == 2 and evaluation["questions"] == 2 and "accuracy" in evaluation
    assert (run / "config.yaml").is_file()
    cfg = load_config(RunConfig, run / "config.yaml")  # the resolved config loads back
    assert cfg.trainer.steps == 2 and cfg.algo.group_size == 2
    records = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for key in REQUIRED:
        assert key in records[0], key
    assert records[0]["optim/grad_norm"] > 0 and records[1]["policy_version"] == 2
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    trajs = [json.loads(line) for line in (run / "trajectories" / "step_000002.jsonl").read_text().splitlines()]
    assert len(trajs) == 4 and all(t["reward"] is not None for t in trajs)
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == ["step_000002"]  # keep_last 1
    model_dir = run / "checkpoints" / "step_000002" / "model"
    from transformers import AutoModelForCausalLM

    from rlfactory.tiny import resolve_model

    trained = AutoModelForCausalLM.from_pretrained(model_dir)
    initial = AutoModelForCausalLM.from_pretrained(resolve_model("tiny:1m"))
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), initial.parameters()))

    # a second run into the same run_dir without --resume is refused
    assert main(["train", cfg_path]) == 2

    out = tmp_path / "eval.json"
    capsys.readouterr()
    assert main(["eval", cfg_path, "--model", str(model_dir), "--limit", "3", "--out", str(out)]) == 0
    assert "accuracy" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert len(report["questions"]) == 3
    q = report["questions"][0]
    for key in ("id", "question", "accuracy", "reward", "reward_terms", "tool_calls", "turns", "statuses"):
        assert key in q, key
    for key in ("accuracy", "reward/mean", "traj/tool_calls", "traj/turns"):
        assert key in report["averages"]


def test_resume_after_sigkill_mid_step_matches_an_uninterrupted_run(tmp_path, capsys):
    # As in a full test session, this process has called torch.set_num_threads before (other
    # tests do); the killed run below is a fresh process that has not. Their numbers must agree.
    torch.set_num_threads(torch.get_num_threads())
    steps = {"steps": 2, "save_every": 1}
    full = run_config(tmp_path, "full", trainer=steps)
    assert main(["train", full]) == 0
    expected = _deterministic(read_metrics(tmp_path / "full" / "metrics.jsonl"))
    assert len(expected) == 2
    assert read_run_state(tmp_path / "full")["state"] == "finished"

    cut = run_config(tmp_path, "cut", trainer=steps)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "rlfactory.cli.main", "train", cut], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first = tmp_path / "cut" / "checkpoints" / "step_000001" / "meta.json"
    deadline = time.monotonic() + 120
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    os.kill(proc.pid, signal.SIGKILL)  # step 2 has just started
    proc.wait()
    assert not (tmp_path / "cut" / "checkpoints" / "step_000002").exists()
    killed = read_run_state(tmp_path / "cut")  # it could not say so: its pid is gone
    assert killed["state"] == "running" and killed["pid"] == proc.pid and describe(killed)[0] == "failed"

    capsys.readouterr()
    assert main(["train", cut, "--resume"]) == 0
    assert "trained 1 step(s)" in capsys.readouterr().out  # step 1 came from the checkpoint
    got = _deterministic(read_metrics(tmp_path / "cut" / "metrics.jsonl"))
    assert got == expected
    assert describe(read_run_state(tmp_path / "cut")) == ("finished", "step 2 of 2")
    assert sorted(p.name for p in (tmp_path / "cut" / "trajectories").iterdir()) == [
        "step_000001.jsonl", "step_000002.jsonl"]


def test_an_evaluation_cut_short_by_a_kill_is_redone_on_resume(tmp_path, capsys):
    sections = {"trainer": {"steps": 2, "save_every": 1, "eval_every": 1, "eval_limit": 2},
                "reward": {"terms": {"train_fixtures:low_ids": 1.0, "train_fixtures:blocks_in_eval": 1.0}}}
    full = run_config(tmp_path, "full", **sections)
    assert main(["train", full]) == 0
    expected = _deterministic(read_metrics(tmp_path / "full" / "eval.jsonl"))
    assert [r["step"] for r in expected] == [1, 2]

    cut = run_config(tmp_path, "cut", **sections)
    marker = tmp_path / "evaluating"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "RLF_TEST_BLOCK_EVAL": str(marker)}
    proc = subprocess.Popen([sys.executable, "-m", "rlfactory.cli.main", "train", cut], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    os.kill(proc.pid, signal.SIGKILL)  # in the middle of step 1's evaluation
    proc.wait()
    assert (tmp_path / "cut" / "checkpoints" / "step_000001" / "meta.json").is_file()
    assert read_metrics(tmp_path / "cut" / "eval.jsonl") == []

    assert main(["train", cut, "--resume"]) == 0
    assert _deterministic(read_metrics(tmp_path / "cut" / "eval.jsonl")) == expected
    assert _deterministic(read_metrics(tmp_path / "cut" / "metrics.jsonl")) == _deterministic(
        read_metrics(tmp_path / "full" / "metrics.jsonl"))


@pytest.mark.parametrize("variant", ["rloo_gspo_kl_bf16", "gae_epochs", "lora_kl"])
def test_algorithm_variants_train(tmp_path, variant):
    sections = {
        "rloo_gspo_kl_bf16": {"algo": {"advantage": "rloo", "loss": "gspo", "kl_coef": 0.1, "clip_low": 3e-4,
                                       "clip_high": 4e-4, "loss_agg": "seq-mean-token-mean"},
                              "trainer": {"bf16": True}},
        "gae_epochs": {"algo": {"advantage": "gae", "epochs": 2, "minibatch_size": 2, "micro_batch_size": 1}},
        "lora_kl": {"algo": {"kl_coef": 0.05, "dynamic_sampling": True, "advantage": "dr_grpo"},
                    "trainer": {"lora": {"r": 4, "alpha": 8}, "lr": 1e-2}},
    }[variant]
    sections.setdefault("trainer", {})["steps"] = 1
    cfg_path = run_config(tmp_path, **sections)
    assert main(["train", cfg_path]) == 0
    (rec,) = read_metrics(tmp_path / "run" / "metrics.jsonl")
    model_dir = tmp_path / "run" / "checkpoints" / "step_000001" / "model"
    if variant == "rloo_gspo_kl_bf16":
        assert rec["policy/kl"] >= 0 and rec["optim/grad_norm"] > 0
    if variant == "gae_epochs":
        assert "loss/value" in rec and rec["optim/updates"] == 4
    if variant == "lora_kl":
        assert (model_dir / "adapter_config.json").is_file() and not (model_dir / "model.safetensors").exists()
        if rec["batch/kept"] > 0:
            assert "policy/kl" in rec
        assert main(["eval", cfg_path, "--model", str(model_dir), "--limit", "1"]) == 0


def test_infra_error_trajectories_are_left_out_of_baseline_and_loss(tmp_path):
    def traj(ids, group, tid):
        return make_traj([("prompt", [1, 2]), ("model", ids)], group, tid)

    broken = traj([3, 4], "g0", "b")
    broken.status, broken.error = "infra_error", "tool server died"
    trajs = [traj([60, 61], "g0", "a"), broken, traj([5, 6], "g1", "c"), traj([8, 7], "g1", "d")]
    reward = RuleReward({"train_fixtures:first_token_even": 1.0})  # raises if asked to score an infra_error
    trainer = fixed_trainer(tmp_path, FixedEngine(trajs), reward)
    updates = record_updates(trainer)
    metrics, out = asyncio.run(trainer.step(1))
    assert out[1].reward is None and metrics["status/infra_error"] == 1
    assert [t.reward for t in out] == [1.0, None, 0.0, 1.0]
    assert metrics["batch/kept"] == 3  # the broken one is out of the loss
    [data] = updates
    assert len(data.batch) == 3
    # group g0 has one valid member left: nothing to compare against, advantage 0 (not 1 - 0.5)
    assert data.advantages[0].item() == 0.0
    assert data.advantages[1].item() == -data.advantages[2].item() < 0
    assert metrics["optim/grad_norm"] > 0


CUSTOM_ALGOS = '''
from rlfactory.algos import grpo_advantages, ppo_clip_loss, register_policy_loss

CALLS = {"advantage": 0, "loss": 0}


def centred(rewards, groups, valid):
    CALLS["advantage"] += 1
    return grpo_advantages(rewards, groups, valid, norm_by_std=False)


@register_policy_loss("test-half-ppo")
def half_ppo(*args, **kwargs):
    CALLS["loss"] += 1
    loss, metrics = ppo_clip_loss(*args, **kwargs)
    return loss / 2, metrics
'''


def test_a_users_advantage_and_loss_are_named_in_the_yaml(tmp_path, capsys):
    (tmp_path / "algos_of_a_user.py").write_text(CUSTOM_ALGOS)
    cfg_path = run_config(tmp_path, algo={"advantage": "algos_of_a_user:centred", "loss": "algos_of_a_user:test-half-ppo"},
                          trainer={"steps": 1})
    assert main(["train", cfg_path]) == 0
    import algos_of_a_user

    (rec,) = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert algos_of_a_user.CALLS["advantage"] == 1 and algos_of_a_user.CALLS["loss"] >= (rec["batch/kept"] > 0)

    bad = run_config(tmp_path, "bad", algo={"advantage": "grpo_typo"})
    capsys.readouterr()
    assert main(["train", bad]) == 2
    err = capsys.readouterr().err
    assert "algo.advantage" in err and "unknown advantage estimator 'grpo_typo'" in err and "rloo" in err


def test_a_run_that_raises_says_failed_and_why_in_run_state(tmp_path, capsys, monkeypatch):
    async def boom(self, step, rollout, executor=None):
        raise RuntimeError("the GPU caught fire")

    monkeypatch.setattr(TrainingStep, "learn", boom)
    cfg = run_config(tmp_path, trainer={"steps": 2})
    from rlfactory.train.run import train

    with pytest.raises(RuntimeError):
        asyncio.run(train(load_config(RunConfig, cfg)))
    assert describe(read_run_state(tmp_path / "run")) == ("failed", "RuntimeError: the GPU caught fire")
