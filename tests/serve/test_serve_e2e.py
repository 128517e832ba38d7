"""End to end, the README's "Generation servers" commands for real: two `rlfactory serve`
processes generate for `rlfactory train` (real MCP calculator tool, tiny budgets) and for
`rlfactory rollout`. The trajectories carry the versions the servers reported, the servers'
versions advance with the trainer, and the servers end with exactly the learner's final weights, also with asynchronous training
(`trainer.max_staleness: 1`) and its resume. With every server down, trajectories end infra_error
and the commands still finish."""

from __future__ import annotations

import json
import re
import shlex
import threading
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from rlfactory.cli.main import main
from rlfactory.trajectory import read_jsonl
from rlfactory.serve.process import ServeProcess, free_port
from rlfactory.serve.weights import weights_digest
from rlfactory.tiny import resolve_model

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["rollout.max_new_tokens=64", "rollout.max_total_tokens=700", "trainer.progress=false",
         "trainer.prompts_per_step=2", "algo.group_size=2"]
# The untrained tiny model does not call tools by itself: the servers steer it with the example's
# scripted policy (its own sampled tokens, then a forced `evaluate` call, then the tool's number).
SCRIPT = ["--logits-processor", "scripted_calculator:policy"]


pytestmark = pytest.mark.usefixtures("one_thread")


def readme_commands() -> list[list[str]]:
    """The `.venv/bin/rlfactory ...` lines of the README's Generation servers section."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Generation servers", 1)[1].split("\n## ", 1)[0]
    return [shlex.split(line.rstrip(" &")) for line in re.findall(r"^    \.venv/bin/rlfactory (.+)$", section, re.M)]


@pytest.fixture(scope="module")
def servers():
    """The README's `rlfactory serve` commands, on free ports, started side by side."""
    procs = []
    for cmd in readme_commands():
        if cmd[0] == "serve":
            args = cmd[2:]
            i = args.index("--port")
            procs.append(ServeProcess(cmd[1], [*args[:i], *args[i + 2:], "--threads", "1", "--seed", "0", *SCRIPT],
                                      cwd=str(ROOT / "examples")))
    assert len(procs) == 2
    errors: list[BaseException] = []

    def start(p: ServeProcess) -> None:
        try:
            p.start()
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=start, args=(p,)) for p in procs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        if errors:
            raise errors[0]
        yield [p.url for p in procs]
    finally:
        for p in procs:
            p.stop()


def command(name: str) -> list[str]:
    return next(c for c in readme_commands() if c[0] == name)


def urls_override(urls: list[str]) -> str:
    return f"generator.urls=[{', '.join(urls)}]"


def health(url: str) -> dict:
    return httpx.get(url + "/health", timeout=30).json()


@pytest.mark.slow
def test_train_on_two_servers_pushes_weights_and_records_their_versions(servers, tmp_path, capsys):
    cmd = command("train")
    run = tmp_path / "run"
    rc = main([*cmd, urls_override(servers), f"trainer.run_dir={run}", "trainer.steps=2", *SMALL])
    assert rc == 0, capsys.readouterr().err
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "reward/mean" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert m["weight_sync/ok"] == 2 and m["weight_sync/failed"] == 0 and m["policy_version"] == m["step"]
    for step in (1, 2):
        trajs = read_jsonl(run / "trajectories" / f"step_{step:06d}.jsonl")
        versions = {s.policy_version for t in trajs for s in t.segments if s.role == "model"}
        assert versions == {step - 1}  # the version the servers reported while generating
        for t in trajs:  # each called the MCP calculator on its server and answered with its result
            assert t.status == "ok" and [(c.name, c.status) for c in t.tool_calls] == [("evaluate", "ok")]
            assert [s.role for s in t.segments] == ["prompt", "model", "observation", "model"]
            assert t.reward == 1.0
    final = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_000002" / "model", dtype=torch.float32)
    for url in servers:
        h = health(url)
        assert h["policy_version"] == 2 and h["updates"] >= 3  # start (version 0), then 1 and 2
        assert h["turns"] > 0  # both servers generated
        digest = httpx.get(url + "/weights_digest", timeout=60).json()
        assert digest == {"sha256": weights_digest(final), "policy_version": 2}  # exactly the learner's weights
    # `rlfactory eval --model M` on servers evaluates M: its weights are pushed to them first
    report = tmp_path / "eval.json"
    assert main(["eval", *cmd[1:], urls_override(servers), *SMALL, "--model", "tiny:1m", "--limit", "2",
                 "--out", str(report)]) == 0
    assert json.loads(report.read_text())["averages"]["questions"] == 2
    start = AutoModelForCausalLM.from_pretrained(resolve_model("tiny:1m"), dtype=torch.float32)
    for url in servers:
        assert httpx.get(url + "/weights_digest", timeout=60).json() == {"sha256": weights_digest(start), "policy_version": 0}


@pytest.mark.slow
def test_rollout_on_servers_records_the_servers_version(servers, tmp_path, capsys):
    cmd = command("rollout")
    out = tmp_path / "servers.jsonl"
    i = cmd.index("--out")
    args = [*cmd[:i], "--out", str(out), *cmd[i + 2:], "--limit", "2", urls_override(servers), *SMALL]
    held = {health(u)["policy_version"] for u in servers}
    assert main(args) == 0
    trajs = read_jsonl(out)
    assert len(trajs) == 4 and all(t.status == "ok" and len(t.tool_calls) == 1 for t in trajs)
    assert {s.policy_version for t in trajs for s in t.segments if s.role == "model"} == held
    printed = capsys.readouterr().out
    assert "generation servers:" in printed and all(u in printed for u in servers)


def test_with_every_server_down_trajectories_are_infra_errors_and_the_commands_finish(tmp_path, capsys):
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    out = tmp_path / "down.jsonl"
    rc = main(["rollout", str(ROOT / "examples" / "servers.yaml"), "--n", "2", "--limit", "1", "--out", str(out),
               urls_override(dead), *SMALL])
    assert rc == 0
    trajs = read_jsonl(out)
    assert [t.status for t in trajs] == ["infra_error"] * 2
    assert all("no generation server could serve this turn" in t.error for t in trajs)
    run = tmp_path / "run"
    rc = main(["train", str(ROOT / "examples" / "servers.yaml"), urls_override(dead), f"trainer.run_dir={run}",
               "trainer.steps=1", *SMALL])
    assert rc == 0
    step = next(json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if "reward/mean" in line)
    assert step["status/infra_error"] == 4 and step["batch/kept"] == 0 and step["weight_sync/failed"] == 2
    assert "unreachable" in capsys.readouterr().err


@pytest.mark.slow
def test_async_training_on_two_servers_stays_one_version_behind_and_resumes(servers, tmp_path, capsys):
    """`trainer.max_staleness: 1` on the servers: the next step's rollout overlaps each update, the
    servers get every version, no trained turn is more than one version stale, and `--resume`
    continues from the checkpoint (the servers first get the restored weights)."""
    run = tmp_path / "run"
    args = [*command("train"), urls_override(servers), f"trainer.run_dir={run}", "trainer.max_staleness=1",
            "trainer.save_every=1", *SMALL]

    def check(first: int, last: int) -> None:
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        steps = [m for m in metrics if "reward/mean" in m]
        assert [m["step"] for m in steps] == list(range(1, last + 1))
        for m in steps[first - 1:]:
            assert m["weight_sync/ok"] == 2 and m["weight_sync/failed"] == 0 and m["policy_version"] == m["step"]
            assert m["async/staleness_max"] <= 1 and m["async/dropped_stale"] == 0 and m["batch/kept"] == 4
        for step in range(first, last + 1):
            trajs = read_jsonl(run / "trajectories" / f"step_{step:06d}.jsonl")
            for t in trajs:  # each called the MCP calculator on its server and answered with its result
                assert t.status == "ok" and [(c.name, c.status) for c in t.tool_calls] == [("evaluate", "ok")]
                assert t.reward == 1.0
                versions = [s.policy_version for s in t.segments if s.role == "model"]
                # trained at version step-1; sampled by it or the one before (and never before the start)
                assert len(versions) == 2 and set(versions) <= {max(step - 2, first - 1), step - 1}
        final = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / f"step_{last:06d}" / "model", dtype=torch.float32)
        for url in servers:
            digest = httpx.get(url + "/weights_digest", timeout=60).json()
            assert digest == {"sha256": weights_digest(final), "policy_version": last}

    updates = {u: health(u)["updates"] for u in servers}
    waited = {u: health(u)["updates_waited"] for u in servers}
    assert main([*args, "trainer.steps=3"]) == 0, capsys.readouterr().err
    check(1, 3)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # step 2 was rolled out while step 1 trained: its first turns were sampled by version 0
    assert metrics[1]["async/staleness_max"] == 1
    for url in servers:  # the start's version, then one push per step
        h = health(url)
        assert h["policy_version"] == 3 and h["updates"] - updates[url] == 4
        updates[url] = h["updates"]

    # Resume: the rollouts in flight at the end were not checkpointed; the servers get the restored
    # weights (version 3) before step 4 is rolled out, then one push per step.
    assert main([*args, "trainer.steps=5", "--resume"]) == 0, capsys.readouterr().err
    check(4, 5)
    for url in servers:
        h = health(url)
        assert h["policy_version"] == 5 and h["updates"] - updates[url] == 3
        # the trainer held each server (no turn of its in flight there) before updating it
        assert h["updates_waited"] == waited[url]
