"""LocalGenerator on a real (randomly initialised) transformers Qwen3 model: continuous batching
gives the same tokens as one-at-a-time `model.generate`, and every recorded logprob equals the
teacher-forced log-softmax that a trainer recomputes."""

from __future__ import annotations

import asyncio

import pytest
import torch
from generation_fakes import CodepointTokenizer, prompts, reference, tiny_random_lm

from rlfactory.config import SamplingConfig
from rlfactory.generation.prefill import prefill_groups
from rlfactory.protocols import GenRequest
from rlfactory.generation.local import LocalGenerator

GREEDY = SamplingConfig(greedy=True)

pytestmark = pytest.mark.usefixtures("one_thread")


def teacher_forced(model, prompt, tokens, temperature=1.0):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    return (logits / temperature).log_softmax(-1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)


async def staggered(gen, reqs, gap=0.003):
    async def one(i, r):
        await asyncio.sleep(gap * i)  # arrive while others are mid-generation
        return await gen.submit(r)

    return await asyncio.gather(*(one(i, r) for i, r in enumerate(reqs)))


def test_continuous_batching_matches_one_at_a_time_generate():
    model = tiny_random_lm()
    gen = LocalGenerator(model, pad_id=0, max_batch=5)
    ps = prompts(14)
    reqs = [GenRequest(p, max_new_tokens=4 + (3 * i) % 11, sampling=GREEDY) for i, p in enumerate(ps)]
    results = asyncio.run(staggered(gen, reqs))
    assert gen.stats["prefills"] > 1  # requests joined a running batch at different steps
    assert gen.stats["moved_rows"] > 0  # and rows were moved down into freed slots
    for p, req, res in zip(ps, reqs, results):
        assert res.token_ids == reference(model, p, req.max_new_tokens)
        assert res.finish_reason == "length" and len(res.logprobs) == len(res.token_ids)
        assert torch.allclose(torch.tensor(res.logprobs), teacher_forced(model, p, res.token_ids), atol=1e-4)


def test_new_rows_of_very_different_lengths_prefill_in_separate_forwards():
    """Two long prompts and three short ones arrive together: padding the short ones to the long
    ones' length would cost more than a second forward (prefill.py PREFILL_OVERHEAD_TOKENS), so
    they prefill in two; rows of similar length share one. Same tokens as one-at-a-time generate."""
    model = tiny_random_lm()
    gen = LocalGenerator(model, pad_id=0)
    short = prompts(3)  # 3, 8 and 13 ids
    long_ = [[(11 * j + k) % 250 + 1 for j in range(240 + 20 * k)] for k in range(2)]
    ps = [long_[0], short[0], short[1], long_[1], short[2]]
    reqs = [GenRequest(p, max_new_tokens=3, sampling=GREEDY) for p in ps]
    results = asyncio.run(gen.generate(reqs))
    assert gen.stats["prefills"] == 2 and gen.stats["prefill_tokens"] == sum(len(p) for p in ps)
    for p, res in zip(ps, results):
        assert res.token_ids == reference(model, p, 3)
        assert torch.allclose(torch.tensor(res.logprobs), teacher_forced(model, p, res.token_ids), atol=1e-4)
    gen.stats["prefills"] = 0
    asyncio.run(gen.generate([GenRequest(p, max_new_tokens=3, sampling=GREEDY) for p in short]))
    assert gen.stats["prefills"] == 1
    # On an accelerator a forward costs its launches, not its padding: one forward
    lengths = [len(p) for p in ps]
    assert prefill_groups(lengths, torch.device("cuda")) == [[0, 1, 2, 3, 4]]
    assert prefill_groups(lengths, torch.device("cpu")) == [[1, 2, 4], [0, 3]]


def test_a_request_joins_only_while_none_of_a_lower_priority_waits_or_generates():
    """GenRequest.priority (asynchronous training gives each step's rollout its step number): the
    later step's turns wait while the older step's wait or generate; a row already generating goes
    on when an older one arrives, which joins it at once. Same tokens as one-at-a-time generate."""
    model = tiny_random_lm()
    calls: list[list[int]] = []
    gen = LocalGenerator(model, pad_id=0, logits_processor=lambda reqs, generated, logits: (
        calls.append([r.priority for r in reqs]), logits)[1])
    ps = prompts(4)
    reqs = [GenRequest(p, max_new_tokens=4 + i, sampling=GREEDY, priority=[2, 1, 2, 1][i]) for i, p in enumerate(ps)]
    results = asyncio.run(gen.generate(reqs))
    assert all(max(a) <= min(b) for a, b in zip(calls, calls[1:]))  # no priority-2 row before the 1s are done
    assert [1, 1] in calls and [2, 2] in calls  # each priority still batched
    for p, req, res in zip(ps, reqs, results):
        assert res.token_ids == reference(model, p, req.max_new_tokens)

    calls.clear()
    late = GenRequest(ps[1], max_new_tokens=3, sampling=GREEDY, priority=1)

    async def older_arrives_while_a_newer_one_generates():
        loop = asyncio.get_running_loop()
        arrived: list[asyncio.Future] = []

        def record(reqs, generated, logits):
            calls.append([r.priority for r in reqs])
            if len(calls) == 2:  # the newer row is generating: the older request arrives now
                arrived.append(asyncio.run_coroutine_threadsafe(gen.submit(late), loop))
            return logits

        gen.logits_processor = record
        newer = await gen.submit(GenRequest(ps[0], max_new_tokens=12, sampling=GREEDY, priority=2))
        return newer, await asyncio.wrap_future(arrived[0])

    newer, older = asyncio.run(older_arrives_while_a_newer_one_generates())
    assert calls[:2] == [[2], [2]] and ([1, 2] in calls or [2, 1] in calls)
    assert newer.token_ids == reference(model, ps[0], 12) and older.token_ids == reference(model, ps[1], 3)

def test_sampled_logprobs_follow_the_temperature_convention():
    model = tiny_random_lm()
    gen = LocalGenerator(model, pad_id=0, max_batch=8, seed=0)
    s = SamplingConfig(temperature=0.7, top_k=20, top_p=0.9)
    ps = prompts(6)
    results = asyncio.run(staggered(gen, [GenRequest(p, max_new_tokens=12, sampling=s) for p in ps]))
    for p, res in zip(ps, results):
        assert len(res.token_ids) == 12
        want = teacher_forced(model, p, res.token_ids, temperature=0.7)
        assert torch.allclose(torch.tensor(res.logprobs), want, atol=1e-4)


def test_stop_token_and_stop_string_end_a_turn():
    model = tiny_random_lm()
    p = prompts(1)[0]
    free = reference(model, p, 12)
    tok = CodepointTokenizer()
    gen = LocalGenerator(model, pad_id=0, stop_token_ids=[free[4]], tokenizer=tok)
    first = free.index(free[4])
    res = asyncio.run(gen.submit(GenRequest(p, max_new_tokens=12, sampling=GREEDY)))
    assert res.token_ids == free[: first + 1] and res.finish_reason == "stop" and res.stop_token == free[4]
    assert res.text == tok.decode(res.token_ids)
    # A stop string spanning two tokens: the token that completes it is kept, nothing is cut.
    needle = tok.decode(free[5:7])
    gen2 = LocalGenerator(model, pad_id=0, tokenizer=tok, stop_strings=[needle])
    res2 = asyncio.run(gen2.submit(GenRequest(p, max_new_tokens=12, sampling=GREEDY)))
    assert needle in res2.text and needle not in tok.decode(res2.token_ids[:-1])
    assert res2.finish_reason == "stop" and res2.stop_token is None
    # A request may turn the defaults off.
    res3 = asyncio.run(gen.submit(GenRequest(p, max_new_tokens=12, sampling=GREEDY, stop_token_ids=[])))
    assert res3.token_ids == free and res3.finish_reason == "length"


def test_model_can_be_replaced_between_rollouts_and_train_mode_is_restored():
    gen = LocalGenerator(tiny_random_lm(seed=0), pad_id=0)
    p = prompts(3)[2]
    asyncio.run(gen.submit(GenRequest(p, max_new_tokens=6, sampling=GREEDY)))
    other = tiny_random_lm(seed=1).train()
    gen.model = other
    res = asyncio.run(gen.submit(GenRequest(p, max_new_tokens=6, sampling=GREEDY)))
    assert other.training
    assert res.token_ids == reference(other.eval(), p, 6)


@pytest.mark.parametrize("fail_at", [1, 3])  # in the prefill of new requests, in a decode step
def test_a_failing_forward_fails_the_waiting_requests_and_the_generator_recovers(fail_at):
    model = tiny_random_lm()
    gen = LocalGenerator(model, pad_id=0)
    calls = {"n": 0}

    def broken(reqs, generated, logits):
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise RuntimeError("device lost")
        return logits

    gen.logits_processor = broken
    p = prompts(2)
    with pytest.raises(RuntimeError, match="device lost"):
        asyncio.run(gen.generate([GenRequest(q, max_new_tokens=8, sampling=GREEDY) for q in p]))
    res = asyncio.run(gen.generate([GenRequest(q, max_new_tokens=5, sampling=GREEDY) for q in p]))
    assert [r.token_ids for r in res] == [reference(model, q, 5) for q in p]


def test_logits_processor_sees_each_rows_request_and_tokens():
    model = tiny_random_lm()
    seen = []

    def force(reqs, generated, logits):
        out = torch.full_like(logits, float("-inf"))
        for i, (req, toks) in enumerate(zip(reqs, generated)):
            seen.append((req.prompt_ids[0], len(toks)))
            out[i, req.prompt_ids[0] + len(toks)] = 0.0
        return out

    gen = LocalGenerator(model, pad_id=0, logits_processor=force)
    res = asyncio.run(gen.generate([GenRequest([10, 1], max_new_tokens=3), GenRequest([50, 2, 3], max_new_tokens=3)]))
    assert [r.token_ids for r in res] == [[10, 11, 12], [50, 51, 52]]
    assert all(lp == 0.0 for r in res for lp in r.logprobs)


def test_kept_session_cache_gives_the_same_turns_as_a_full_prefill():
    """Turn 2 of each trajectory reuses its turn-1 cache and prefills only the new ids; the result
    equals a fresh prefill of the whole context, also when rows with and without a kept cache
    share a prefill."""
    model = tiny_random_lm()
    ps = prompts(6)

    async def two_turns(gen, sessions):
        first = await gen.generate(
            [GenRequest(p, max_new_tokens=5 + i, sampling=GREEDY, session=s) for i, (p, s) in enumerate(zip(ps, sessions))]
        )
        contexts = [p + r.token_ids + [200 + i, 201, 202 + i] for i, (p, r) in enumerate(zip(ps, first))]
        reqs = [GenRequest(c, max_new_tokens=6, sampling=GREEDY, session=s) for c, s in zip(contexts, sessions)]
        return contexts, await staggered(gen, reqs, gap=0.002)

    gen = LocalGenerator(model, pad_id=0, max_batch=4)
    contexts, kept = asyncio.run(two_turns(gen, [f"s{i}" if i % 3 else None for i in range(6)]))
    assert gen.stats["reused_tokens"] > 0
    for c, res in zip(contexts, kept):
        assert res.token_ids == reference(model, c, 6)
        assert torch.allclose(torch.tensor(res.logprobs), teacher_forced(model, c, res.token_ids), atol=1e-4)
    # A kept cache whose ids do not prefix the new prompt is not used.
    gen.forget()
    asyncio.run(gen.submit(GenRequest(ps[0], max_new_tokens=3, sampling=GREEDY, session="x")))
    before = gen.stats["reused_tokens"]
    other = ps[1] + [5, 6, 7]
    res = asyncio.run(gen.submit(GenRequest(other, max_new_tokens=4, sampling=GREEDY, session="x")))
    assert gen.stats["reused_tokens"] == before and res.token_ids == reference(model, other, 4)


def test_generation_past_the_cache_headroom_is_unchanged():
    """The cache buffer is grown (one copy) when a sequence outlives its spare room."""
    model = tiny_random_lm()
    gen = LocalGenerator(model, pad_id=0)
    ps = prompts(3)[:2]
    res = asyncio.run(gen.generate([GenRequest(p, max_new_tokens=150, sampling=GREEDY) for p in ps]))
    for p, r in zip(ps, res):
        assert r.token_ids == reference(model, p, 150)


def test_a_common_prefix_is_computed_once_and_changes_nothing():
    model = tiny_random_lm()
    system = [(3 * j) % 250 + 1 for j in range(24)]
    ps = [system + t for t in ([7], [8, 9, 10], [11, 12], [13] * 6)]
    gen = LocalGenerator(model, pad_id=0)
    res = asyncio.run(gen.generate([GenRequest(p, max_new_tokens=6, sampling=GREEDY) for p in ps]))
    assert gen.stats["shared_prefix_tokens"] == 24 * 3
    for p, r in zip(ps, res):
        assert r.token_ids == reference(model, p, 6)
        assert torch.allclose(torch.tensor(r.logprobs), teacher_forced(model, p, r.token_ids), atol=1e-4)


def test_each_group_of_samples_computes_its_own_prompt_once_and_changes_nothing():
    """Several prompts' samples in one step (GRPO's groups): the batch shares only the system
    prompt, each group its whole prompt; every group's part is computed once on top of it. Two
    prompts that start alike past the system prompt (18 ids of their 40) stay two groups."""
    model = tiny_random_lm()
    system = [(3 * j) % 250 + 1 for j in range(24)]
    alike = [(7 * j) % 230 + 5 for j in range(18)]
    questions = [alike + [(5 * j + k) % 240 + 3 for j in range(22)] for k in (1, 2)]
    ps = [system + q + t for q in questions for t in ([7], [8, 9], [7])] + [system + [99, 98]]
    gen = LocalGenerator(model, pad_id=0)
    res = asyncio.run(gen.generate([GenRequest(p, max_new_tokens=6, sampling=GREEDY) for p in ps]))
    # the system prompt once for 7 rows, each question once for its 3 rows
    assert gen.stats["shared_prefix_tokens"] == 24 * 6 + 40 * 2 * 2
    for p, r in zip(ps, res):
        assert r.token_ids == reference(model, p, 6)
        assert torch.allclose(torch.tensor(r.logprobs), teacher_forced(model, p, r.token_ids), atol=1e-4)


def test_a_turn_submitted_as_soon_as_the_last_one_returns_joins_the_next_step():
    """A trajectory that sends its next request the moment its previous one returns is prefilled
    at the very next step: the worker lets the event loop run once before admitting (otherwise one
    decode step of the others runs first, and on the CPU every extra step costs the whole batch)."""
    model = tiny_random_lm()
    seen: list[set[int]] = []

    def watch(requests, generated, logits):  # called once per forward, prefill or decode
        seen.append({id(r) for r in requests})
        return logits

    gen = LocalGenerator(model, pad_id=0, logits_processor=watch)
    ps = prompts(3)
    long, first, second = (GenRequest(p, max_new_tokens=n, sampling=GREEDY) for p, n in zip(ps, (12, 3, 3)))

    async def chain():
        await gen.submit(first)
        return await gen.submit(second)

    async def main():
        return await asyncio.gather(gen.submit(long), chain())

    results = asyncio.run(main())
    last_of_first = max(i for i, s in enumerate(seen) if id(first) in s)
    first_of_second = min(i for i, s in enumerate(seen) if id(second) in s)
    assert first_of_second == last_of_first + 1
    assert results[1].token_ids == reference(model, ps[2], 3)  # and it generates what it would alone


def test_the_decode_cache_doubles_its_columns_when_a_row_needs_more():
    """Growing copies every slot while the batch waits, so it doubles (one growth per doubling of
    the longest context, not one per turn of a multi-turn rollout)."""
    model = tiny_random_lm()
    gen = LocalGenerator(model, pad_id=0)
    asyncio.run(gen.generate([GenRequest(prompts(1)[0], max_new_tokens=2, sampling=GREEDY)]))
    assert gen.loop.cache.columns == 64 and gen.stats["cache_grows"] == 0
    long = [(5 * j) % 250 + 1 for j in range(70)]
    res = asyncio.run(gen.generate([GenRequest(long, max_new_tokens=5, sampling=GREEDY)]))
    assert gen.loop.cache.columns == 128 and gen.stats["cache_grows"] == 1
    assert res[0].token_ids == reference(model, long, 5)
