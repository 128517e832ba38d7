"""Studio: how fast big runs open, and what live updates read.

Targets (issue 14): a step of 256 trajectories of 1,000 tokens opens in under 1 s; a run with a
100,000-line metrics.jsonl opens in under 1 s; live updates read only what was appended.

Measured against a real `rlfactory ui` process over HTTP, and in headless Chromium when it is
installed (navigation until the page shows the data). Baselines in the same run: reading the raw
file, and parsing every line of it with json (what a reader that parses everything pays).

    .venv/bin/python benchmarks/studio.py
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "benchmark-token-0123456789"
TRAJ, TOKENS, LINES = 256, 1000, 100_000


def timed(fn, repeat: int = 1):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def make_step(run: Path) -> Path:
    """256 trajectories of ~1,000 tokens: prompt 300, then model / observation turns with tool calls."""
    rng = random.Random(0)
    (run / "trajectories").mkdir(parents=True)
    (run / "config.yaml").write_text("model: {path: tiny:1m}\nenv: {name: search}\ntrainer: {steps: 1}\n")
    lines = []
    for i in range(TRAJ):
        segs, calls, n = [{"role": "prompt", "token_ids": [rng.randrange(2000) for _ in range(300)], "text": "p" * 900,
                           "logprobs": None, "policy_version": None, "trainer_logprobs": None}], [], 300
        turn = 0
        while n < TOKENS:
            turn += 1
            k = min(100, TOKENS - n)
            lp = [-rng.random() * 3 for _ in range(k)]
            segs.append({"role": "model", "token_ids": [rng.randrange(2000) for _ in range(k)], "text": "m" * 3 * k,
                         "logprobs": lp, "policy_version": 0, "trainer_logprobs": [x + rng.gauss(0, 1e-3) for x in lp]})
            n += k
            if n < TOKENS:
                k = min(100, TOKENS - n)
                segs.append({"role": "observation", "token_ids": [rng.randrange(2000) for _ in range(k)], "text": "o" * 3 * k,
                             "logprobs": None, "policy_version": None, "trainer_logprobs": None})
                calls.append({"name": "search", "arguments": {"query": f"q{i}-{turn}"}, "status": "ok", "latency_s": 0.01,
                              "cached": False, "turn": turn, "truncated": False, "error": None})
                n += k
        lines.append(json.dumps({"id": f"r{i // 8}-{i % 8}", "group": f"r{i // 8}", "segments": segs, "tool_calls": calls,
                                 "turns": turn, "status": "ok", "reward": rng.random(), "reward_terms": {"exact_match": 1.0},
                                 "info": {"question": "q"}, "error": None, "metrics": {}, "advantage": rng.gauss(0, 1)}))
    path = run / "trajectories" / "step_000001.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def make_metrics(run: Path) -> Path:
    """100,000 lines shaped like a real metrics.jsonl record (~40 keys, full-precision floats)."""
    rng = random.Random(1)
    keys = ["reward/mean", "reward/std", "reward/exact_match", "reward/format", "accuracy", "traj/tool_calls", "traj/turns",
            "traj/tokens", "traj/model_tokens", "tools/error_rate", "status/ok", "status/truncated", "status/malformed",
            "status/infra_error", "batch/kept", "batch/kept_frac", "adv/mean", "adv/std", "adv/min", "adv/max",
            "loss/policy", "policy/clipfrac", "policy/approx_kl", "policy/ratio_mean", "policy/entropy", "loss/total",
            "optim/grad_norm", "optim/updates", "optim/lr", "mismatch/abs_diff", "mismatch/kl", "mismatch/max_abs_diff",
            "batch/tokens", "policy_version", "perf/gen_tokens_per_s", "perf/train_tokens_per_s", "time/rollout_s",
            "time/score_s", "time/train_s", "time/step_s"]
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("model: {path: tiny:1m}\nenv: {name: search}\ntrainer: {steps: 200000}\n")
    path = run / "metrics.jsonl"
    with open(path, "w") as f:
        for s in range(1, LINES + 1):
            f.write(json.dumps({"step": s, **{k: rng.random() for k in keys}}) + "\n")
    return path


def start_ui(runs: Path):
    proc = subprocess.Popen([sys.executable, "-m", "rlfactory.cli.main", "ui", "--runs", str(runs), "--port", "0",
                             "--token", TOKEN], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        m = re.search(r"open (http://\S+)/\?token=", line)
        if m:
            return proc, m.group(1)
    raise RuntimeError("rlfactory ui did not start")


def browser_times(url: str) -> dict[str, float] | None:
    exe = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if exe is None:
        return None
    out = {}
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
        pg = b.new_page(viewport={"width": 1440, "height": 900})
        pg.goto(f"{url}/?token={TOKEN}")
        pg.wait_for_selector("#nav a.active")
        for name, hash_, ready in [
            ("step page (256 trajectories)", "#/run/bigstep?tab=traj&step=1", "document.querySelectorAll('#groups .member').length === 256"),
            ("one trajectory (1,000 token spans)", "#/run/bigstep?tab=traj&step=1&i=5", "document.querySelectorAll('#segments .tok').length >= 700"),
            ("run page (100,000-line metrics)", "#/run/bigmetrics", "Number((document.querySelector(\".chart[data-title='Reward']\")||{dataset:{}}).dataset.points) > 1000"),
        ]:
            pg.goto(f"{url}/#/runs")
            pg.wait_for_selector("#runs-table")
            t0 = time.perf_counter()
            pg.goto(f"{url}/{hash_}")
            pg.wait_for_function(ready, timeout=60000)
            out[name] = time.perf_counter() - t0
        b.close()
    return out


def main() -> int:
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}  cpus: {os.cpu_count()}  python {sys.version.split()[0]}")
    tmp = Path(tempfile.mkdtemp(prefix="studio-bench-"))
    runs = tmp / "runs"
    step = make_step(runs / "bigstep")
    metrics = make_metrics(runs / "bigmetrics")
    print(f"step file: {TRAJ} trajectories x {TOKENS} tokens, {step.stat().st_size / 1e6:.1f} MB")
    print(f"metrics.jsonl: {LINES} lines, {metrics.stat().st_size / 1e6:.1f} MB")
    proc, url = start_ui(runs)
    ok = True
    try:
        c = httpx.Client(base_url=url, headers={"X-Studio-Token": TOKEN}, timeout=120)
        c.get("/api/runs")
        print("\n== a step of 256 trajectories of 1,000 tokens")
        raw, _ = timed(lambda: step.read_bytes())
        parse, _ = timed(lambda: [json.loads(line) for line in step.read_bytes().splitlines()])
        cold, r = timed(lambda: c.get("/api/run/step", params={"run": "bigstep", "step": 1}))
        assert r.status_code == 200 and r.json()["count"] == TRAJ
        warm, _ = timed(lambda: c.get("/api/run/step", params={"run": "bigstep", "step": 1, "q": "q"}), repeat=3)
        one_cold, r = timed(lambda: c.get("/api/run/trajectory", params={"run": "bigstep", "step": 1, "index": 5}))
        assert len([t for s in r.json()["segments"] for t in s["tokens"]]) == TOKENS
        one_warm, _ = timed(lambda: c.get("/api/run/trajectory", params={"run": "bigstep", "step": 1, "index": 6}), repeat=3)
        print(f"baseline: read the file                     {raw * 1e3:8.1f} ms")
        print(f"baseline: json-parse every trajectory        {parse * 1e3:8.1f} ms")
        print(f"API step view, first open (parse + index)    {cold * 1e3:8.1f} ms  ({cold / parse:.2f}x the full parse)")
        print(f"API step view again, filtered by text        {warm * 1e3:8.1f} ms")
        print(f"API one trajectory, tokens decoded (cold)    {one_cold * 1e3:8.1f} ms  (loads the tokenizer)")
        print(f"API one trajectory, tokens decoded (warm)    {one_warm * 1e3:8.1f} ms")
        print("\n== a run with a 100,000-line metrics.jsonl")
        raw_m, _ = timed(lambda: metrics.read_bytes())
        parse_m, _ = timed(lambda: [json.loads(line) for line in metrics.read_bytes().splitlines()])
        open_m, r = timed(lambda: c.get("/api/run/metrics", params={"run": "bigmetrics"}))
        data = r.json()["train"]
        print(f"baseline: read the file                     {raw_m * 1e3:8.1f} ms")
        print(f"baseline: json-parse every line              {parse_m * 1e3:8.1f} ms")
        print(f"API run metrics (even sample of {len(data['steps'])} lines)  {open_m * 1e3:8.1f} ms  "
              f"({parse_m / open_m:.0f}x faster than parsing every line; steps {data['steps'][0]}..{data['steps'][-1]})")
        summary, _ = timed(lambda: c.get("/api/runs"))
        print(f"API runs table (last line read from the end) {summary * 1e3:8.1f} ms")
        print("\n== live updates")
        from rlfactory.studio.metrics import JsonlTail

        tail = JsonlTail(metrics, offset=metrics.stat().st_size)
        before = metrics.stat().st_size
        with open(metrics, "a") as f:
            for s in range(LINES + 1, LINES + 11):
                f.write(json.dumps({"step": s, "reward/mean": 0.5}) + "\n")
        appended = metrics.stat().st_size - before
        t_tail, (records, _) = timed(lambda: tail.read_new())
        print(f"10 lines appended ({appended} bytes): read {tail.bytes_read} bytes of a {metrics.stat().st_size / 1e6:.1f} MB "
              f"file in {t_tail * 1e6:.0f} us; {len(records)} records")
        ok &= tail.bytes_read == appended and len(records) == 10
        with c.stream("GET", "/api/run/events", params={"run": "bigmetrics", "offset": before}) as s:
            t0 = time.perf_counter()
            for line in s.iter_lines():
                if line.startswith("data:") and '"train"' in line:
                    got = json.loads(line[5:])
                    break
        print(f"event stream from that offset: {len(got['train'])} records in {(time.perf_counter() - t0) * 1e3:.0f} ms "
              f"(first poll), offset {got['offset']} = file size {metrics.stat().st_size}")
        ok &= len(got["train"]) == 10
        browser = browser_times(url)
        print("\n== in headless Chromium (navigation until the data is on screen)")
        if browser is None:
            print("skipped: chromium or playwright not installed")
        else:
            for name, t in browser.items():
                print(f"{name:40s} {t * 1e3:8.0f} ms")
        print("\n== targets")
        step_open = cold if browser is None else max(cold, browser["step page (256 trajectories)"])
        metrics_open = open_m if browser is None else max(open_m, browser["run page (100,000-line metrics)"])
        for name, t in (("step of 256 x 1,000-token trajectories opens < 1 s", step_open),
                        ("100,000-line metrics.jsonl opens < 1 s", metrics_open)):
            print(f"{name:55s} {t:6.3f} s  {'pass' if t < 1 else 'MISS'}")
            ok &= t < 1
        print(f"{'live updates read only the appended bytes':55s} {'pass' if tail.bytes_read == appended else 'MISS'}")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
