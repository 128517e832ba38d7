"""LocalGenerator on tiny randomly initialised models with sliding-window layers (Mistral, Gemma 2,
Gemma 3, Qwen2 with `use_sliding_window`, gpt-oss): continuous batching, kept caches and shared
prefixes give the tokens of one-at-a-time `model.generate` and the logprobs of a full forward,
with windows far shorter than the sequences so the window matters."""

from __future__ import annotations

import asyncio

import pytest
import torch
from generation_fakes import reference, tiny_random_lm

from rlfactory.generation.attention_masks import layer_kinds, mask_plan
from rlfactory.config import SamplingConfig
from rlfactory.protocols import GenRequest
from rlfactory.generation.local import LocalGenerator

GREEDY = SamplingConfig(greedy=True)
WINDOW = 6
pytestmark = pytest.mark.usefixtures("one_thread")

DIMS = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=512)


def mistral():
    from transformers import MistralConfig, MistralForCausalLM
    return MistralForCausalLM(MistralConfig(**DIMS, num_hidden_layers=2, sliding_window=WINDOW))


def gemma2():
    from transformers import Gemma2Config, Gemma2ForCausalLM
    return Gemma2ForCausalLM(Gemma2Config(**DIMS, num_hidden_layers=2, sliding_window=WINDOW, attn_implementation="eager"))


def gemma3():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    cfg = Gemma3TextConfig(**DIMS, num_hidden_layers=3, sliding_window=WINDOW,
                           layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    return Gemma3ForCausalLM(cfg)


def qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    dims = {k: v for k, v in DIMS.items() if k != "head_dim"}
    return Qwen2ForCausalLM(Qwen2Config(**dims, num_hidden_layers=3, use_sliding_window=True, sliding_window=WINDOW,
                                        max_window_layers=1))


def gpt_oss():
    from transformers import GptOssConfig, GptOssForCausalLM
    cfg = GptOssConfig(**{**DIMS, "intermediate_size": 32}, num_hidden_layers=2, sliding_window=WINDOW,
                       num_local_experts=4, num_experts_per_tok=2, attn_implementation="eager")
    return GptOssForCausalLM(cfg)


MODELS = {"mistral": mistral, "gemma2": gemma2, "gemma3": gemma3, "qwen2": qwen2, "gpt_oss": gpt_oss}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    torch.manual_seed(0)
    m = MODELS[request.param]().eval()
    with torch.no_grad():  # random init is too flat to tell positions apart; sharpen it
        for p in m.parameters():
            p.mul_(3.0) if p.dim() > 1 else None
    return m


def prompts(k: int) -> list[list[int]]:
    return [[(11 * i + 3 * j) % 280 + 5 for j in range(4 + (7 * i) % 19)] for i in range(k)]


def teacher_forced(model, prompt, tokens):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1: -1].float()
    return logits.log_softmax(-1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)


async def staggered(gen, reqs, gap=0.003):
    async def one(i, r):
        await asyncio.sleep(gap * i)
        return await gen.submit(r)

    return await asyncio.gather(*(one(i, r) for i, r in enumerate(reqs)))


def test_the_models_do_have_sliding_window_layers_and_the_window_matters(model):
    assert "sliding_attention" in layer_kinds(model.config)
    assert mask_plan(model) is not None and mask_plan(model).window == WINDOW
    p, tokens = prompts(3)[2], list(range(20, 40))
    windowed = teacher_forced(model, p, tokens)
    model.config.sliding_window = 10_000
    try:
        unwindowed = teacher_forced(model, p, tokens)
    finally:
        model.config.sliding_window = WINDOW
    assert not torch.allclose(windowed, unwindowed, atol=1e-3)  # so matching below tests the window


def test_continuous_batching_matches_generate_past_the_window(model):
    gen = LocalGenerator(model, pad_id=0, max_batch=4)
    ps = prompts(7)
    reqs = [GenRequest(p, max_new_tokens=2 * WINDOW + (5 * i) % 9, sampling=GREEDY) for i, p in enumerate(ps)]
    results = asyncio.run(staggered(gen, reqs))
    assert gen.stats["prefills"] > 1
    for p, req, res in zip(ps, reqs, results):
        assert len(p) + len(res.token_ids) > 2 * WINDOW
        assert res.token_ids == reference(model, p, req.max_new_tokens)
        assert torch.allclose(torch.tensor(res.logprobs), teacher_forced(model, p, res.token_ids), atol=2e-4)


def test_kept_caches_and_a_shared_prefix_match_a_full_forward(model):
    system = [(5 * j) % 250 + 7 for j in range(20)]  # longer than the window, shared by every row
    ps = [system + t for t in ([9], [10, 11, 12], [13, 14])]
    sessions = ["a", None, "c"]

    async def two_turns(gen):
        first = await gen.generate([GenRequest(p, max_new_tokens=5, sampling=GREEDY, session=s)
                                    for p, s in zip(ps, sessions)])
        contexts = [p + r.token_ids + [200 + i, 201, 202] for i, (p, r) in enumerate(zip(ps, first))]
        reqs = [GenRequest(c, max_new_tokens=7, sampling=GREEDY, session=s) for c, s in zip(contexts, sessions)]
        return first, contexts, await staggered(gen, reqs, gap=0.002)

    gen = LocalGenerator(model, pad_id=0)
    first, contexts, second = asyncio.run(two_turns(gen))
    assert gen.stats["shared_prefix_tokens"] > 0 and gen.stats["reused_tokens"] > 0
    for p, r in zip(ps, first):
        assert r.token_ids == reference(model, p, 5)
    for c, r in zip(contexts, second):
        assert r.token_ids == reference(model, c, 7)
        assert torch.allclose(torch.tensor(r.logprobs), teacher_forced(model, c, r.token_ids), atol=2e-4)


def test_full_attention_models_keep_the_padding_mask_fast_path():
    assert mask_plan(tiny_random_lm()) is None


def test_unsupported_layer_kinds_and_kernels_are_refused():
    model = tiny_random_lm()
    model.config.layer_types = ["linear_attention", "full_attention"]
    with pytest.raises(NotImplementedError, match="linear_attention"):
        LocalGenerator(model, pad_id=0)
    m = mistral()
    m.config._attn_implementation = "flash_attention_2"
    with pytest.raises(NotImplementedError, match="sdpa or eager"):
        LocalGenerator(m, pad_id=0)
