"""Weight sync benchmark: how long the learner takes to push new weights to an `rlfactory serve`
process, for rlfactory's 10M tiny model and a model of SmolLM2-135M's shape.

    .venv/bin/python benchmarks/weight_sync.py

For each model a real `rlfactory serve` subprocess serves it on a loopback port, and this process
(the learner) holds the same model with moved weights. Measured, median of REPEATS each:
  baseline   saving the learner's weights as one safetensors file on local disk (what any
             checkpoint-based sync has to do at least), in the same run;
  tensors    ServerWeightSync "tensors": serialize to one safetensors body, POST it, the server parses it,
             waits for turns in flight (none here) and copies it into its model;
  disk       ServerWeightSync "disk": write a checkpoint folder (safetensors + config.json), the server
             reads it through /update_weights_from_disk.
Each sync is checked: the server's /weights_digest must equal the learner's. Figures: seconds per
sync, MB/s (parameter bytes / seconds) and the ratio to the baseline. `weight_sync: auto` uses
disk for an `rlfactory serve` on this machine (a loopback URL) and tensors for one elsewhere.

SmolLM2-135M: GGUF loading is not on main here, so the model is a randomly initialised LlamaConfig
of SmolLM2-135M's shape (hidden 576, 30 layers, 9 heads, 3 KV heads, intermediate 1536, vocabulary
49152, tied embeddings); the sync cost depends on the shapes and dtype only.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

from rlfactory.generation.server_generator import ServerGenerator
from rlfactory.serve.process import ServeProcess
from rlfactory.serve.weights import weights_digest
from rlfactory.tiny import resolve_model
from rlfactory.train.policy_weights import policy_tensors
from rlfactory.train.weight_sync import ServerWeightSync

REPEATS = 5
SERVER_THREADS = 1


def smollm2_shaped(folder: Path):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                      intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=8192,
                      rms_norm_eps=1e-5, rope_theta=100000.0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(folder)
    # The server needs a tokenizer to start; the benchmark generates nothing, so the tiny one does.
    AutoTokenizer.from_pretrained(resolve_model("tiny:1m")).save_pretrained(folder)
    return model


def tiny10m(folder: Path):
    from transformers import AutoModelForCausalLM

    src = Path(resolve_model("tiny:10m"))
    shutil.copytree(src, folder)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def moved(model, step: int) -> None:
    """Change every weight a little, as an optimizer step would."""
    torch.manual_seed(step)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-3 * torch.randn_like(p))


def save_baseline(model, folder: Path) -> float:
    from safetensors.torch import save_file

    t0 = time.perf_counter()
    save_file(policy_tensors(model), str(folder / "model.safetensors"))
    return time.perf_counter() - t0


async def run_rounds(url: str, model, tmp: Path) -> dict[str, list[float]]:
    """REPEATS rounds of: baseline save, tensors sync, disk sync (interleaved, so that the load of
    the shared machine weighs on all three alike)."""
    g = ServerGenerator([url], "vllm", None, timeout_s=600)
    syncs = {m: ServerWeightSync(g, m, tmp / f"sync-{m}") for m in ("tensors", "disk")}
    base_dir = tmp / "baseline"
    base_dir.mkdir()
    out: dict[str, list[float]] = {k: [] for k in ("baseline", "tensors", "tensors_prep", "disk", "disk_prep")}
    version = 0
    try:
        for _ in range(REPEATS):
            out["baseline"].append(save_baseline(model, base_dir))
            for method, sync in syncs.items():
                version += 1
                moved(model, version)
                m = await sync.push(model, version)
                assert m["weight_sync/ok"] == 1, f"{method} sync failed"
                digest = (await g.client.get(url + "/weights_digest", timeout=600)).json()
                assert digest == {"sha256": weights_digest(model), "policy_version": version}, "server weights differ"
                out[method].append(m["weight_sync/seconds"])
                out[method + "_prep"].append(m["weight_sync/prepare_s"])
    finally:
        await g.aclose()
    return out


def bench(name: str, make, tmp: Path) -> dict:
    folder = tmp / name
    model = make(folder)
    mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6
    params = sum(p.numel() for p in model.parameters()) / 1e6
    with ServeProcess(str(folder), ["--threads", str(SERVER_THREADS), "--max-batch", "8"], startup_timeout_s=600) as srv:
        assert httpx.get(srv.url + "/health").json()["server"] == "rlfactory"
        work = tmp / f"{name}-work"
        work.mkdir()
        r = asyncio.run(run_rounds(srv.url, model, work))
    med = {k: statistics.median(v) for k, v in r.items()}
    b, t, d = med["baseline"], med["tensors"], med["disk"]
    print(f"\n{name}: {params:.1f} M parameters, {mb:.1f} MB (float32), median of {REPEATS} interleaved rounds")
    print(f"    baseline: save one safetensors file on local disk     {b:7.3f} s   {mb / b:5.0f} MB/s")
    print(f"    sync tensors over HTTP (rlfactory serve)              {t:7.3f} s   {mb / t:5.0f} MB/s   {t / b:5.2f}x baseline"
          f"   (serialize {med['tensors_prep']:.3f} s, send + server load {t - med['tensors_prep']:.3f} s)")
    print(f"    sync via checkpoint folder (/update_weights_from_disk) {d:7.3f} s   {mb / d:5.0f} MB/s   {d / b:5.2f}x baseline"
          f"   (write {med['disk_prep']:.3f} s, server load {d - med['disk_prep']:.3f} s)")
    print("    every round, seconds: " + "; ".join(f"{k} {', '.join(f'{x:.2f}' for x in r[k])}" for k in ("baseline", "tensors", "disk")))
    print(f"    all {2 * REPEATS} syncs verified: server weights digest == learner weights digest")
    return {"name": name, "mb": mb, "baseline": b, "tensors": t, "disk": d}


def main() -> int:
    torch.set_num_threads(1)
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f} at start")
    print(f"settings: learner torch threads 1, server --threads {SERVER_THREADS}, one server on loopback, "
          f"float32 weights, {REPEATS} syncs per method, /tmp on {os.path.realpath(tempfile.gettempdir())}")
    with tempfile.TemporaryDirectory(prefix="rlfactory-wsync-") as d:
        tmp = Path(d)
        bench("tiny:10m", tiny10m, tmp)
        bench("SmolLM2-135M shape (random init)", smollm2_shaped, tmp)
    print(f"\nload average {os.getloadavg()[0]:.2f} at end (other work on this machine shares the CPUs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
