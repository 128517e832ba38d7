"""Every command of the README's quick tour and the demo, run for real on tiny budgets."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlfactory.cli.main import main
from rlfactory.trajectory import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"
SMALL_SEARCH = ["sampling.seed=0", "rollout.max_new_tokens=16", "rollout.max_total_tokens=700",
                "env.options.n_train_entities=20", "env.options.n_test_entities=6"]


pytestmark = pytest.mark.usefixtures("one_thread")


def test_readme_lists_the_commands_tested_here():
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/setup.sh && .venv/bin/rlfactory demo" in readme
    test_cmd = "bash scripts/setup.sh && .venv/bin/python -m pytest -q"
    assert test_cmd in readme and test_cmd in (ROOT / ".ci" / "run").read_text()
    tour = set(re.findall(r"\.venv/bin/rlfactory (\S+)", readme))
    # `serve` and the Generation servers section's commands run in tests/serve/test_serve_e2e.py,
    # `bench bfcl` in tests/train/test_train_bfcl_bench.py, `gateway` in tests/serve/test_gateway_cli.py
    assert tour <= {"demo", "--help", "make-tiny-model", "tools", "rollout", "sft", "train", "eval", "ui", "serve",
                    "experiment", "bench", "gateway"}, tour
    assert ".venv/bin/rlfactory ui --runs runs" in readme


def test_help_and_make_tiny_model(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert main(["make-tiny-model", "--size", "1m", "--out", str(tmp_path / "tiny")]) == 0
    assert (tmp_path / "tiny" / "config.json").is_file() and (tmp_path / "tiny" / "tokenizer.json").is_file()


def test_tools_list_and_call(capsys):
    cfg = str(EX / "mcp_tools.json")
    assert main(["tools", "list", "--config", cfg]) == 0
    listed = capsys.readouterr().out
    assert "evaluate" in listed and "get_current_time" in listed
    assert main(["tools", "call", "evaluate", "--args", '{"expression": "6*7"}', "--config", cfg]) == 0
    assert capsys.readouterr().out.strip() == "42"


def test_sft_train_resume_eval_on_search(tmp_path, capsys):
    cfg = str(EX / "search.yaml")
    sft_out = tmp_path / "sft"
    assert main(["sft", cfg, *SMALL_SEARCH, "sft.steps=2", "sft.demos=4", "sft.batch_size=2", f"sft.out={sft_out}"]) == 0
    run = tmp_path / "search"
    train = [cfg, *SMALL_SEARCH, f"model.path={sft_out / 'model'}", "trainer.prompts_per_step=2", "algo.group_size=2",
             "trainer.eval_every=0", "trainer.progress=false", f"trainer.run_dir={run}", "trainer.save_every=1"]
    assert main(["train", *train, "trainer.steps=1"]) == 0
    assert main(["train", *train, "trainer.steps=2", "--resume"]) == 0
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "reward/mean" in m] == [1, 2]
    out = tmp_path / "eval.json"
    ckpt = run / "checkpoints" / "step_000002" / "model"
    assert main(["eval", cfg, *SMALL_SEARCH, "--model", str(ckpt), "--limit", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["averages"]["questions"] == 2.0 and len(report["questions"]) == 2


def test_demo_runs_end_to_end_on_a_tiny_budget(tmp_path, capsys):
    out = tmp_path / "demo"
    rc = main(["demo", "--out", str(out), "--eval-limit", "4", *SMALL_SEARCH, "sft.steps=2", "sft.demos=4",
               "sft.batch_size=2", "trainer.steps=1", "trainer.prompts_per_step=2", "algo.group_size=2",
               "trainer.progress=false"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "warm start" in printed and "after GRPO" in printed and "correct searches" in printed
    result = json.loads((out / "results.json").read_text())
    assert set(result["before"]) == set(result["after"]) and result["steps"] == 1
    assert (out / "reward_curve.png").stat().st_size > 1000


def test_custom_env_from_one_file_rolls_out_warm_starts_and_trains(tmp_path, capsys):
    cfg = str(EX / "custom_env" / "capitals.yaml")
    out = tmp_path / "capitals.jsonl"
    assert main(["rollout", cfg, "--n", "2", "--out", str(out), "rollout.max_new_tokens=16"]) == 0
    trajs = read_jsonl(out)
    assert len(trajs) == 4 and all("lookup_capital" in t.segments[0].text for t in trajs)
    sft_out = tmp_path / "sft"
    assert main(["sft", cfg, "sft.steps=2", "sft.demos=4", f"sft.out={sft_out}"]) == 0
    run = tmp_path / "run"
    assert main(["train", cfg, f"model.path={sft_out / 'model'}", "trainer.steps=1", f"trainer.run_dir={run}",
                 "trainer.progress=false"]) == 0
    metrics = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert "reward/exact_match" in metrics and "reward/capitals/short_answer" in metrics


def test_ui_serves_the_studio_behind_its_token(tmp_path):
    """`rlfactory ui --runs DIR` (here on a free port): prints its URL with the token, serves the
    studio to that token only, and stops on Ctrl-C."""
    import signal
    import subprocess
    import sys

    import httpx

    proc = subprocess.Popen([sys.executable, "-m", "rlfactory.cli.main", "ui", "--runs", str(tmp_path / "runs"),
                             "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            # Ctrl-C as in a terminal: a suite started in the background of a shell
                            # without job control inherits SIGINT ignored, and so would the child.
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        url = None
        for line in proc.stdout:
            m = re.search(r"open (http://127\.0\.0\.1:\d+)/\?token=(\S+)", line)
            if m:
                url, token = m.groups()
                break
        assert url is not None
        assert httpx.get(url + "/api/runs").status_code == 401
        page = httpx.get(f"{url}/?token={token}", follow_redirects=True)
        assert page.status_code == 200 and "rlfactory studio" in page.text
        assert httpx.get(url + "/api/runs", headers={"X-Studio-Token": token}).json()["runs"] == []
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130  # stopped by Ctrl-C, like every rlfactory command


def _readme_commands(about: str) -> list[list[str]]:
    """The README's `.venv/bin/rlfactory ...` lines that mention `about`, as argument lists."""
    import shlex

    lines = [line.strip() for line in (ROOT / "README.md").read_text().splitlines()]
    return [shlex.split(line)[1:] for line in lines if line.startswith(".venv/bin/rlfactory ") and about in line]


def test_custom_env_commands_of_the_readme_python_tool_then_mcp(tmp_path, capsys, monkeypatch):
    """The README's custom-env commands, as printed, from a folder of their own (runs/ lands there),
    on tiny budgets: tools list, rollout, sft, train and eval of examples/wiki with its search
    tool in Python, then tools list and rollout with the same tool as an MCP server."""
    import yaml

    commands = _readme_commands("examples/wiki/")
    assert [c[0] for c in commands] == ["tools", "rollout", "sft", "train", "eval", "tools", "rollout", "sft", "train"]
    wiki = yaml.safe_load((EX / "wiki" / "wiki.yaml").read_text())
    # the README's eval names the checkpoint that wiki.yaml's trainer.steps writes
    assert f"step_{wiki['trainer']['steps']:06d}" in " ".join(commands[4])
    monkeypatch.chdir(tmp_path)  # (paths in overrides are taken from the config's folder, so they are absolute here)
    for argv in commands:
        argv = [str(ROOT / a) if a.startswith("examples/") else a.replace("step_000010", "step_000001") for a in argv]
        name = "wiki_mcp" if "wiki_mcp.yaml" in argv[1 if argv[0] != "tools" else -1] else "wiki"
        small = {"rollout": ["rollout.max_new_tokens=12"],
                 "sft": ["sft.steps=3", "sft.demos=4", "sft.batch_size=2",
                         f"sft.out={tmp_path / 'runs' / (name + '-sft')}"],
                 "train": ["trainer.steps=1", "trainer.save_every=1", "trainer.prompts_per_step=2", "algo.group_size=2",
                           "trainer.progress=false", f"trainer.run_dir={tmp_path / 'runs' / name}",
                           "rollout.max_new_tokens=12"],
                 "eval": ["--limit", "2", "rollout.max_new_tokens=12"]}
        assert main([*argv, *small.get(argv[0], [])]) == 0, argv
        out, err = capsys.readouterr()
        if argv[0] == "tools":
            where = "server: wiki" if name == "wiki_mcp" else "python: env"
            assert f"search  [{where}]" in out and "1 tool(s)" in out
        if argv[0] == "rollout":
            trajs = read_jsonl(argv[argv.index("--out") + 1])
            assert len(trajs) == 8 and all("search" in t.segments[0].text for t in trajs)
            assert "reward:       mean" in out
        if argv[0] == "sft":
            assert "s/step" in err and "for 3 steps" in err
            assert f"model saved to {tmp_path / 'runs' / (name + '-sft') / 'model'}" in out
        if argv[0] == "train":
            metrics = json.loads((tmp_path / "runs" / name / "metrics.jsonl").read_text().splitlines()[-1])
            assert "reward/exact_match" in metrics and metrics["step"] == 1
        if argv[0] == "eval":
            assert "2 questions (test)" in out and "reward/exact_match" in out


def test_experiment_runs_base_sft_grpo_and_prints_the_table(tmp_path, capsys):
    """`rlfactory experiment examples/smollm2_calculator.yaml` on tiny budgets (tiny:1m stands in for
    SmolLM2 here; tests/rollout/test_rollout_smollm2.py loads the real one)."""
    out = tmp_path / "exp"
    rc = main(["experiment", str(EX / "smollm2_calculator.yaml"), "model.path=tiny:1m", "sft.demos=4", "sft.steps=2",
               "sft.batch_size=2", "trainer.steps=1", "trainer.prompts_per_step=2", "algo.group_size=2",
               "trainer.progress=false", "rollout.max_new_tokens=16", "--out", str(out), "--eval-limit", "2"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "base" in printed and "warm start" in printed and "after GRPO" in printed and "tool-call rate" in printed
    result = json.loads((out / "results.json").read_text())
    assert set(result["stages"]) == {"base", "warm start", "after GRPO"} and result["grpo_steps"] == 1


HEAD = r"""
import sys
from rlfactory.distributed.cluster import connect_cluster
from rlfactory.config import RayConfig
import ray
assert connect_cluster(RayConfig(num_cpus=2, temp_dir=sys.argv[1]))  # rlfactory's own local start
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()  # hold the cluster until the test closes our stdin
ray.shutdown()
"""


def test_ray_training_joins_a_running_cluster(tmp_path):
    """README "Scale-out": `RAY_ADDRESS=... rlfactory train examples/ray.yaml` on a cluster that
    another process started, with the local-cluster start that a run without RAY_ADDRESS makes
    (rlfactory.distributed.cluster.connect_cluster)."""
    import os
    import shutil
    import subprocess
    import sys
    import tempfile

    pytest.importorskip("ray")
    readme = (ROOT / "README.md").read_text()
    assert ".venv/bin/rlfactory train examples/ray.yaml " in readme
    assert "RAY_ADDRESS=HEAD_IP:6379 .venv/bin/rlfactory train examples/ray.yaml " in readme
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    ray_dir = tempfile.mkdtemp(prefix="rlf-ray-")  # short: Ray's socket paths must fit in 107 bytes
    head_log = open(tmp_path / "head.log", "w")
    head = subprocess.Popen([sys.executable, "-c", HEAD, ray_dir], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=head_log, text=True, env=env)
    try:
        address = head.stdout.readline().strip()
        assert address, (tmp_path / "head.log").read_text()[-3000:]
        overrides = ["trainer.steps=1", "trainer.prompts_per_step=2", "algo.group_size=2", "rollout.max_new_tokens=16",
                     "env.options.n_train=20", "env.options.n_test=4", f"trainer.run_dir={tmp_path / 'run'}",
                     "trainer.progress=false"]
        out = subprocess.run([sys.executable, "-m", "rlfactory.cli.main", "train", str(EX / "ray.yaml"), *overrides],
                             capture_output=True, text=True, timeout=600, env={**env, "RAY_ADDRESS": address})
        assert out.returncode == 0, out.stderr[-3000:]
        assert "trained 1 step(s)" in out.stdout
        assert f"Connecting to existing Ray cluster at address: {address}" in out.stderr
        step = (tmp_path / "run" / "trajectories" / "step_000001.jsonl").read_text().splitlines()
        assert len(step) == 4 and all(json.loads(line)["status"] != "infra_error" for line in step)
        assert head.poll() is None  # the run left the cluster it joined running
    finally:
        head.stdin.close()
        head.wait(timeout=120)
        head_log.close()
        shutil.rmtree(ray_dir, ignore_errors=True)
