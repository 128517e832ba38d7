"""rlfactory's agent loop inside verl's real classes (verl 0.9.1, in a venv beside rlfactory's:
verl_venv.py): verl's trainer config, RLHFDataset over the parquet rlfactory writes, DataProto,
AgentLoopWorker (agent-loop YAML, hydra instantiation per sample, padding, batching) and
TokenOutput. Only the LLM server manager stands in (verl_fakes.TinyVerlServer: the tiny model
behind verl's `generate` signature), since verl's servers need vLLM or SGLang on a GPU.
The check runs in a subprocess (verl_check.py); this test reads what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from verl_venv import ROOT, verl_python

from rlfactory.trajectory import Trajectory

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_rlfactory_agent_loop_in_verls_agent_loop_worker(tmp_path):
    python = verl_python()
    rows = tmp_path / "rows.jsonl"
    questions = [f"Task {n}: add things." for n in range(3)] + ["Task 3: " + "add things " * 300]  # the last: too long
    rows.write_text("".join(json.dumps({"id": f"r{n}", "question": q, "answer": str(n)}) + "\n"
                            for n, q in enumerate(questions)))
    starts = tmp_path / "starts"
    calculator = f"echo start >> {starts}; exec {python} -m rlfactory.tools.servers.calculator"
    config = tmp_path / "calculator.yaml"
    config.write_text(yaml.safe_dump({
        "family": "qwen3",
        "env": {"name": "rlfactory.rollout.prompt_env:PromptEnv", "train_data": str(rows), "options": {"max_turns": 4}},
        "tools": {"mcp": {"mcpServers": {"calculator": {"command": "sh", "args": ["-c", calculator]}}}},
        "rollout": {"max_new_tokens": 64}, "keep_trajectory": True}))
    loops = tmp_path / "agent_loops.yaml"
    loops.write_text(yaml.safe_dump([{"name": "rlfactory", "rlfactory_config": str(config),
                                      "_target_": "rlfactory.integrations.verl.agent_loop.RLFactoryAgentLoop"}]))
    out = tmp_path / "out.json"
    env = dict(os.environ, HF_DATASETS_CACHE=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0")
    done = subprocess.run([str(python), str(HERE / "verl_check.py"), "--agent-loops", str(loops), "--rlfactory-config",
                           str(config), "--out", str(out), "--command", str(ROOT / "examples/verl/train_grpo.sh")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-6000:]
    result = json.loads(out.read_text())

    # The example training command names only keys verl's trainer config has.
    assert "actor_rollout_ref.rollout.agent.agent_loop_config_path" in result["command_keys"]
    assert result["unknown_command_keys"] == []

    # One calculator MCP server for the worker's 16 trajectories (4 rows x n=2 x 2 batches).
    samples = result["samples"]
    assert len(samples) == 16 and starts.read_text().splitlines() == ["start"]
    assert result["workers"] == [{"trajectories": 16, "infra_errors": 0}]
    assert [s["uid"] for s in samples[:8]] == ["u0", "u0", "u1", "u1", "u2", "u2", "u3", "u3"]  # verl's repeat
    # A prompt longer than verl's prompt_length is not rolled out; verl pads and batches the rest.
    too_long = [s for s in samples if s["uid"] == "u3"]
    assert len(too_long) == 4 and all(s["rlfactory_status"] == "truncated" and s["response_ids"] == [] and
                                      len(s["prompt_ids"]) == result["prompt_length"] for s in too_long)
    assert "actor_rollout_ref.rollout.prompt_length=1024" in too_long[0]["rlfactory_error"]
    samples = [s for s in samples if s["uid"] != "u3"]
    turns: dict[str, list] = {}
    for turn in result["turns"]:
        turns.setdefault(turn["request_id"], []).append(turn)
    for s in samples:
        traj = Trajectory.from_json(s["rlfactory_trajectory"])
        n = int(s["uid"][1:])
        assert s["agent_name"] == "rlfactory" and traj.info["answer"] == str(n)  # the env row came through
        assert s["rlfactory_status"] == "ok" and traj.turns == n % 3 + 1
        assert s["__num_turns__"] == 1 + traj.turns + n % 3
        # verl's padded batch, unpadded, is the trajectory token for token.
        assert s["prompt_ids"] + s["response_ids"] == traj.input_ids == s["input_ids"]
        assert s["response_mask"] == traj.loss_mask[traj.prompt_len:] and set(s["padded_mask_tail"]) <= {0}
        assert s["rollout_log_probs"] == pytest.approx(traj.sampler_logprobs, abs=1e-6)
        served = turns[s["rlfactory_request_id"]]  # every turn of the trajectory on one sticky request id
        assert [t["token_ids"] for t in served] == [seg.token_ids for seg in traj.segments if seg.role == "model"]
        model_logprobs = [lp for lp, m in zip(s["rollout_log_probs"], s["response_mask"]) if m]
        assert model_logprobs == pytest.approx([lp for t in served for lp in t["log_probs"]], abs=1e-6)
        assert served[0]["sampling_params"]["logprobs"] is True  # verl's calculate_log_probs, passed on
    # verl's per-sample metrics of the last batch: time in the server, none for the prompts not rolled out.
    assert [m["generate_sequences"] > 0 for m in result["metrics"]] == [True] * 6 + [False] * 2
