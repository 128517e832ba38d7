"""On a CUDA device (skipped without one): the local generator matches `model.generate` there, for
full-attention and sliding-window models, and a whole `rlfactory train` run (generator, trainer,
reference model) stays on the GPU."""

from __future__ import annotations

import asyncio
import shutil

import pytest
import torch
from generation_fakes import tiny_random_lm

from rlfactory.config import SamplingConfig
from rlfactory.protocols import GenRequest
from rlfactory.generation.local import LocalGenerator

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
GREEDY = SamplingConfig(greedy=True)


def _check_generator(model):
    model = model.to("cuda").eval()
    gen = LocalGenerator(model, pad_id=0, device="cuda", max_batch=4)
    ps = [[(7 * i + j) % 250 + 1 for j in range(3 + 5 * i)] for i in range(6)]
    results = asyncio.run(gen.generate([GenRequest(p, max_new_tokens=16, sampling=GREEDY) for p in ps]))
    for p, r in zip(ps, results):
        ref = model.generate(torch.tensor([p], device="cuda"), max_new_tokens=16, do_sample=False,
                             eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
        assert r.token_ids == ref
        with torch.no_grad():
            logits = model(torch.tensor([p + r.token_ids], device="cuda")).logits[0, len(p) - 1: -1].float()
        want = logits.log_softmax(-1).gather(1, torch.tensor(r.token_ids, device="cuda")[:, None]).squeeze(1)
        assert torch.allclose(torch.tensor(r.logprobs), want.cpu(), atol=1e-3)


def test_gpu_generator_matches_generate_full_attention():
    _check_generator(tiny_random_lm())


def test_gpu_generator_matches_generate_sliding_window():
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    _check_generator(MistralForCausalLM(MistralConfig(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, sliding_window=6)))


def _sliding_model():
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    return MistralForCausalLM(MistralConfig(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, sliding_window=6))


@pytest.mark.parametrize("make", [tiny_random_lm, _sliding_model], ids=["full_attention", "sliding_window"])
def test_gpu_cuda_graph_decode_matches_eager_decode(make):
    """Decode steps replayed from CUDA graphs give the eager steps' tokens and logprobs, with rows
    joining, leaving and moving, and the cache growing mid-run (a new graph for the new shape)."""
    model = make().to("cuda").eval()
    ps = [[(7 * i + j) % 250 + 1 for j in range(3 + (5 * i) % 17)] for i in range(9)]
    reqs = [GenRequest(p, max_new_tokens=4 + (5 * i) % 13 + (90 if i >= 7 else 0), sampling=GREEDY)
            for i, p in enumerate(ps)]
    graphed = LocalGenerator(model, pad_id=0, device="cuda", max_batch=4)
    eager = LocalGenerator(model, pad_id=0, device="cuda", max_batch=4, cuda_graphs=False)
    a = asyncio.run(graphed.generate(reqs))
    b = asyncio.run(eager.generate(reqs))
    assert eager.loop.decode.static is None
    assert graphed.stats["graph_captures"] >= 2 and graphed.stats["graph_replays"] > graphed.stats["steps"] // 2
    for p, req, x, y in zip(ps, reqs, a, b):
        assert x.token_ids == y.token_ids
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)
        ref = model.generate(torch.tensor([p], device="cuda"), max_new_tokens=req.max_new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
        assert x.token_ids == ref


def test_gpu_training_run_stays_on_the_gpu(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
    from train_fixtures import run_config

    from rlfactory.config import load_config
    from rlfactory.train.session import open_rollout
    from rlfactory.config import RunConfig
    from rlfactory.train.loop import Trainer

    # The device placement is under test, not the sandbox: GPU machines often lack bubblewrap.
    sandbox = "strict" if shutil.which("bwrap") else "weak"
    cfg = load_config(RunConfig, run_config(tmp_path, model={"device": "cuda", "dtype": "bfloat16"},
                                            env={"name": "python", "options": {"sandbox": sandbox}},
                                            algo={"kl_coef": 0.05}, trainer={"steps": 1}))

    async def one_step():
        async with open_rollout(cfg, reward_mode="required") as session:
            trainer = Trainer(cfg, session, session.reward, session.env.load_split("train"))
            metrics, trajs = await trainer.step(1)
            return trainer, metrics

    trainer, metrics = asyncio.run(one_step())
    learner = trainer.learner
    assert learner.device.type == "cuda"
    assert all(p.device.type == "cuda" for p in learner.policy.parameters())
    assert all(p.device.type == "cuda" for p in learner.reference.copy.parameters())
    assert next(learner.policy.parameters()).dtype == torch.bfloat16
    assert torch.isfinite(torch.tensor(metrics["loss/total"]))
