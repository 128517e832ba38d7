"""benchmarks/gpu_memory.py (which Qwen3 sizes one GPU trains, full and LoRA): the fallback ladder
(out of memory -> gradient checkpointing -> smaller micro-batches) and its whole code path on the
CPU with --smoke."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_memory  # noqa: E402
from gpu_memory import LADDER, Setting, first_rung, run_row  # noqa: E402


def test_out_of_memory_moves_down_the_ladder_and_other_errors_stop():
    seen = []

    def attempt(setting: Setting) -> dict:
        seen.append(setting)
        if setting.micro_batch is None:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return {"peak_gib": 70.0, "train_tok_s": 10.0, "step_tok_s": 5.0}

    row = run_row("qwen3-8b", "full", attempt, 0, 8.2)
    assert seen == LADDER[:3] and row.fits and row.setting == str(Setting(True, 4)) and row.peak_gib == 70.0
    assert row.tried.count(";") == 2

    def never(setting: Setting) -> dict:
        raise RuntimeError("CUDA error: out of memory")

    row = run_row("qwen3-8b", "full", never, 1, 8.2)
    assert not row.fits and row.peak_gib is None and row.tried.count(";") == len(LADDER) - 2

    def broken(setting: Setting) -> dict:
        raise ValueError("a real bug")

    with pytest.raises(ValueError):
        run_row("qwen3-8b", "full", broken, 0, 8.2)


def test_the_first_rung_is_the_cheapest_the_estimate_fits():
    costs = {LADDER[0]: 100.0, LADDER[1]: 60.0, LADDER[2]: 50.0, LADDER[3]: 40.0}
    assert first_rung(costs.__getitem__, 80.0) == 1
    assert first_rung(costs.__getitem__, 200.0) == 0
    assert first_rung(costs.__getitem__, 10.0) == len(LADDER) - 1
    # checkpointing and micro-batches lower the estimate; the trainable parameters' state counts
    full = gpu_memory.estimate_gib(8e9, 8e9, 36, 4096, 12288, 4096, LADDER[0], 16)
    assert gpu_memory.estimate_gib(8e9, 8e9, 36, 4096, 12288, 4096, LADDER[1], 16) < full
    assert gpu_memory.estimate_gib(8e9, 4e7, 36, 4096, 12288, 4096, LADDER[0], 16) < full - 40


@pytest.mark.slow
def test_memory_table_smoke_runs_on_cpu(tmp_path):
    out = tmp_path / "rows.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_memory.py"), "--smoke", "--models",
                           "qwen3-0.6b,qwen3-8b", "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| model | params | mode |" in proc.stdout and "LoRA r=16" in proc.stdout
    rows = json.loads(out.read_text())
    assert [(r["model"], r["mode"]) for r in rows] == [("qwen3-0.6b", "full"), ("qwen3-0.6b", "lora"),
                                                       ("qwen3-8b", "full"), ("qwen3-8b", "lora")]
    assert proc.stdout.count("| qwen3-8b |") == 4  # each row printed as measured, then in the table
    for r in rows:
        assert r["fits"] and r["train_tok_s"] > 0 and r["step_tok_s"] > 0 and r["peak_gib"] is None
    assert rows[0]["params_b"] == rows[1]["params_b"] > 0  # smoke sizes: the same tiny shape for every architecture
