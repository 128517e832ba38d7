"""Ray rollout benchmark: the rollout benchmark's tool-latency workload through 1, 2 and 4 Ray
rollout workers against the in-process engine, in one run.

Workload (the same as benchmarks/rollout.py): rlfactory's tiny 1M Qwen3 on CPU steered by the
same ScriptedPolicy (trajectory i makes 1-3 `lookup` calls, then answers; 2-11 freely sampled
tokens per turn before the forced text); one MCP stdio server (benchmarks/rollout_latency_server.py)
whose `lookup` latency is log-normal (median 0.3 s, sigma 1.0) and 2% of whose calls hang until
the per-call timeout (--timeout, default 30 s); 256 trajectories, async engine. Every
configuration rolls out the same rows with the same per-row seeds, so each makes exactly the same
tool calls and meets exactly the same latencies (checked).

Configurations, each built by the code a run uses:
  in-process   open_rollout: one LocalGenerator, one ToolRunner, the server a subprocess of it.
  Ray, N       open_ray_rollout with ray.rollout_workers=N, one tool pool: rows split by group over
               N worker actors (each its own LocalGenerator on its own model copy, its own
               ToolRunner), the server in the pool actor, every call a Ray actor call to it.

Figures, all measured in this run:
  wall     seconds to roll out the 256 trajectories, and in-process wall / this wall (> 1: faster).
  Ray overhead per trajectory: (driver wall - the slowest worker's own seconds in its engine) /
           trajectories: what the Ray path adds around the engines (splitting the rows, the actor
           calls, moving rows and trajectories through the object store).
  extra tool latency: mean over the calls that succeeded in both runs of (latency seen by the
           trajectory here - in process); a call's latency is a pure function of its query, so
           this is the pool hop plus any event-loop lag of the processes involved.
  pool hop per call: separately, 200 sequential calls of a no-op MCP tool (rlfactory's echo
           server) from this process through a tool-pool actor vs the same calls in process
           (mean of each, best of 3 interleaved rounds): the transport alone.
  gen busy s per worker: each generator's seconds in forward passes (the part that more workers
           spread over more cores); start s: starting the workers and the pool; push s: one
           weight push through the object store.

On 2 cores this workload is tool-bound: the in-process engine already finishes at its critical
path (a trajectory that meets a 30 s hang plus its own generation), so more workers cannot
shorten the wall, and N workers on 2 cores share the same two cores for generation. What the
run shows is what the Ray path costs over one process, and that it holds up as workers are
added; on a machine with more cores or GPUs per worker, generation busy time is what divides.

Run:  .venv/bin/python benchmarks/ray_rollout.py [--trajectories 256] [--workers 1 2 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from rollout import SERVER, check_same_calls, hang_file, plan  # noqa: E402

from rlfactory.rollout.scripted import ScriptedPolicy  # noqa: E402
from rlfactory.config import RunConfig  # noqa: E402


def scripted_policy(tokenizer: Any) -> ScriptedPolicy:
    """The rollout benchmark's ScriptedPolicy (a `module:factory` the Ray workers import)."""
    return ScriptedPolicy(tokenizer, plan, tokenizer.convert_tokens_to_ids("<|im_end|>"))


def run_config(args: argparse.Namespace, hangs: str, workers: int) -> RunConfig:
    server = {"command": sys.executable, "args": [str(SERVER)], "env": {"LATENCY_HANG_FILE": hangs}}
    cores = os.cpu_count() or 1
    return RunConfig.model_validate({
        "model": {"path": "tiny:1m", "family": "qwen3", "device": "cpu"},
        "env": {"name": "rlfactory.rollout.prompt_env:PromptEnv", "options": {"max_turns": 4}},
        "tools": {"mcp": {"mcpServers": {"latency": server}}, "timeout_s": args.timeout, "cache": False,
                  "max_concurrency": 1024, "retries": 0},
        "rollout": {"mode": "async", "max_turns": 4, "max_new_tokens": 64, "max_total_tokens": 2048,
                    "max_observation_tokens": 128, "max_batch": 256},
        "sampling": {"temperature": 1.0, "seed": 0},
        "trainer": {"backend": "ray"},
        "ray": {"rollout_workers": workers, "tool_pools": 1, "worker_cpus": min(1.0, cores / workers),
                "shard_retries": 0},
    })


def rows(count: int, first: int = 0) -> list[dict[str, Any]]:
    return [{"id": f"t{i}", "question": f"Task {i}: look up what you need, then answer."} for i in range(first, first + count)]


async def timed(engine: Any, batch: list[dict[str, Any]]) -> tuple[list, float]:
    seeds = [1000 + i for i in range(len(batch))]
    t0 = time.perf_counter()
    trajs = await engine.run(batch, 1, policy_version=0, seeds=seeds)
    return trajs, time.perf_counter() - t0


async def in_process(args: argparse.Namespace, hangs: str) -> dict[str, Any]:
    from rlfactory.train.session import open_rollout

    cfg = run_config(args, hangs, 1)
    async with open_rollout(cfg) as session:
        session.generator.logits_processor = scripted_policy(session.tokenizer)
        await timed(session.engine, rows(args.warmup, first=10_000))
        busy0 = session.generator.stats["busy_s"]
        runs = [await timed(session.engine, rows(args.trajectories)) for _ in range(args.rounds)]
        busy = (session.generator.stats["busy_s"] - busy0) / args.rounds
    trajs, wall = min(runs, key=lambda r: r[1])
    return {"trajs": trajs, "wall": wall, "walls": [w for _, w in runs], "gen_busy": [busy]}


async def on_ray(args: argparse.Namespace, hangs: str, workers: int) -> dict[str, Any]:
    from rlfactory.distributed import open_ray_rollout

    cfg = run_config(args, hangs, workers)
    t0 = time.perf_counter()
    async with open_ray_rollout(cfg, logits_processor="ray_rollout:scripted_policy") as session:
        started = time.perf_counter() - t0
        t1 = time.perf_counter()
        await session.weight_sync.push(session.model, 0)
        push = time.perf_counter() - t1
        await timed(session.engine, rows(args.warmup, first=10_000))
        before = [await a.stats.remote() for a in session.workers.actors]
        runs, inside = [], []
        for _ in range(args.rounds):
            runs.append(await timed(session.engine, rows(args.trajectories)))
            inside.append(max([(await a.stats.remote())["last_rollout_s"] for a in session.workers.actors]))
        after = [await a.stats.remote() for a in session.workers.actors]
    busy = [(b["generator"]["busy_s"] - a["generator"]["busy_s"]) / args.rounds for a, b in zip(before, after)]
    best = min(range(args.rounds), key=lambda i: runs[i][1])
    trajs, wall = runs[best]
    return {"trajs": trajs, "wall": wall, "walls": [w for _, w in runs], "gen_busy": busy, "start_s": started,
            "push_s": push, "engine_s": inside[best]}


async def pool_hop(calls: int = 200, rounds: int = 3) -> tuple[float, float]:
    """Mean seconds per sequential no-op MCP call (in process, through a tool-pool actor), best of rounds."""
    from rlfactory.distributed.tool_pool import close_pools, pool_connector, start_pools
    from rlfactory.tools import ToolRunner
    from rlfactory.tools.base import ToolCall
    from rlfactory.config import ToolsConfig

    cfg = ToolsConfig(mcp={"mcpServers": {"echo": {"command": sys.executable, "args": ["-m", "rlfactory.tools.servers.echo"]}}})
    pools = start_pools(1, list(sys.path))
    best = {"local": float("inf"), "pool": float("inf")}
    try:
        async with ToolRunner.from_config(cfg) as local, ToolRunner.from_config(cfg, connect_server=pool_connector(pools[0])) as pooled:
            for _ in range(rounds):
                for name, runner in (("local", local), ("pool", pooled)):
                    t0 = time.perf_counter()
                    for i in range(calls):
                        res = await runner.call(ToolCall("echo", {"text": f"x{i}"}))
                        assert res.status == "ok", res
                    best[name] = min(best[name], (time.perf_counter() - t0) / calls)
    finally:
        await close_pools(pools)
    return best["local"], best["pool"]


def call_overhead(base: list, other: list) -> tuple[float, int]:
    """Mean (latency here - latency in process) over the calls that succeeded in both, and their count."""
    diffs = [c2.latency_s - c1.latency_s for t1, t2 in zip(base, other) for c1, c2 in zip(t1.tool_calls, t2.tool_calls)
             if c1.status == c2.status == "ok"]
    return (sum(diffs) / len(diffs) if diffs else 0.0), len(diffs)


async def main_async(args: argparse.Namespace) -> int:
    import ray

    hangs = hang_file(args.trajectories)
    temp = tempfile.mkdtemp(prefix="rlf-ray-bench-")
    results: dict[str, dict[str, Any]] = {}
    try:
        ray.init(num_cpus=os.cpu_count() or 1, _temp_dir=temp, include_dashboard=False, log_to_driver=False)
        print("in-process engine ...", flush=True)
        results["in-process"] = await in_process(args, hangs)
        for n in args.workers:
            print(f"Ray, {n} worker(s) ...", flush=True)
            results[f"Ray, {n} worker(s)"] = await on_ray(args, hangs, n)
        print("pool hop ...", flush=True)
        hop = await pool_hop()
    finally:
        if ray.is_initialized():
            ray.shutdown()
        Path(hangs).unlink(missing_ok=True)
    report(args, results, hop)
    return 0


def report(args: argparse.Namespace, results: dict[str, dict[str, Any]], hop: tuple[float, float]) -> None:
    base = results["in-process"]
    for r in results.values():
        check_same_calls(base["trajs"], r["trajs"])
        assert [t.input_ids for t in r["trajs"]] == [t.input_ids for t in base["trajs"]], "different trajectories"
    calls = [c for t in base["trajs"] for c in t.tool_calls]
    timeouts = sum(c.status == "timeout" for c in calls)
    print(f"every configuration: the same {len(base['trajs'])} trajectories token for token, {len(calls)} tool calls "
          f"({timeouts} timed out)")
    print("load average (1, 5, 15 min) after the runs: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    print()
    print(f"{'configuration':<20} {'wall s':>7} {'vs in-process':>13} {'Ray overhead/traj':>17} {'extra tool latency':>18} "
          f"{'gen busy s per worker':<28} {'start s':>7} {'push s':>7}")
    for name, r in results.items():
        ratio = base["wall"] / r["wall"]
        overhead = f"{1000 * (r['wall'] - r['engine_s']) / len(r['trajs']):.2f} ms" if "engine_s" in r else "-"
        extra, _ = call_overhead(base["trajs"], r["trajs"])
        busy = " ".join(f"{b:.2f}" for b in r["gen_busy"])
        print(f"{name:<20} {r['wall']:>7.2f} {ratio:>12.2f}x {overhead:>17} {1000 * extra:>15.1f} ms "
              f"{busy:<28} {r.get('start_s', 0):>7.1f} {r.get('push_s', 0):>7.2f}")
    print("(all walls: " + "; ".join(f"{n}: " + ", ".join(f"{w:.2f}" for w in r["walls"]) for n, r in results.items()) + ")")
    local, pooled = hop
    print(f"pool hop per call: {1000 * (pooled - local):.2f} ms ({1000 * pooled:.2f} ms through a tool-pool actor vs "
          f"{1000 * local:.2f} ms in process; 200 sequential no-op MCP calls, best of 3)")
    crit = max(base["trajs"], key=lambda t: t.metrics["gen_s"] + t.metrics["tool_s"])
    print()
    print(f"in-process critical path: {crit.id} gen {crit.metrics['gen_s']:.2f} s + tools {crit.metrics['tool_s']:.2f} s "
          f"= {crit.metrics['gen_s'] + crit.metrics['tool_s']:.2f} s of the {base['wall']:.2f} s wall")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trajectories", type=int, default=256)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--timeout", type=float, default=30.0, help="per-call tool timeout, seconds")
    p.add_argument("--warmup", type=int, default=16, help="trajectories of a warm-up rollout per configuration")
    p.add_argument("--rounds", type=int, default=1, help="timed runs per configuration (fastest kept)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the in-process engine")
    args = p.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    torch.set_num_threads(args.threads)
    cores = os.cpu_count()
    print(f"Ray rollout benchmark: {args.trajectories} trajectories of up to 4 turns, tiny:1m on CPU; {cores} cores; "
          f"workers {args.workers} (ray.worker_cpus = min(1, cores / workers)), one tool pool; in-process torch threads "
          f"{args.threads}; python {platform.python_version()}, torch {torch.__version__}, ray {_ray_version()}")
    print(f"tool: MCP stdio server, async `lookup`: log-normal latency (median 0.3 s, sigma 1.0), 2% of calls hang; "
          f"per-call timeout {args.timeout:g} s")
    print("load average (1, 5, 15 min) at the start: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
    return asyncio.run(main_async(args))


def _ray_version() -> str:
    import ray

    return ray.__version__


if __name__ == "__main__":
    sys.exit(main())
