"""Retrieval at scale: `rlfactory index` (bm25s, saved and memory-mapped) and its retriever server
against today's numpy BM25 (benchmarks/numpy_bm25_baseline.py, the index this replaced), on
generated corpora of Search-R1's layout.

    .venv/bin/python benchmarks/retrieval_scale.py [--sizes 100000,1000000] [--baseline-sizes 100000,300000]

With `--work DIR --prepare-only` the corpora, their queries and the indexes are made in DIR (kept)
and the build figures saved there; a later `--work DIR --reuse` measures only the queries (the
build figures printed are the saved ones), so a quiet window is spent on the latency alone.

Per size: index build time and peak RSS (the `rlfactory index` process; for the baseline, its
server's start-up, which builds the index), index size on disk, the server's RSS after the queries,
and top-3 search over HTTP (`POST /retrieve`, one query a request) at 64 concurrent requests:
p50/p99 latency, queries/s and the CPU time a query of the server and of the client after the
warm-up (the client runs on the same CPU, so its CPU is the server's loss); plus in-process search latency (no HTTP). Each is
measured for this server and for the server before issue 33's latency work (benchmarks/
retriever_before.py: a thread hand-off a request, no MaxScore pruning) on the same index, with
ratios; `--clients httpx,aiohttp,tool` repeats the HTTP runs with each load generator (tool: the search
tool's client, which sends the calls in flight as one request). 10M passages is projected from the measured growth (linear in N from the two largest
sizes). Targets on this 2-core CPU: 1M passages indexed in < 10 min, top-3 p50 < 20 ms, RSS < 3 GB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from rlfactory.server_process import free_port  # noqa: E402

VOCAB = 100_000


def make_corpus(path: Path, n: int, seed: int = 0) -> list[str]:
    """n passages of 40-80 Zipf-distributed words (a title line of two words first); returns 2000
    queries: a title plus two words of its passage."""
    rng = np.random.default_rng(seed)
    words = np.array([f"w{i:x}" for i in range(VOCAB)])
    queries: list[str] = []
    qrng = random.Random(seed)
    chunk = 50_000
    with open(path, "w", encoding="utf-8") as f:
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
            lengths = rng.integers(40, 81, size=m)
            picks = np.minimum(rng.zipf(1.15, size=int(lengths.sum())) - 1, VOCAB - 1)
            titles = rng.integers(0, VOCAB, size=(m, 2))
            pos = 0
            lines = []
            for j in range(m):
                body = words[picks[pos:pos + lengths[j]]]
                pos += lengths[j]
                title = f"{words[titles[j, 0]]} {words[titles[j, 1]]}"
                lines.append(json.dumps({"id": str(start + j), "contents": f"{title}\n{' '.join(body)}"}))
                if len(queries) < 2000 and qrng.random() < 2000 / n * 1.5:
                    queries.append(f"{title} {qrng.choice(body)} {qrng.choice(body)}")
            f.write("\n".join(lines) + "\n")
    return queries


def run_measured(cmd: list[str]) -> tuple[float, float, str]:
    """(wall s, peak RSS MB, stderr) of a child process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cmd} failed:\n{err[-2000:]}")
    return wall, usage.ru_maxrss / 1024, err


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def disk_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


@dataclass
class LoadResult:
    latencies: list[float]  # seconds, of the requests answered
    wall_s: float
    errors: list[str]  # one line a failed request (warm-up included), in order
    http_requests: int | None = None  # with the tool's client: the HTTP requests its calls went in (timed part)


async def load_test(url: str, queries: list[str], concurrency: int, client: str = "httpx",
                    on_start: Callable[[], None] = lambda: None) -> LoadResult:
    """Each query a request (`POST /retrieve`, top 3), `concurrency` in flight; the latencies and the wall
    time. `client`: httpx (the benchmark's client since it was written), aiohttp (less CPU a request,
    which matters here: the client runs on the server's 2 cores) or tool (the search tool's client,
    rlfactory.envs.search.mcp_server.RetrieveClient: the same one-query calls, those in flight
    together sent as one request, as a rollout's search calls reach the retriever). A request that fails (the connection
    closed under it, an error status, a wrong answer) is one line in `errors` and the run goes on: a
    benchmark that stops at the first failure loses the run's other rows. `on_start()` is called when
    the warm-up is over and the timed queries begin."""
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    errors: list[str] = []
    if client == "httpx":
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        session: Any = httpx.AsyncClient(limits=limits, timeout=120)
        failures: tuple[type[BaseException], ...] = (httpx.HTTPError,)

        async def post(body: dict) -> dict:
            r = await session.post(url + "/retrieve", json=body)
            r.raise_for_status()
            return r.json()
    elif client == "tool":  # the search tool's client: the calls in flight batched into few requests
        from rlfactory.envs.search.mcp_server import RetrieveClient

        tool = RetrieveClient(url, topk=3, timeout_s=120)
        session = tool.client
        failures = (httpx.HTTPError,)

        async def post(body: dict) -> dict:
            return {"result": [await tool.search(body["queries"][0])]}
    else:
        import aiohttp

        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency),
                                        timeout=aiohttp.ClientTimeout(total=120))
        failures = (aiohttp.ClientError, asyncio.TimeoutError)

        async def post(body: dict) -> dict:
            async with session.post(url + "/retrieve", json=body) as r:
                r.raise_for_status()
                return await r.json()

    async with session:
        async def one(q: str) -> None:
            async with sem:
                t = time.perf_counter()
                try:
                    answer = await post({"queries": [q], "topk": 3})
                    got = len(answer["result"][0])
                except (*failures, ValueError, KeyError, TypeError) as e:  # each reported, the run goes on
                    errors.append(f"{type(e).__name__}: {e}")
                    return
                if got != 3:
                    errors.append(f"wrong answer: {got} passages, not 3")
                    return
                latencies.append(time.perf_counter() - t)

        await asyncio.gather(*(one(q) for q in queries[:50]))  # warm-up: pages the index in
        latencies.clear()
        sent = tool.requests if client == "tool" else 0
        on_start()
        t0 = time.perf_counter()
        await asyncio.gather(*(one(q) for q in queries))
        return LoadResult(latencies, time.perf_counter() - t0, errors, tool.requests - sent if client == "tool" else None)


def cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) of a process so far; None: this one."""
    if pid is None:
        u = resource.getrusage(resource.RUSAGE_SELF)
        return u.ru_utime + u.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_up(proc: subprocess.Popen, url: str, timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server did not come up")


def serve_and_query(cmd: list[str], port: int, queries: list[str], concurrency: int, startup_s: float,
                    client: str = "httpx") -> dict:
    # the server's stderr goes to a file, read afterwards: a pipe nobody reads blocks a server that
    # logs more than its 64 KB buffer (an error line a request), and its last lines explain a failure
    log = Path(tempfile.mkstemp(prefix="rlf-retrieval-server-", suffix=".log")[1])
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.perf_counter()
        wait_up(proc, url, startup_s, log)
        up_s = time.perf_counter() - t0
        rss_loaded = rss_mb(proc.pid)
        cpu0: list[float] = []  # server's and client's CPU once the warm-up is over (it loads numba's kernel)
        run = asyncio.run(load_test(url, queries, concurrency, client, lambda: cpu0.extend((cpu_s(proc.pid), cpu_s()))))
        server1, client1 = cpu_s(proc.pid), cpu_s()
        server0, client0 = cpu0
        rss_after = rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    server_log = log.read_text().splitlines()
    log.unlink()
    if not run.latencies:
        raise RuntimeError(f"every request failed ({run.errors[0]}); server's stderr: {server_log[-20:]}")
    lat_ms = sorted(x * 1000 for x in run.latencies)
    n = len(queries)  # the timed ones (the warm-up's CPU is not counted)
    return {"startup_s": up_s, "rss_loaded_mb": rss_loaded, "rss_mb": rss_after,
            "p50_ms": statistics.median(lat_ms), "p99_ms": lat_ms[int(0.99 * (len(lat_ms) - 1))],
            "qps": len(run.latencies) / run.wall_s, "server_cpu_ms": (server1 - server0) / n * 1000,
            "client_cpu_ms": (client1 - client0) / n * 1000, "errors": run.errors, "requests": n,
            "http_requests": run.http_requests, "server_log": server_log}


def http_line(name: str, r: dict, concurrency: int, client: str) -> str:
    line = (f"{name}, {client} client: top-3 at {concurrency} concurrent: p50 {r['p50_ms']:.1f} ms, p99 "
            f"{r['p99_ms']:.1f} ms, {r['qps']:.0f} q/s; CPU a query: server {r['server_cpu_ms']:.2f} ms, client "
            f"{r['client_cpu_ms']:.2f} ms; server RSS {r['rss_mb']:.0f} MB")
    if r["http_requests"] is not None:
        line += f" ({r['requests']} calls in {r['http_requests']} HTTP requests)"
    if r["errors"]:
        kinds = Counter(e.split(":", 1)[0] for e in r["errors"])
        line += (f"\n    FAILED {len(r['errors'])} of {r['requests']} requests ("
                 + ", ".join(f"{k} x{c}" for k, c in kinds.most_common()) + f"; first: {r['errors'][0]})")
        if r["server_log"]:
            line += "\n    server's stderr, last lines: " + " | ".join(r["server_log"][-5:])
    return line


def in_process_ms(search, queries: list[str]) -> float:
    search(queries[0], 3)  # not timed: loads the compiled kernel (numba) where there is one
    t = time.perf_counter()
    for q in queries[:200]:
        search(q, 3)
    return (time.perf_counter() - t) / min(200, len(queries)) * 1000


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--baseline-sizes", default="100000,300000")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--before-sizes", default=None, help="sizes at which the server before is run too (default: all)")
    ap.add_argument("--clients", default="httpx", help="load generators, comma-separated: httpx, aiohttp, tool "
                    "(the search tool's client, concurrent calls batched)")
    ap.add_argument("--work", default=None, help="scratch folder (default: a temp folder)")
    ap.add_argument("--prepare-only", action="store_true", help="make the corpora and indexes in --work, then stop")
    ap.add_argument("--reuse", action="store_true", help="use the corpora and indexes already in --work")
    a = ap.parse_args()
    if (a.prepare_only or a.reuse) and not a.work:
        ap.error("--prepare-only and --reuse need --work DIR")
    sizes = [int(s) for s in a.sizes.split(",")]
    base_sizes = {int(s) for s in a.baseline_sizes.split(",") if s}
    before_sizes = set(sizes) if a.before_sizes is None else {int(s) for s in a.before_sizes.split(",") if s}
    clients = a.clients.split(",")
    if not set(clients) <= {"httpx", "aiohttp", "tool"}:
        ap.error(f"--clients: httpx, aiohttp or tool, not {a.clients}")
    work = Path(a.work or tempfile.mkdtemp(prefix="rlf-retrieval-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {os.getloadavg()}; CPUs: {os.cpu_count()}", flush=True)
    rows: list[dict] = []
    for n in sizes:
        corpus, out, saved = work / f"corpus_{n}.jsonl", work / f"idx_{n}", work / f"prepared_{n}.json"
        if a.reuse:
            if not saved.is_file():
                raise SystemExit(f"--reuse: {saved} is missing; run with --prepare-only first")
            prep = json.loads(saved.read_text())
            queries, build_s, build_rss, gen_s = prep["queries"], prep["build_s"], prep["build_rss_mb"], prep["gen_s"]
            reused = (f" (corpus and index reused: generation and build figures from {saved}, made at load average "
                      f"{prep['load_average'][0]:.1f})")
        else:
            t = time.perf_counter()
            queries = make_corpus(corpus, n)
            gen_s = time.perf_counter() - t
            build_s, build_rss, _ = run_measured([sys.executable, "-m", "rlfactory.cli.main", "index", str(corpus),
                                                  "--out", str(out), "--no-progress"])
            saved.write_text(json.dumps({"queries": queries, "build_s": build_s, "build_rss_mb": build_rss,
                                         "gen_s": gen_s, "load_average": os.getloadavg()}))
            reused = ""
        print(f"\n== {n} passages ({corpus.stat().st_size / 2**20:.0f} MB, generated in {gen_s:.0f} s), "
              f"{len(queries)} queries, load average {os.getloadavg()[0]:.1f}"
              f"{reused}", flush=True)
        if a.prepare_only:
            print(f"prepared {corpus} and {out}: build {build_s:.1f} s (peak RSS {build_rss:.0f} MB)", flush=True)
            continue
        from retriever_before import UnprunedBM25

        from rlfactory.envs.search.index_build import load_index

        _, searcher, _ = load_index(out)
        new_inproc = in_process_ms(searcher.search, queries)
        before_inproc = in_process_ms(UnprunedBM25(searcher).search, queries)
        del searcher
        row = {"n": n, "new": {"build_s": build_s, "build_rss_mb": build_rss, "disk_mb": disk_mb(out),
                               "inproc_ms": new_inproc}, "http": {}}
        print(f"bm25s (rlfactory index): build {build_s:.1f} s (peak RSS {build_rss:.0f} MB), on disk "
              f"{row['new']['disk_mb']:.0f} MB; in process {new_inproc:.3f} ms/query, before (no pruning) "
              f"{before_inproc:.3f} ms/query: {new_inproc / before_inproc:.3f}x", flush=True)
        for client in clients:
            port = free_port()
            new = serve_and_query([sys.executable, "-m", "rlfactory.envs.search.retriever", "--index", str(out),
                                   "--port", str(port)], port, queries, a.concurrency, 600, client)
            print(http_line("  this server", new, a.concurrency, client) + f" ({new['rss_loaded_mb']:.0f} MB loaded)",
                  flush=True)
            if n in before_sizes:
                port = free_port()
                before = serve_and_query([sys.executable, str(HERE / "retriever_before.py"), "--index", str(out),
                                          "--port", str(port)], port, queries, a.concurrency, 600, client)
                print(http_line("  the server before (a081f0e)", before, a.concurrency, client), flush=True)
                print(f"  ratios this/before ({client} client): p50 {new['p50_ms'] / before['p50_ms']:.3f}x, p99 "
                      f"{new['p99_ms'] / before['p99_ms']:.3f}x, q/s {new['qps'] / before['qps']:.2f}x, server CPU a "
                      f"query {new['server_cpu_ms'] / before['server_cpu_ms']:.3f}x", flush=True)
            row["http"][client] = new
            if client == clients[0]:  # the targets and the 10M projection read the first client's run
                row["new"].update(new)
        if n in base_sizes:
            from numpy_bm25_baseline import NumpyBM25Index

            from rlfactory.envs.search.bm25 import load_corpus

            port = free_port()
            base = serve_and_query([sys.executable, str(HERE / "numpy_bm25_baseline.py"), str(corpus), str(port)],
                                   port, queries, a.concurrency, 3600, clients[0])
            index = NumpyBM25Index([d["contents"] for d in load_corpus(corpus)])
            base["inproc_ms"] = in_process_ms(index.search, queries)
            del index
            new = row["new"]
            print(f"numpy BM25 (the index before bm25s, the server before): start-up incl. build {base['startup_s']:.1f} s; "
                  f"in process {base['inproc_ms']:.2f} ms/query; " + http_line("", base, a.concurrency, clients[0]).lstrip(", "),
                  flush=True)
            print(f"ratios new/numpy: p50 {new['p50_ms'] / base['p50_ms']:.3f}x, q/s {new['qps'] / base['qps']:.2f}x, "
                  f"server RSS {new['rss_mb'] / base['rss_mb']:.2f}x, in-process latency "
                  f"{new_inproc / base['inproc_ms']:.3f}x", flush=True)
        rows.append(row)
    if not rows:
        return 0
    if len(rows) >= 2:
        a1, a2 = rows[-2], rows[-1]
        grow = lambda key: a2["new"][key] + (a2["new"][key] - a1["new"][key]) / (a2["n"] - a1["n"]) * (10_000_000 - a2["n"])  # noqa: E731
        print(f"\n10M passages on paper (linear in N from {a1['n']} and {a2['n']}): build {grow('build_s') / 60:.0f} min, "
              f"build peak RSS {grow('build_rss_mb') / 1024:.1f} GB, on disk {grow('disk_mb') / 1024:.1f} GB, "
              f"server RSS {grow('rss_mb') / 1024:.1f} GB, in-process latency {grow('inproc_ms'):.0f} ms/query")
    big = rows[-1]["new"]
    print(f"\ntargets at {rows[-1]['n']}: indexed in < 10 min: {'PASS' if big['build_s'] < 600 else 'FAIL'} "
          f"({big['build_s'] / 60:.1f} min); p50 < 20 ms: {'PASS' if big['p50_ms'] < 20 else 'FAIL'} "
          f"({big['p50_ms']:.1f} ms); RSS < 3 GB: {'PASS' if max(big['rss_mb'], big['build_rss_mb']) < 3072 else 'FAIL'} "
          f"(server {big['rss_mb']:.0f} MB, build {big['build_rss_mb']:.0f} MB)"
          + (" [build figures from the --prepare-only run, at its load]" if a.reuse else ""))
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
