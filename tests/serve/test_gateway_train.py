"""GRPO on gateway episodes: `rlfactory train`'s function with `env.name: agent` runs the OpenAI SDK
agent (examples/gateway/openai_agent.py, unchanged) per row x group through an in-process gateway
on tiny:1m (ScriptedPolicy writes its tool calls; the answer has sampled tokens in it, which the
reward reads) and trains: losses finite, weights changed, trajectories logged with their episode."""

from __future__ import annotations

import asyncio
import functools
import json
import math

import pytest
import torch
import yaml
from gateway_fixtures import EXAMPLES, add_plan
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlfactory.config import RunConfig, load_config
from rlfactory.rollout.scripted import ScriptedPolicy
from rlfactory.serve.gateway_agents import open_agent_rollout
from rlfactory.tiny import resolve_model
from rlfactory.train.checkpoint import latest_checkpoint
from rlfactory.train.run import train

pytestmark = pytest.mark.usefixtures("one_thread")


def spread_reward(row, answer) -> float:
    """Correct answers score 1 plus a share that depends on the sampled tokens (GRPO needs spread)."""
    return float(str(row["answer"]) in answer) + (sum(map(ord, answer)) % 7) / 7


def test_grpo_trains_on_gateway_episodes(tmp_path):
    rows = [json.loads(line) for line in (EXAMPLES / "rows.jsonl").read_text().splitlines()[:4]]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg_path = tmp_path / "train.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "model": {"path": "tiny:1m"},
        "env": {"name": "agent", "train_data": "rows.jsonl",
                "options": {"agent": "openai_agent:agent", "reward": "test_gateway_train:spread_reward",
                            "timeout_s": 60}},
        "rollout": {"max_new_tokens": 48, "max_total_tokens": 1024},
        "algo": {"group_size": 2},
        "trainer": {"steps": 2, "prompts_per_step": 2, "lr": 1e-3, "run_dir": str(tmp_path / "run"), "save_every": 1,
                    "progress": False},
    }))
    cfg = load_config(RunConfig, cfg_path)
    path = resolve_model("tiny:1m")
    tok = AutoTokenizer.from_pretrained(path)
    policy = ScriptedPolicy(tok, add_plan(free_answer=3), tok.convert_tokens_to_ids("<|im_end|>"))
    history = asyncio.run(train(cfg, open_session=functools.partial(open_agent_rollout, logits_processor=policy)))

    assert len(history) == 2
    for m in history:
        assert math.isfinite(m["loss/policy"]) and m["batch/kept"] == 4
    initial = AutoModelForCausalLM.from_pretrained(path)
    trained = AutoModelForCausalLM.from_pretrained(latest_checkpoint(tmp_path / "run") / "model")
    changed = [n for (n, p), q in zip(initial.named_parameters(), trained.parameters()) if not torch.equal(p, q)]
    assert changed
    step_file = tmp_path / "run" / "trajectories" / "step_000001.jsonl"
    logged = [json.loads(line) for line in step_file.read_text().splitlines()]
    assert len(logged) == 4 and all(t["info"]["samples"] == 1 and t["status"] == "ok" for t in logged)
    assert all([s["role"] for s in t["segments"]] == ["prompt", "model", "observation", "model"] for t in logged)
    assert all(t["advantage"] is not None for t in logged)
    for t in logged:  # each answered with the tool's result, after its sampled tokens
        assert t["segments"][-1]["text"].endswith(f"The answer is {t['info']['answer']}.<|im_end|>")


def test_the_readme_command_trains_the_example_agent(tmp_path, capsys):
    """`rlfactory train examples/gateway/train.yaml` (one small step): the untrained model writes no
    tool call, the agent answers with whatever it wrote, the run finishes and logs its episodes."""
    from rlfactory.cli.main import main

    run = tmp_path / "run"
    assert main(["train", str(EXAMPLES / "train.yaml"), f"trainer.run_dir={run}", "trainer.steps=1",
                 "trainer.prompts_per_step=1", "algo.group_size=2", "rollout.max_new_tokens=8",
                 "trainer.progress=false"]) == 0
    logged = [json.loads(line) for line in (run / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
    assert len(logged) == 2 and all(t["info"]["episode"] and t["status"] == "ok" for t in logged)
    assert json.loads((run / "run_state.json").read_text())["state"] == "finished"


def test_commands_that_cannot_run_an_agent_say_so_in_one_line(tmp_path, capsys):
    from rlfactory.cli.main import main

    assert main(["rollout", str(EXAMPLES / "train.yaml"), "--out", str(tmp_path / "r.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "env.name: agent runs a user's agent through the gateway" in err[0], err
