"""Asynchronous training benchmark: trajectories trained per second with trainer.max_staleness 1
against 0 (synchronous), and rollout throughput on two `rlfactory serve` servers against the
in-process generator, each pair measured in one run on the same work.

Setup: GRPO on the search env (its generated knowledge world, the real BM25 retriever behind the
real MCP `search` server) with rlfactory's tiny model on CPU. The search tool's latency is made
log-normal (median 0.5 s, sigma 1.0: ~10% of calls take over 1.8 s, ~1% over 5 s): the env waits
until the call's drawn latency has passed (the real search takes a few ms). Draws are keyed by
(query, how many times that query was asked before in the run), so both modes meet the same
latencies for the same calls.

What is forced (the untrained tiny model never calls a tool by itself): a ScriptedPolicy logits
processor. A question gets 1-3 searches (from a hash of its text), one per turn, then an answer
(the title of the first passage of the last search). Each turn starts with 2-11 tokens sampled
freely from the model (markup banned), then the forced `<tool_call>` (query: the question) or
`<answer>`; every token is a real forward pass. Reward: the env's exact match (0.9) and format
(0.1) plus `even_ids`, the share of the model's own tokens with an even id (a signal the model
can learn from its free tokens, so GRPO has non-zero advantages). Forced tokens carry the sampler
logprob 0 (the scripted processor gave them probability 1), so their importance weights
pi_old / pi_behaviour are far below 1 in the max_staleness 1 run: an artefact of the script, not
of staleness (the free tokens' weights stay near 1).

Figures, all measured in this run:
  (a) trajectories trained per second over `--steps` steps, max_staleness 1 / max_staleness 0
      (same prompts, seeds and latencies; the async run pays for filling its pipeline too) (>= 1.5x).
      Each mode runs in a fresh process of its own after the same untimed warm-up rollout, so
      neither inherits the other's state (allocator heaps, OpenMP pools, caches). Each mode also
      prints the CPU its process used (user and system seconds, all threads: how busy it kept the
      cores) and its context switches.
  (b) rollout trajectories per second of the same rows (no added latency, so generation is the
      cost): two `rlfactory serve` processes with --threads 1 each (the same scripted policy)
      / the in-process LocalGenerator with 2 threads.
Where (a) comes from: synchronously, every step waits for its slowest trajectory (a long-tail
search) and then for the update, while the CPU idles during tool waits; with max_staleness 1 the
next step's rollout (its tool waits and generation) runs while the learner trains in a worker
thread. The gain is bounded by (rollout + train) / max(rollout, train) per step, so it is sensitive
to the ratio of training time to rollout time (model size, tokens per step, latency tail) and to
CPU contention between generation and training (2 shared cores; the load average is printed).
The run prints that schedule's time on the synchronous run's own rollout and update times
(`overlap_bound`, a ceiling up to run-to-run variation): a rollout with a long tool-latency tail
cannot be hidden behind a shorter update, and the first rollout is never overlapped.

Against vLLM or SGLang (GPU): `--urls http://HOST:PORT[,...] --api vllm|sglang --model PATH` runs
(a) with `generator.backend: server` and (b) on those servers instead of spawned `rlfactory serve`
processes; the model must then call tools by itself (no scripted policy on those servers).

Run:  .venv/bin/python benchmarks/async_train.py [--model tiny:10m] [--steps 5] [--prompts 4] [--group 4]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import platform
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
MEDIAN_S, SIGMA = 0.5, 1.0


def h(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "big")


# ---- the scripted policy (also loaded by `rlfactory serve --logits-processor async_train:policy`) ----

def _question(context: str) -> str:
    found = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", context, re.S)
    return found[0].strip() if found else context[-200:]


def plan(context: str):
    from rlfactory.rollout.scripted import TurnPlan

    question = _question(context)
    done = context.count("<tool_response>")
    free = 2 + h(question, done) % 10
    if done < 1 + h(question) % 3:
        call = {"name": "search", "arguments": {"query": question}}
        return TurnPlan(free, f"\n<tool_call>\n{json.dumps(call)}\n</tool_call>")
    titles = re.findall(r"Doc 1\(Title: ([^)]*)\)", context)
    return TurnPlan(free, f"<answer>{titles[-1] if titles else 'unknown'}</answer>")


def policy(tokenizer: Any):
    from rlfactory.rollout.scripted import ScriptedPolicy

    return ScriptedPolicy(tokenizer, plan, tokenizer.convert_tokens_to_ids("<|im_end|>"))


def even_ids(trajectory) -> float:
    """Reward term: share of the model's tokens with an even id."""
    ids = [t for s in trajectory.segments if s.role == "model" for t in s.token_ids]
    return sum(1 for t in ids if t % 2 == 0) / len(ids) if ids else 0.0


# ---- the env with a log-normal tool latency ----

def latency_env(options: dict[str, Any], median_s: float, sigma: float):
    """The search env whose `search` calls take a log-normal time, keyed by (query, occurrence)."""
    from rlfactory.envs.search.env import SearchEnv

    class SlowSearchEnv(SearchEnv):
        def __init__(self, **opts: Any) -> None:
            super().__init__(**opts)
            self.asked: dict[str, int] = {}
            self.drawn: list[float] = []

        def latency(self, call) -> float:
            query = json.dumps(call.arguments, sort_keys=True)
            k = self.asked[query] = self.asked.get(query, 0) + 1
            u = random.Random(h("latency", query, k)).gauss(0.0, 1.0)
            return median_s * math.exp(sigma * u)

        async def step(self, calls, runner):
            t0 = time.perf_counter()
            waits = [self.latency(c) for c in calls]
            self.drawn += waits
            results = await super().step(calls, runner)
            await asyncio.sleep(max(0.0, max(waits, default=0.0) - (time.perf_counter() - t0)))
            return results

    return SlowSearchEnv(**options)


# ---- configs ----

def config(args, run_dir: Path, world: Path, max_staleness: int, urls: list[str] | None = None):
    import yaml

    from rlfactory.config import load_config
    from rlfactory.config import RunConfig

    cfg = {
        "model": {"path": args.model, "family": "qwen3"},
        "env": {"name": "search", "options": {"data_dir": str(world), "n_train_entities": 200, "n_test_entities": 10}},
        "reward": {"terms": {"exact_match": 0.9, "format": 0.1, "async_train:even_ids": 1.0}},
        "sampling": {"temperature": 1.0, "seed": 0},
        "rollout": {"mode": "async", "max_turns": 4, "max_new_tokens": 64, "max_total_tokens": 2048,
                    "max_observation_tokens": 256},
        "tools": {"timeout_s": 60, "cache": False},
        "algo": {"group_size": args.group},
        "trainer": {"steps": args.steps, "prompts_per_step": args.prompts, "lr": 1e-4, "seed": 0, "save_every": 0,
                    "run_dir": str(run_dir), "progress": False, "log_trajectories": False,
                    "max_staleness": max_staleness},
    }
    if urls:
        cfg["generator"] = {"backend": "server", "api": args.api, "urls": urls}
    path = run_dir.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(cfg))
    return load_config(RunConfig, path)


def env_options(cfg) -> dict[str, Any]:
    return {**cfg.env.options, "family": "qwen3"}


# ---- (a) training throughput ----

async def train_run(args, cfg, scripted: bool) -> dict[str, Any]:
    from rlfactory.train.session import open_rollout
    from rlfactory.train.loop import Trainer
    from rlfactory.train.run import load_env_data

    env = latency_env(env_options(cfg), args.median, args.sigma)
    processor = None
    if scripted:
        from rlfactory.train.session import load_tokenizer

        processor = policy(load_tokenizer(cfg.model))
    try:
        async with open_rollout(cfg, env=env, logits_processor=processor, reward_mode="required") as session:
            trainer = Trainer(cfg, session, session.reward, load_env_data(env, "train"))
            _, pipeline = trainer.pipelined()
            history, ends = [], []
            used0 = cpu_used()
            t0 = time.perf_counter()
            try:
                for step in range(1, cfg.trainer.steps + 1):
                    metrics, trajs = await pipeline.step(step)
                    history.append(metrics)
                    ends.append(time.perf_counter() - t0)
                    print(f"    step {step}: {time.perf_counter() - t0:6.1f} s, reward {metrics['reward/mean']:.3f}, "
                          f"rollout {metrics['time/rollout_s']:.1f} s (per trajectory: generation "
                          f"{metrics['time/traj_gen_s']:.1f} s, tools {metrics['time/traj_tool_s']:.1f} s), "
                          f"train {metrics['time/train_s']:.1f} s, load average {loadavg()}", flush=True)
            finally:
                await pipeline.close()
            wall = time.perf_counter() - t0
            used = {k: v - used0[k] for k, v in cpu_used().items()}
    finally:
        env.close()
    trained = sum(m["batch/kept"] for m in history)
    later = sum(m["batch/kept"] for m in history[1:])
    steady = later / (ends[-1] - ends[0]) if len(ends) > 1 else 0.0
    return {"wall": wall, "trained": trained, "tps": trained / wall, "steady": steady, "history": history,
            "latencies": list(env.drawn), "ends": ends, **used}


def cpu_used() -> dict[str, float]:
    """CPU seconds (user, system) and context switches (voluntary, involuntary) of this process
    so far, all threads."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return {"user_s": r.ru_utime, "sys_s": r.ru_stime, "csw_vol": float(r.ru_nvcsw), "csw_invol": float(r.ru_nivcsw)}


def overlap_bound(sync: dict[str, Any]) -> tuple[float, float]:
    """What max_staleness 1 would take on the synchronous run's own durations, if nothing slowed
    down when overlapped: rollouts 1 and 2 start at once (version 0 allows both), rollout s >= 3
    when update s-2 is done; update s starts when both update s-1 and rollout s are done. (An
    update is the rest of a synchronous step: score, train, sync.) Returns (seconds, ratio)."""
    starts = [0.0] + sync["ends"][:-1]
    rollouts = [m["time/rollout_s"] for m in sync["history"]]
    learns = [end - start - r for start, end, r in zip(starts, sync["ends"], rollouts)]
    done_learn = [0.0]  # done_learn[s]: when update s is done (update 0: the start)
    for s, (r, learn) in enumerate(zip(rollouts, learns), start=1):
        rollout_done = done_learn[max(0, s - 2)] + r
        done_learn.append(max(done_learn[-1], rollout_done) + learn)
    return done_learn[-1], sync["ends"][-1] / done_learn[-1]


def mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


# ---- (b) rollout throughput: servers vs in-process ----

async def rollout_once(cfg, rows, scripted: bool) -> tuple[float, int, int]:
    from rlfactory.envs.search.env import SearchEnv
    from rlfactory.train.session import load_tokenizer, open_rollout

    env = SearchEnv(**env_options(cfg))
    processor = policy(load_tokenizer(cfg.model)) if scripted and cfg.generator.backend == "local" else None
    try:
        async with open_rollout(cfg, env=env, logits_processor=processor, load_policy=False) as session:
            t0 = time.perf_counter()
            trajs = await session.engine.run(rows, cfg.algo.group_size)
            wall = time.perf_counter() - t0
    finally:
        env.close()
    tokens = sum(len(s.token_ids) for t in trajs for s in t.segments if s.role == "model")
    calls = sum(len(t.tool_calls) for t in trajs)
    return wall, tokens, calls


def start_servers(args, n: int) -> list:
    import threading

    from rlfactory.serve.process import ServeProcess

    procs = [ServeProcess(args.model, ["--threads", "1", "--seed", str(i), "--logits-processor", "async_train:policy"],
                          cwd=str(HERE)) for i in range(n)]
    threads = [threading.Thread(target=p.start) for p in procs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        p.url  # raises if it did not start
    return procs


# ---- main ----

def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def world_rows(args, cfg) -> list[dict[str, Any]]:
    """The search env's rows for the warm-up and (b) (writes the generated world on first use)."""
    from rlfactory.envs.search.env import SearchEnv

    env = SearchEnv(**env_options(cfg))
    rows = env.load_split("train")[-args.prompts:]
    env.close()
    return rows


def run_mode(args, k: int, tmp_path: Path) -> dict[str, Any]:
    """(a) with max_staleness k in this process, after one untimed warm-up rollout."""
    world = tmp_path / "world"
    cfg_local = config(args, tmp_path / f"roll_local_k{k}", world, 0)
    rows = world_rows(args, cfg_local)
    scripted = not args.urls
    print(f"(a) max_staleness {k}, a process of its own: warm-up, one untimed rollout of {len(rows) * args.group} "
          f"other trajectories (load average {loadavg()})", flush=True)
    asyncio.run(rollout_once(cfg_local, rows, scripted))
    cfg = config(args, tmp_path / f"run_k{k}", world, k, args.urls.split(",") if args.urls else None)
    print(f"(a) max_staleness {k} ... (load average {loadavg()})", flush=True)
    return asyncio.run(train_run(args, cfg, scripted))


def mode_in_subprocess(args, k: int, tmp_path: Path) -> dict[str, Any]:
    """run_mode(k) in a fresh process: each mode starts from the same state."""
    import subprocess

    out = tmp_path / f"result_k{k}.json"
    argv = [sys.executable, __file__, "--mode", str(k), "--result", str(out), "--model", args.model,
            "--steps", str(args.steps), "--prompts", str(args.prompts), "--group", str(args.group),
            "--median", str(args.median), "--sigma", str(args.sigma), "--threads", str(args.threads),
            "--api", args.api, "--workdir", str(tmp_path)] + (["--urls", args.urls] if args.urls else [])
    subprocess.run(argv, check=True)
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny:10m")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--median", type=float, default=MEDIAN_S)
    ap.add_argument("--sigma", type=float, default=SIGMA)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of this process")
    ap.add_argument("--rounds", type=int, default=2, help="(b): interleaved rounds, each side's best kept")
    ap.add_argument("--urls", default=None, help="comma-separated vLLM/SGLang servers instead of rlfactory serve")
    ap.add_argument("--api", default="vllm", choices=["vllm", "sglang"])
    ap.add_argument("--skip-servers", action="store_true", help="only (a)")
    ap.add_argument("--mode", type=int, default=None, help=argparse.SUPPRESS)  # internal: one (a) run
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.mode is not None:
        Path(args.result).write_text(json.dumps(run_mode(args, args.mode, Path(args.workdir))))
        return
    urls = args.urls.split(",") if args.urls else None
    scripted = urls is None

    print(f"python {platform.python_version()}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
          f"torch threads {torch.get_num_threads()}; load average {loadavg()}")
    from rlfactory.generation.model_source import pick_device

    device = pick_device("auto")  # model.device is "auto" (the default) in these configs
    print(f"device {device}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
          + ("" if urls is None else " (the trainer's; generation on the servers)"))
    print(f"model {args.model}; search env, {args.prompts} prompts x group {args.group} per step, {args.steps} steps; "
          f"tool latency log-normal median {args.median} s sigma {args.sigma}; 1-3 searches per trajectory "
          f"({'scripted' if scripted else 'the model s own'} calls)")
    with tempfile.TemporaryDirectory(prefix="async-train-") as tmp:
        tmp_path = Path(tmp)
        world = tmp_path / "world"
        cfg_local = config(args, tmp_path / "roll_local", world, 0)
        rows = world_rows(args, cfg_local)
        results = {k: mode_in_subprocess(args, k, tmp_path) for k in (0, 1)}
        print()
        print(f"(a) GRPO training throughput, {args.steps} steps of {args.prompts * args.group} trajectories:")
        for k, r in results.items():
            hist = r["history"]
            extra = ""
            if k:
                extra = (f", waited for rollouts {mean(m['time/wait_rollout_s'] for m in hist):.2f} s/step, staleness mean "
                         f"{mean(m['async/staleness_mean'] for m in hist):.2f} max {max(m['async/staleness_max'] for m in hist):.0f}, "
                         f"dropped {sum(m['async/dropped_stale'] for m in hist):.0f}, IS weight mean "
                         f"{mean(m.get('async/is_weight_mean', 1.0) for m in hist):.3f} max "
                         f"{max(m.get('async/is_weight_max', 1.0) for m in hist):.2f} clipped "
                         f"{mean(m.get('async/is_clipped_frac', 0.0) for m in hist):.3f}")
            print(f"  max_staleness {k}: {r['wall']:6.1f} s, {r['trained']:.0f} trajectories trained, "
                  f"{r['tps']:.2f} traj/s; per step: rollout {mean(m['time/rollout_s'] for m in hist):.2f} s, "
                  f"train {mean(m['time/train_s'] for m in hist):.2f} s, reward {mean(m['reward/mean'] for m in hist):.3f}"
                  f"{extra}")
            cpu = r["user_s"] + r["sys_s"]
            print(f"    CPU: {r['user_s']:.0f} s user + {r['sys_s']:.0f} s system = {cpu / r['wall']:.2f} of "
                  f"{os.cpu_count()} cores busy on average ({cpu / r['wall'] / os.cpu_count():.0%}); context switches "
                  f"{r['csw_vol']:.0f} voluntary, {r['csw_invol']:.0f} involuntary")
        same = sorted(results[0]["latencies"]) == sorted(results[1]["latencies"])
        lat = results[0]["latencies"]
        print(f"  tool calls {len(lat)} per run, latency median {sorted(lat)[len(lat) // 2]:.2f} s, max {max(lat):.2f} s; "
              f"same latencies in both runs: {same}")
        ratio = results[1]["tps"] / results[0]["tps"]
        print(f"  ratio (a) max_staleness 1 / 0: {ratio:.2f}x (target >= 1.5x: {'met' if ratio >= 1.5 else 'MISSED'})")
        best, bound = overlap_bound(results[0])
        print(f"  ceiling: the max_staleness 1 schedule on the synchronous run's own rollout and update times (nothing "
              f"slowed by overlapping) takes {best:.1f} s: {bound:.2f}x")
        steady = results[1]["steady"] / results[0]["steady"] if results[0]["steady"] else 0.0
        print(f"  steady state (steps 2..{args.steps}, the async run's pipeline already full): "
              f"{results[0]['steady']:.2f} vs {results[1]['steady']:.2f} traj/s, {steady:.2f}x")
        print(f"  load average {loadavg()}")

        if args.skip_servers:
            return
        print()
        procs = start_servers(args, 2) if urls is None else []
        try:
            server_urls = urls or [p.url for p in procs]
            cfg_servers = config(args, tmp_path / "roll_servers", world, 0, server_urls)
            if urls is None:
                cfg_servers.generator.api = "vllm"
            times: dict[str, list] = {"in-process": [], "2 servers": []}
            for r in range(args.rounds):
                print(f"(b) round {r + 1} (load average {loadavg()})", flush=True)
                times["in-process"].append(asyncio.run(rollout_once(cfg_local, rows, scripted)))
                times["2 servers"].append(asyncio.run(rollout_once(cfg_servers, rows, scripted)))
        finally:
            for p in procs:
                p.stop()
        n = len(rows) * args.group
        print(f"(b) rollout of the same {n} trajectories (no added tool latency), best of {args.rounds}:")
        best = {}
        for name, runs in times.items():
            wall, tokens, calls = min(runs)
            best[name] = n / wall
            threads = f"{torch.get_num_threads()} threads" if name == "in-process" else "1 thread each"
            print(f"  {name:10s} ({threads}): {wall:6.2f} s, {n / wall:6.2f} traj/s, {tokens / wall:7.0f} model tokens/s "
                  f"({tokens} tokens, {calls} tool calls)")
        print(f"  ratio (b) 2 servers / in-process: {best['2 servers'] / best['in-process']:.2f}x")
        print(f"  load average {loadavg()}")


if __name__ == "__main__":
    main()
