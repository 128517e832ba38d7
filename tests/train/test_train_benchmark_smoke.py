"""benchmarks/gpu_train.py (rlfactory vs TRL GRPO on a GPU) runs its whole code path on the CPU
with --smoke: both frameworks and the kernels-off rlfactory baseline, every figure and ratio
printed, the JSON written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_cuda_benchmark_script_smoke_runs_on_cpu(tmp_path):
    out = tmp_path / "figures.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRL_EXPERIMENTAL_SILENCE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_train.py"), "--smoke", "--kernels-baseline",
                           "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rollout tokens/s" in proc.stdout and "GRPO step:" in proc.stdout and "MFU n/a" in proc.stdout
    figures = json.loads(out.read_text())
    assert set(figures["figures"]) == {"rlfactory", "trl", "rlfactory-plain"}
    assert "kernels on vs off (same run)" in proc.stdout and figures["kernels_ratios"]["training"] > 0
    # the kernels each rlfactory run used are printed; on the CPU `auto` resolves to the plain path
    assert figures["kernels"]["rlfactory-plain"] == figures["kernels"]["rlfactory"]
    assert "rlfactory-plain kernels (off): TrainKernels(fused_head=False" in proc.stderr
    for side in figures["figures"].values():
        assert side["gen_tok_s"] > 0 and side["train_tok_s"] > 0 and side["step_s"] > 0
    assert figures["ratios"]["step"] > 0 and figures["rlfactory_train_tflops"] > 0


def test_trl_runs_with_transformers_own_attention(monkeypatch):
    """rlfactory's generator registers its GQA decode attention process-wide; TRL's side of the
    benchmark takes it back out first, so TRL is measured as shipped."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from types import SimpleNamespace

    import gpu_train
    from transformers import AttentionInterface

    from rlfactory.generation import gqa_attention

    original = AttentionInterface._global_mapping["sdpa"]
    gqa_attention.install()
    seen = []

    def stop(*args, **kwargs):
        seen.append(gqa_attention.installed())
        raise RuntimeError("stop here")

    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", stop)
    try:
        with pytest.raises(RuntimeError, match="stop here"):
            gpu_train.run_trl("unused", None, [], SimpleNamespace(attn="sdpa"), torch.device("cpu"))
    finally:
        gqa_attention.uninstall()
        AttentionInterface.register("sdpa", original)
    assert seen == [False]


def test_training_flops_count_each_prompt_once_and_the_head_at_sampled_tokens():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from types import SimpleNamespace

    from gpu_train import PEAKS_TFLOPS, train_flops

    cfg = SimpleNamespace(hidden_size=4, num_hidden_layers=1, num_attention_heads=1, head_dim=4, num_key_value_heads=1,
                          intermediate_size=8, vocab_size=10)
    body = 4 * 4 * 2 + 4 * 4 * 2 + 3 * 4 * 8  # q,o + k,v + mlp = 160 weights
    # one prompt of 2 tokens, 1 sample of 1 token: 3 tokens through the body, 1 through the head,
    # contexts 1 + 2 (prompt) + 3 (the sampled token)
    want = 3 * (2 * body * 3 + 2 * 10 * 4 * 1 + 4 * 1 * 4 * (1 + 2 + 3))
    assert train_flops(cfg, [2], 1, 1) == want
    assert dict(PEAKS_TFLOPS)["H100"] == 989.0 and dict(PEAKS_TFLOPS)["H200"] == 989.0
