"""The same agent task run as a native env and through the recording gateway, on tiny:1m.

Task: "Add A and B." with an `add` tool: one tool call, then the answer (ScriptedPolicy makes the
untrained model write them, so both paths sample the same number of tokens per turn).
  native   RolloutEngine + PromptEnv + a function tool `add` (ToolRunner)
  gateway  AgentEngine running examples/gateway/openai_agent.py (OpenAI SDK, AsyncOpenAI on the
           transport `client.openai()` gives: the gateway's app called in process), the agent
           running `add` itself
  gw-tcp   the same over loopback TCP (AgentEngine(in_process=False): httpx pool -> uvicorn)
  gw-full  the in-process gateway encoding every prompt in full (no prefix reuse: the baseline of
           serve/gateway_prefix.py, for the in-gateway figure)
  tcp-5ms  gw-tcp with Python's GIL switch interval left at its default (the gateway shortens it
           while serving: serve/gateway.py SWITCH_INTERVAL_S)
  tcp-ca   gw-tcp with the engine's pools on an SSL context that loads the CA bundle at its first
           episode (httpx's default, as before: the baseline of the bare context, train/gateway_agents.py)
All roll out ROWS trajectories at once; ROUNDS alternating rounds, medians reported.
Prints trajectories/s of each, the ratio of wall times (target <= 1.3x), the gateway's added
latency per call (in-gateway time outside generation: render, parse, record; target < 2 ms), and
where the time went: the generator's decode steps, their mean batch and its prefills (staggered
requests would show as more steps of smaller batches), its busy seconds, and the CPU seconds of
the generation thread and of the event loop thread (engine or agents, HTTP and gateway), which
share the GIL (thread CPU read from /proc: Linux), the garbage collector's seconds, and the share
of prompt characters the gateway gave the tokenizer (the rest reused from known prompts).

    .venv/bin/python benchmarks/gateway.py [--rows 32] [--rounds 3] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "gateway"))
sys.path.insert(0, str(ROOT / "tests"))


@dataclass
class Diag:
    """Where a round's time went: the generator's counters and each thread's CPU seconds."""

    steps: int
    """decode steps (one forward over the running batch each)"""
    prefills: int
    """prefill forwards"""
    requests: int
    decode_tokens: int
    """tokens sampled by decode steps (the first token of each turn comes from its prefill)"""
    busy_s: float
    """seconds the generation thread spent in steps"""
    gen_cpu_s: float
    """CPU seconds of the generation thread"""
    loop_cpu_s: float
    """CPU seconds of the event loop thread (engine or agents + HTTP + gateway, and tools)"""
    gc_s: float = 0.0
    """wall seconds in Python's garbage collector (any thread), and its full collections"""
    gc_full: int = 0

    @property
    def mean_batch(self) -> float:
        return self.decode_tokens / self.steps if self.steps else 0.0


def thread_cpu(prefix: str) -> float:
    """CPU seconds (user + system) of the live thread whose name starts with `prefix` (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    for t in threading.enumerate():
        if t.name.startswith(prefix) and t.native_id is not None:
            fields = Path(f"/proc/self/task/{t.native_id}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / tick
    return 0.0


class GcClock:
    """Wall seconds spent in the garbage collector and how many full (generation 2) collections
    ran, from gc.callbacks: a collection runs in whichever thread allocates, holding the GIL."""

    def __init__(self) -> None:
        self.seconds, self.full, self._t0 = 0.0, 0, 0.0
        gc.callbacks.append(self._tick)

    def _tick(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t0
            self.full += info["generation"] == 2

    def take(self) -> tuple[float, int]:
        out = (self.seconds, self.full)
        self.seconds, self.full = 0.0, 0
        return out


GC = GcClock()


def diag(gen, loop_cpu_s: float, requests: int) -> Diag:
    s = gen.stats
    return Diag(int(s["steps"]), int(s["prefills"]), requests, int(s["tokens"]) - requests, float(s["busy_s"]),
                thread_cpu("rlfactory-gen"), loop_cpu_s, *GC.take())


def add(a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: first
        b: second
    """
    return str(a + b)


async def native(model, tok, rows):
    from gateway_fixtures import add_plan, scripted_generator, tool_manager

    from rlfactory.config import RolloutConfig, SamplingConfig
    from rlfactory.rollout.engine import RolloutEngine
    from rlfactory.rollout.prompt_env import PromptEnv
    from rlfactory.tools import ToolRunner, function_tool

    gen = scripted_generator(model, tok, add_plan())
    runner = ToolRunner([function_tool(add)])
    engine = RolloutEngine(gen, tool_manager(tok), runner, PromptEnv(system="You add numbers with the add tool."),
                           RolloutConfig(max_new_tokens=64, max_total_tokens=2048, max_turns=4),
                           SamplingConfig(temperature=1.0))
    GC.take()
    t0, c0 = time.perf_counter(), time.thread_time()
    trajs = await engine.run(rows, 1)
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    calls = sum(t.turns for t in trajs)
    d = diag(gen, cpu, calls)
    await runner.aclose()
    gen.close()
    assert all(t.status == "ok" and t.turns == 2 for t in trajs), [(t.status, t.error) for t in trajs]
    return wall, calls, None, d


async def gateway_tcp(model, tok, rows):
    return await gateway(model, tok, rows, in_process=False)


async def gateway_tcp_default_switch(model, tok, rows):
    import rlfactory.serve.gateway as serving_gateway

    kept = serving_gateway.SWITCH_INTERVAL_S
    serving_gateway.SWITCH_INTERVAL_S = sys.getswitchinterval()  # the gateway leaves Python's interval as it is
    try:
        return await gateway(model, tok, rows, in_process=False)
    finally:
        serving_gateway.SWITCH_INTERVAL_S = kept


async def gateway_full_encode(model, tok, rows):
    return await gateway(model, tok, rows, reuse=False)


async def gateway_tcp_ca_bundle(model, tok, rows):
    return await gateway(model, tok, rows, in_process=False, ca_bundle=True)


async def gateway(model, tok, rows, in_process: bool = True, reuse: bool = True, ca_bundle: bool = False):
    import openai_agent
    from gateway_fixtures import serving

    from rlfactory.train.gateway_agents import AgentEngine

    class CaBundleEngine(AgentEngine):
        def _pool(self):
            if self._ssl is None:
                self._ssl = httpx.create_ssl_context()  # what the engine did before: loads the CA bundle
            return super()._pool()

    async with serving(model, tok) as gw:
        if not reuse:
            gw.prefix = None  # every prompt encoded in full (the baseline of the prefix reuse)
        engine = (CaBundleEngine if ca_bundle else AgentEngine)(gw, openai_agent.agent, openai_agent.reward,
                                                               timeout_s=600, in_process=in_process)
        GC.take()
        t0, c0 = time.perf_counter(), time.thread_time()
        trajs = await engine.run(rows, 1)
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        d = diag(gw.generator, cpu, gw.stats.calls)
        await engine.aclose()
        bad = [(t.status, t.error) for t in trajs if not (t.status == "ok" and t.reward == 1.0 and t.turns == 2)]
        assert not bad, bad
        stats = gw.stats.as_dict(0)
        p = gw.prefix.stats if gw.prefix is not None else None
        encoded = p.encoded_chars / p.total_chars if p is not None and p.total_chars else 1.0
        return wall, gw.stats.calls, (stats["overhead_ms_per_call"], stats["cpu_ms_per_call"], encoded), d


PARTS = [  # where the event loop's profiled time goes, by the file each function is in
    ("OpenAI SDK (openai, pydantic, typing)", re.compile(r"site-packages/(openai|pydantic|pydantic_core|typing_extensions)"
                                                         r"|python3\.\d+/typing\.py")),
    ("HTTP client (httpx, httpcore, h11, anyio)", re.compile(r"site-packages/(httpx|httpcore|h11|anyio|sniffio)/")),
    ("HTTP server (uvicorn, starlette)", re.compile(r"site-packages/(uvicorn|starlette)/")),
    ("asyncio and sockets", re.compile(r"python3\.\d+/(asyncio/|selectors\.py|socket\.py)|method 'send'|"
                                       r"method 'recv'|method 'poll'|method 'connect'")),
    ("chat template (jinja2, transformers)", re.compile(r"site-packages/(jinja2|transformers)/|<template>")),
    ("tokenizer (Rust)", re.compile(r"tokenizers\.Tokenizer")),
    ("json", re.compile(r"python3\.\d+/json/|_json\.")),
    ("rlfactory (gateway, engine)", re.compile(r"/rlfactory/|/examples/")),
]


def profile_modes(model, tok, rows) -> None:
    """One round of gateway and of gw-tcp under cProfile on the event loop thread's CPU clock (waits
    do not count), its CPU per call grouped by PARTS. cProfile slows Python code more than C code:
    shares, not timings."""
    import cProfile
    import pstats

    print("\nevent loop CPU per call under cProfile, by part (profiled ms; the profiler inflates Python code):")
    per_mode = {}
    for name, fn in (("gateway", gateway), ("gw-tcp", gateway_tcp)):
        prof = cProfile.Profile(time.thread_time)
        prof.enable()
        _, calls, _, _ = asyncio.run(fn(model, tok, rows))
        prof.disable()
        parts: dict[str, float] = {label: 0.0 for label, _ in PARTS}
        parts["other"] = 0.0

        def part(file: str, func: str) -> str:
            return next((lb for lb, pattern in PARTS if pattern.search(f"{file} {func}")), "other")

        for (file, _line, func), (_cc, _nc, tottime, _ct, callers) in pstats.Stats(prof).stats.items():  # type: ignore[attr-defined]
            label = part(file, func)
            if label == "other" and file == "~" and callers:
                # a builtin (isinstance, dict.get, str.join...): its time goes to the part that called it
                for (cfile, _cl, cfunc), stat in callers.items():
                    parts[part(cfile, cfunc)] += stat[2] * 1000 / calls
                continue
            parts[label] += tottime * 1000 / calls
        per_mode[name] = parts
    for label in per_mode["gateway"]:
        a, b = per_mode["gateway"][label], per_mode["gw-tcp"][label]
        print(f"  {label:42s} in process {a:6.2f}  TCP {b:6.2f}  (TCP - in process {b - a:+6.2f})")
    a, b = (sum(per_mode[m].values()) for m in ("gateway", "gw-tcp"))
    print(f"  {'total':42s} in process {a:6.2f}  TCP {b:6.2f}  (TCP - in process {b - a:+6.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true",
                        help="then one round of gateway and gw-tcp under cProfile: the event loop's time by part")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlfactory.tiny import resolve_model

    torch.set_num_threads(1)
    path = resolve_model("tiny:1m")
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()
    rows = [{"id": f"r{i}", "question": f"Add {i} and {2 * i + 1}.", "answer": 3 * i + 1} for i in range(args.rows)]
    asyncio.run(native(model, tok, rows[:2]))  # warm-up: both paths' first-call costs
    asyncio.run(gateway(model, tok, rows[:2]))
    asyncio.run(gateway_tcp(model, tok, rows[:2]))
    modes = {"native": native, "gateway": gateway, "gw-tcp": gateway_tcp, "gw-full": gateway_full_encode,
             "tcp-5ms": gateway_tcp_default_switch, "tcp-ca": gateway_tcp_ca_bundle}
    walls: dict[str, list[float]] = {name: [] for name in modes}
    overheads, cpus, full_overheads, full_cpus = [], [], [], []
    diags: dict[str, list[Diag]] = {name: [] for name in modes}
    for r in range(args.rounds):
        for name, fn in modes.items():
            wall, calls, cost, d = asyncio.run(fn(model, tok, rows))
            walls[name].append(wall)
            diags[name].append(d)
            extra = ""
            if cost is not None and name == "gateway":
                overheads.append(cost[0])
                cpus.append(cost[1])
            if cost is not None and name == "gw-full":
                full_overheads.append(cost[0])
                full_cpus.append(cost[1])
            if cost is not None:
                extra = (f"  gateway per call: {cost[0]:.3f} ms wall, {cost[1]:.3f} ms CPU; "
                         f"{cost[2]:.0%} of prompt characters encoded")
            print(f"round {r + 1} {name:8s} {wall:6.2f} s  {args.rows / wall:6.2f} traj/s  ({calls} model calls)"
                  + extra, flush=True)
            print(f"        {d.steps} decode steps, mean batch {d.mean_batch:.1f}, {d.prefills} prefills; "
                  f"generator busy {d.busy_s:.2f} s; CPU s: generation thread {d.gen_cpu_s:.2f}, "
                  f"event loop thread {d.loop_cpu_s:.2f}; garbage collector {d.gc_s:.2f} s "
                  f"({d.gc_full} full)", flush=True)
    n, g, gt = (statistics.median(walls[k]) for k in ("native", "gateway", "gw-tcp"))
    print(f"\nmedians over {args.rounds} rounds, {args.rows} trajectories each, tiny:1m, 1 torch thread:")
    print(f"  native env        {n:6.2f} s  {args.rows / n:6.2f} traj/s")
    print(f"  gateway (OpenAI)  {g:6.2f} s  {args.rows / g:6.2f} traj/s")
    print(f"  gateway, TCP      {gt:6.2f} s  {args.rows / gt:6.2f} traj/s")
    t5, tca = statistics.median(walls["tcp-5ms"]), statistics.median(walls["tcp-ca"])
    print(f"  gateway / native wall time: {g / n:.2f}x (target <= 1.3x); over TCP {gt / n:.2f}x "
          f"(with Python's {sys.getswitchinterval() * 1000:g} ms GIL switch interval kept: {t5 / n:.2f}x; "
          f"with the CA bundle loaded: {tca / n:.2f}x)")
    for name in modes:
        ds = diags[name]
        med = lambda f: statistics.median(f(d) for d in ds)  # noqa: E731
        print(f"  {name:8s} decode steps {med(lambda d: d.steps):.0f}, mean batch {med(lambda d: d.mean_batch):.1f}, "
              f"prefills {med(lambda d: d.prefills):.0f}, generator busy {med(lambda d: d.busy_s):.2f} s, "
              f"CPU s: generation thread {med(lambda d: d.gen_cpu_s):.2f}, event loop {med(lambda d: d.loop_cpu_s):.2f}, "
              f"garbage collector {med(lambda d: d.gc_s):.2f} s")
    o, c, fo, fc = (statistics.median(v) for v in (overheads, cpus, full_overheads, full_cpus))
    print(f"  gateway overhead per call (median of rounds): {o:.3f} ms wall (target < 2 ms), {c:.3f} ms CPU")
    print(f"  the same with every prompt encoded in full (gw-full): {fo:.3f} ms wall, {fc:.3f} ms CPU; "
          f"prefix reuse / full: {o / fo:.2f}x wall, {c / fc:.2f}x CPU")
    if args.profile:
        profile_modes(model, tok, rows)


if __name__ == "__main__":
    main()
