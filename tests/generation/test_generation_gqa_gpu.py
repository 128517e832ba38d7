"""On a CUDA device (skipped without one): decode steps replayed from CUDA graphs with the GQA
attention of gqa_attention.py give the tokens and logprobs of eager steps with transformers' own
repeat_kv sdpa; and one decode step of a random Qwen3-0.6B is timed before/after (printed, not
asserted: run with -s)."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest
import torch
from generation_fakes import prompts, tiny_random_lm
from transformers import AttentionInterface

from rlfactory.config import SamplingConfig
from rlfactory.generation import gqa_attention
from rlfactory.generation.local import LocalGenerator
from rlfactory.protocols import GenRequest

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
GREEDY = SamplingConfig(greedy=True)


@pytest.fixture
def transformers_sdpa(monkeypatch):
    """Generators made with `make(packed)`: packed=False keeps transformers' own sdpa (repeat_kv)."""
    gqa_attention.uninstall()
    original = AttentionInterface._global_mapping["sdpa"]
    real_install = gqa_attention.install
    made: list[LocalGenerator] = []

    def make(model, packed: bool, **kw) -> LocalGenerator:
        if packed:
            real_install()
        else:
            gqa_attention.uninstall()
        monkeypatch.setattr(gqa_attention, "install", lambda: None)  # this generator keeps what was chosen
        try:
            made.append(LocalGenerator(model, pad_id=0, device="cuda", **kw))
            return made[-1]
        finally:
            monkeypatch.setattr(gqa_attention, "install", real_install)

    yield make
    # Free the generators' CUDA graphs now: a dead generator's graph freed by the cyclic GC in
    # the middle of a later test's capture breaks that capture.
    for gen in made:
        gen.close()
    made.clear()
    gc.collect()
    gqa_attention.uninstall()
    AttentionInterface.register("sdpa", original)


def test_gpu_graph_decode_with_gqa_attention_equals_eager_repeat_kv(transformers_sdpa):
    model = tiny_random_lm().to("cuda").eval()
    reqs = [GenRequest(p, max_new_tokens=4 + (5 * i) % 13 + (90 if i >= 7 else 0), sampling=GREEDY)
            for i, p in enumerate(prompts(9))]
    graphed = transformers_sdpa(model, packed=True, max_batch=4)
    a = asyncio.run(graphed.generate(reqs))
    assert gqa_attention.installed()
    eager = transformers_sdpa(model, packed=False, max_batch=4, cuda_graphs=False)
    b = asyncio.run(eager.generate(reqs))
    assert not gqa_attention.installed()
    assert graphed.stats["graph_captures"] >= 2 and graphed.stats["graph_replays"] > graphed.stats["steps"] // 2
    for x, y in zip(a, b):
        assert x.token_ids == y.token_ids
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), rtol=0, atol=1e-4)


def _decode_step_ms(gen: LocalGenerator, ids: list[list[int]], new: int) -> tuple[float, list]:
    """Wall ms per decode step: (time of `new` tokens - time of 1 token) / (new - 1), after a warm-up."""
    def run(n: int) -> tuple[float, list]:
        reqs = [GenRequest(p, max_new_tokens=n, sampling=GREEDY, stop_token_ids=[]) for p in ids]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = asyncio.run(gen.generate(reqs))
        torch.cuda.synchronize()
        return time.perf_counter() - t0, out

    run(new)  # warm-up: kernels, allocator, the cache grown to its final shape, its graph recorded
    one, _ = run(1)
    full, out = run(new)
    return 1000 * (full - one) / (new - 1), out


def _replay_ms(gen: LocalGenerator, n: int = 20) -> float | None:
    """GPU ms of one replay of the decode step's CUDA graph (the last one recorded), CUDA events."""
    graph = gen.loop.decode.static._graph
    if graph is None:
        return None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def test_gpu_decode_step_time_before_after_qwen3_0_6b(transformers_sdpa):
    from rlfactory.tiny.architectures import random_model

    model = random_model("qwen3-0.6b", dtype=torch.bfloat16, device="cuda")
    assert next(model.parameters()).is_cuda
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(1000, 150000, (256,), generator=g).tolist() for _ in range(64)]
    results = {}
    for packed in (False, True):
        gen = transformers_sdpa(model, packed=packed, max_batch=64)
        results[packed] = (*_decode_step_ms(gen, ids, 65), _replay_ms(gen), gen.loop.decode.slots.cache.columns)
        assert gen.stats["graph_replays"] > 0
    (before, out_before, gpu_before, cols), (after, out_after, gpu_after, _) = results[False], results[True]
    same = sum(x.token_ids == y.token_ids for x, y in zip(out_before, out_after))
    gpu = (f"; GPU time of one graph replay {gpu_before:.2f} ms vs {gpu_after:.2f} ms: {gpu_before / gpu_after:.2f}x"
           if gpu_before and gpu_after else "")
    print(f"\nGQA decode step, random qwen3-0.6b bf16, 64 rows x 256-token prompts ({cols} cache columns), CUDA graphs, "
          f"{torch.cuda.get_device_name()}: wall per step transformers sdpa (repeat_kv) {before:.2f} ms vs packed GQA "
          f"{after:.2f} ms: {before / after:.2f}x{gpu}; greedy rows identical: {same}/64")
    assert after > 0 and before > 0
