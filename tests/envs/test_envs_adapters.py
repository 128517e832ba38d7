"""Envs of other libraries: a verifiers (v1) taskset and an OpenEnv environment served over HTTP,
each built with the library's own classes, rolled out and trained for a step on tiny:1m."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from rlfactory.cli.main import main
from rlfactory.config import ConfigError
from rlfactory.envs import make_env
from rlfactory.train.runlog import read_metrics
from rlfactory.trajectory import Segment, ToolCallRecord, Trajectory

pytestmark = pytest.mark.usefixtures("one_thread")


def _train_config(tmp_path: Path, env: dict, **trainer) -> str:
    cfg = {
        "model": {"path": "tiny:1m"},
        "env": env,
        "rollout": {"max_turns": 2, "max_new_tokens": 16, "max_total_tokens": 768},
        "algo": {"group_size": 2},
        "trainer": {"steps": 1, "prompts_per_step": 2, "lr": 1e-3, "run_dir": str(tmp_path / "run"),
                    "progress": False, **trainer},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_verifiers_taskset_rows_tools_and_rubric_become_rlfactory_ones():
    pytest.importorskip("verifiers.v1")
    env = make_env("verifiers", taskset="vf_arith:ArithTaskset", n_test=2)
    rows = env.load_split("train")
    assert [r["id"] for r in rows] == ["add-0", "add-1", "add-2", "add-3"] and len(env.load_split("test")) == 2
    assert env.reset(rows[1]) == [{"role": "system", "content": "You add numbers with tools."},
                                  {"role": "user", "content": "What is 4 + 12? Use the add tool."}]
    (add,) = env.tools().python
    assert add(a=2, b=5) == "7"
    right = Trajectory(id="t", group="g", info=env.info(rows[0]), segments=[
        Segment("prompt", [1], "p"), Segment("model", [2], '<tool_call>{"name": "add"}</tool_call>'),
        Segment("observation", [3], "13"), Segment("model", [4], "3 + 10 = 13")],
        tool_calls=[ToolCallRecord("add", {"a": 3, "b": 10}, "ok", 0.01, turn=0)])
    score = asyncio.run(env.reward().score(right))
    assert score.terms == {"correct": 1.0, "used_tool": 1.0, "metric/turns": 2.0} and score.total == 1.5
    wrong = Trajectory(id="t", group="g", info=env.info(rows[0]),
                       segments=[Segment("prompt", [1], "p"), Segment("model", [2], "it is 12")])
    score = asyncio.run(env.reward().score(wrong))
    assert score.terms["correct"] == 0.0 and score.terms["used_tool"] == 0.0 and score.total == 0.0


def test_verifiers_bad_options_are_one_line():
    pytest.importorskip("verifiers.v1")
    with pytest.raises(ConfigError, match="env.options.taskset: vf_arith:ArithTask is not a verifiers.v1 Taskset"):
        make_env("verifiers", taskset="vf_arith:ArithTask")
    with pytest.raises(ConfigError, match="env.options.n_test: 6 of 6 tasks leaves no training task"):
        make_env("verifiers", taskset="vf_arith:ArithTaskset", n_test=6)


@pytest.mark.slow
def test_verifiers_env_trains_a_step(tmp_path):
    pytest.importorskip("verifiers.v1")
    cfg = _train_config(tmp_path, {"name": "verifiers", "options": {"taskset": "vf_arith:ArithTaskset", "n_test": 2}})
    assert main(["train", cfg]) == 0
    (record,) = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert record["policy_version"] == 1 and "reward/correct" in record and "reward/used_tool" in record
    trajs = [json.loads(line) for line in (tmp_path / "run" / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
    assert len(trajs) == 4
    for t in trajs:
        assert set(t["reward_terms"]) == {"correct", "used_tool", "metric/turns"}
        assert t["reward"] == pytest.approx(t["reward_terms"]["correct"] + 0.5 * t["reward_terms"]["used_tool"])
        assert t["info"]["task_id"].startswith("add-")


# ---- OpenEnv ----------------------------------------------------------------------------------

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def guess_server():
    """tests/envs/openenv_guess.py served by openenv-core's create_app on a free port of 127.0.0.1."""
    pytest.importorskip("openenv.core")
    import os
    import signal
    import subprocess
    import sys
    import time

    import httpx

    from rlfactory.server_process import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, str(HERE / "openenv_guess.py"), str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the OpenEnv server did not start"
            time.sleep(0.1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def _guess_plan(context: str):
    """Binary search on the server's hints: the next guess from the last hints in the context."""
    import re

    from rlfactory.rollout.scripted import TurnPlan

    if "right!" in context:
        return TurnPlan(free=1, forced="<answer>found</answer>")
    low, high = 1, 8
    for guess, way in re.findall(r"(\d) is wrong: go (higher|lower)", context):
        if way == "higher":
            low = max(low, int(guess) + 1)
        else:
            high = min(high, int(guess) - 1)
    guess = (low + high) // 2
    return TurnPlan(free=1, forced=f'<tool_call>\n{{"name": "act", "arguments": {{"guess": {guess}}}}}\n</tool_call>')


def test_openenv_action_schema_is_the_tool_and_the_server_must_answer(guess_server):
    from rlfactory.server_process import free_port

    env = make_env("openenv", url=guess_server, n_train=3, n_test=1)
    assert env.tool.name == "act" and env.tool.description == "Guess the hidden number."
    assert env.tool.parameters["properties"] == {"guess": {"description": "your guess, 1 to 8", "title": "Guess",
                                                           "type": "integer"}}
    assert env.tool.parameters["required"] == ["guess"]
    assert [r["seed"] for r in env.load_split("train")] == [0, 1, 2] and len(env.load_split("test")) == 1
    assert "Guess it with the act tool." in env.reset({"seed": 0})[-1]["content"]
    result = asyncio.run(env.tool.call({"guess": 0}))
    assert result.text.startswith("0 is wrong: go higher") and not result.is_error
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ConfigError, match=f"^env.options.url: no OpenEnv server answers GET {dead}/schema"):
        make_env("openenv", url=dead)


@pytest.mark.slow
def test_openenv_env_rolls_out_in_one_session_per_trajectory_and_trains_a_step(tmp_path, guess_server):
    import functools

    from transformers import AutoTokenizer

    from rlfactory.config import load_config
    from rlfactory.train.session import open_rollout
    from rlfactory.rollout.scripted import ScriptedPolicy
    from rlfactory.tiny import resolve_model
    from rlfactory.config import RunConfig
    from rlfactory.train.run import train

    tok = AutoTokenizer.from_pretrained(resolve_model("tiny:1m"))
    policy = ScriptedPolicy(tok, _guess_plan, end_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    cfg = load_config(RunConfig, _train_config(tmp_path, {"name": "openenv", "options": {
        "url": guess_server, "n_train": 4, "max_turns": 5}}, log_trajectories=True))
    cfg.rollout.max_turns, cfg.rollout.max_new_tokens = 5, 40
    asyncio.run(train(cfg, open_session=functools.partial(open_rollout, logits_processor=policy)))
    (record,) = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert record["policy_version"] == 1
    trajs = [json.loads(line) for line in (tmp_path / "run" / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
    assert len(trajs) == 4
    for t in trajs:
        # each sample searched on its own session: its hints narrow down to the seed's number
        guesses = [c["arguments"]["guess"] for c in t["tool_calls"]]
        assert guesses and all(c["status"] == "ok" for c in t["tool_calls"]), t["tool_calls"]
        assert t["reward_terms"] == {"openenv": 1.0, "openenv/done": 1.0} and t["reward"] == 1.0
        import random
        assert guesses[-1] == random.Random(int(t["info"]["seed"])).randint(1, 8)
