"""Kept caches of image trajectories (issue 31) on the tiny Qwen2.5-VL: a session's kept cache that
holds one of the next request's images otherwise than a fresh prefill would (its end cuts the
image's pad run, or it fed the pads as text) is cut back to before that image, which goes through
the vision encoder again; the row samples what a fresh prefill samples, and the other rows of its
batch get their outputs (before: the cut raised in the prefill and failed the whole batch, and pads
fed as text were silently reused)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlfactory.chat.contract import SAMPLE_TOOLS
from rlfactory.config import SamplingConfig
from rlfactory.generation.local import LocalGenerator
from rlfactory.protocols import GenRequest
from rlfactory.tools.base import ToolResult
from vl_parts import picture, tiny_vl

pytestmark = pytest.mark.usefixtures("one_thread")
GREEDY = SamplingConfig(greedy=True)


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    return tiny_vl(tmp_path_factory.mktemp("tinyvl") / "m")[:2]


def forcing(script: dict[int, list[int]]):
    """A logits processor that makes the request with id() in `script` sample the script's tokens."""
    def force(reqs, generated, logits):
        for i, (req, done) in enumerate(zip(reqs, generated)):
            if id(req) in script:
                want = script[id(req)][len(done)]
                logits[i] = torch.where(torch.arange(logits.shape[-1]) == want, 0.0, -1e9)
        return logits
    return force


def first_turn(tm, look, shown):
    prompt = tm.render_prompt_images([{"role": "user", "content": [{"type": "text", "text": "Look."},
                                                                   {"type": "image", "image": look}]}], SAMPLE_TOOLS)
    obs = tm.render_observation_images([ToolResult("zoomed", images=[shown])])
    return prompt, obs


@pytest.mark.parametrize("how", ["cut", "as_text"])
def test_a_kept_cache_that_holds_an_image_otherwise_is_cut_back_before_it(vl, how):
    model, tm = vl
    look, shown = picture(48, 32, (9, 99, 9)), picture(24, 40, (200, 0, 0))
    prompt, obs = first_turn(tm, look, shown)
    pad = tm.pad_id
    j = obs.ids.index(pad)
    count = obs.ids.count(pad)
    assert count > 2
    full = prompt.ids + obs.ids  # the second turn's prompt: the picture `shown` in the tool's result
    gen = LocalGenerator(model, 0, tokenizer=tm.tokenizer, pixels=tm)
    if how == "cut":
        # the first turn (with its image) samples the observation's ids up to the 2nd pad of `shown`:
        # its kept cache (all but the last sampled token) ends after the first pad, inside the run
        sampled = obs.ids[: j + 2]
        first = GenRequest(prompt.ids, len(sampled), GREEDY, session="s", images=prompt.images)
        gen.logits_processor = forcing({id(first): sampled})
        kept_len = len(prompt.ids) + j + 1
    else:
        # the first turn saw the whole second prompt but its last token as text, pads and all
        first = GenRequest(full[:-1], 1, GREEDY, session="s")
        kept_len = len(full) - 1
    second = GenRequest(full, 6, GREEDY, session="s", images=prompt.images + obs.images)
    others = [GenRequest(tm.render_prompt_images([{"role": "user", "content": "Hi."}], SAMPLE_TOOLS).ids, 6, GREEDY),
              GenRequest(prompt.ids, 6, GREEDY, images=prompt.images)]

    async def turns():
        await gen.submit(first)
        gen.logits_processor = None
        before = gen.stats["reused_tokens"]
        outs = await asyncio.gather(*(gen.submit(r) for r in [second, *others]))
        return outs, gen.stats["reused_tokens"] - before

    try:
        (kept_out, *other_outs), reused = asyncio.run(turns())
    finally:
        gen.close()
    fresh = LocalGenerator(model, 0, tokenizer=tm.tokenizer, pixels=tm)
    try:
        want = [asyncio.run(fresh.submit(GenRequest(r.prompt_ids, 6, GREEDY, images=r.images)))
                for r in [second, *others]]
    finally:
        fresh.close()
    for got, ref in zip([kept_out, *other_outs], want):
        assert got.token_ids == ref.token_ids and len(got.token_ids) == 6
        torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(ref.logprobs), atol=1e-4, rtol=1e-4)
    # the kept cache is used up to the first image it does not hold encoded: `shown` (cut), `look`
    # (its pads too were fed as text)
    cut_at = len(prompt.ids) + j if how == "cut" else prompt.ids.index(pad)
    assert kept_len > cut_at and reused == cut_at

