"""The bounded admission wait (rlfactory/generation/admission.py): when a small batch is held, for
how long, and that a held LocalGenerator admits every turn within the bound, lets the turns that
arrive meanwhile join the same step, and samples the same greedy tokens as without the wait."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from generation_fakes import prompts, reference, tiny_random_lm

from rlfactory.config import RolloutConfig, SamplingConfig
from rlfactory.generation.admission import AdmissionWait
from rlfactory.generation.local import LocalGenerator
from rlfactory.protocols import GenRequest

GREEDY = SamplingConfig(greedy=True)

pytestmark = pytest.mark.usefixtures("one_thread")


def policy(arrivals: list[float], step_s: float = 0.01, steps: float = 1.0) -> AdmissionWait:
    wait = AdmissionWait(steps)
    wait.stepped(step_s)
    for t in arrivals:
        wait.arrived(t)
    return wait


def test_a_small_batch_is_held_one_bound_when_enough_turns_are_due():
    # 8 arrivals over the last 8 steps (80 ms): 1 expected within one step's bound.
    wait = policy([1.0 - 0.01 * k for k in range(8)])
    assert wait.bound() == pytest.approx(0.01)
    assert wait.wait_s(1.0, batch=2, away=5) == pytest.approx(0.01)  # 1 would grow 2 rows by half
    assert wait.wait_s(1.0, batch=3, away=5) == 0  # ... but not 3 rows


def test_no_hold_without_turns_coming_back():
    recent = [1.0 - 0.01 * k for k in range(8)]
    assert policy(recent).wait_s(1.0, batch=1, away=0) == 0  # nobody between turns: the rollout's end
    assert policy(recent).wait_s(1.0, batch=0, away=5) == 0  # nothing to run: the worker is ending
    assert policy(recent, steps=0).wait_s(1.0, batch=1, away=5) == 0  # turned off
    # Arrivals older than the window (a lock-step turn's burst, while its last rows finish).
    assert policy([0.5] * 200).wait_s(1.0, batch=1, away=200) == 0
    # At most the trajectories away can come back: 4 due, 1 away, 3 rows.
    assert policy([1.0] * 32).wait_s(1.0, batch=3, away=1) == 0
    assert AdmissionWait(1.0).wait_s(1.0, batch=1, away=5) == 0  # no step measured yet: no bound


def test_the_bound_follows_the_decode_steps_time():
    wait = policy([], step_s=0.02, steps=2.0)
    assert wait.bound() == pytest.approx(0.04)
    for _ in range(40):
        wait.stepped(0.004)
    assert wait.bound() == pytest.approx(0.008, rel=1e-3)
    with pytest.raises(ValueError, match="admission wait"):
        AdmissionWait(-1)
    with pytest.raises(ValueError, match="rollout.admission_wait must be >= 0"):
        RolloutConfig(admission_wait=-0.5)


def test_arrivals_are_kept_only_as_far_back_as_the_window():
    """A long-lived generator (`rlfactory serve`) sees turns for days: only the window's are kept,
    also when no step is ever held (turned off: none at all)."""
    wait = policy([])
    for k in range(100_000):
        wait.arrived(k * 0.001)  # 1000 per second over 100 s; the window is 8 steps of 10 ms
    assert len(wait._arrivals) <= 81
    off = AdmissionWait(0)
    off.arrived(1.0)
    assert len(off._arrivals) == 0


class Held(AdmissionWait):
    """Holds every step while trajectories are away, for a fixed bound (the real policy's decision
    is tested above; this tests how the generator holds)."""

    def __init__(self, bound_s: float) -> None:
        super().__init__(1.0)
        self.bound_s = bound_s

    def wait_s(self, now: float, batch: int, away: int) -> float:
        return self.bound_s if away > 0 and batch > 0 else 0.0


async def first_turns(gen: LocalGenerator, ps: list[list[int]]) -> list[list[int]]:
    """Every prompt's first turn with a session (its cache kept: the trajectory is away after it)."""
    res = await gen.generate([GenRequest(p, max_new_tokens=2, sampling=GREEDY, session=f"s{i}") for i, p in enumerate(ps)])
    return [p + r.token_ids + [200 + i, 201] for i, (p, r) in enumerate(zip(ps, res))]


def test_a_held_turn_is_admitted_within_the_bound_when_nobody_comes():
    """One trajectory comes back; the 5 others stay away: its turn waits the bound once, then runs,
    and each of its decode steps waits at most the bound too."""
    model = tiny_random_lm()
    gen = LocalGenerator(model, pad_id=0)
    gen.admission = Held(0.05)

    async def main():
        contexts = await first_turns(gen, prompts(6))
        t0 = time.perf_counter()
        res = await gen.submit(GenRequest(contexts[0], max_new_tokens=3, sampling=GREEDY, session="s0"))
        return contexts[0], res, time.perf_counter() - t0

    context, res, wall = asyncio.run(main())
    assert 0.04 <= res.queue_s <= 0.05 + 0.25  # held, and let go at the bound (asyncio timers never fire early)
    waits = gen.stats["admission_waits"]
    assert waits == 2 and gen.stats["admission_wait_s"] <= waits * (0.05 + 0.25)  # 2 steps: prefill+decode, decode
    assert res.token_ids == reference(model, context, 3)


def test_turns_arriving_during_the_hold_join_the_same_step_with_the_same_tokens():
    """A turn is held; another trajectory's turn arrives 20 ms later: the batch has doubled, so the
    hold ends there and both prefill in one forward. Greedy tokens and logprobs are those of a
    generator that never holds."""
    model = tiny_random_lm()

    async def run(gen: LocalGenerator):
        contexts = await first_turns(gen, prompts(6))
        before = gen.stats["prefills"]
        reqs = [GenRequest(contexts[i], max_new_tokens=4, sampling=GREEDY, session=f"s{i}") for i in (1, 2)]

        async def later():
            await asyncio.sleep(0.02)
            return await gen.submit(reqs[1])

        res = await asyncio.gather(gen.submit(reqs[0]), later())
        return [contexts[1], contexts[2]], res, gen.stats["prefills"] - before

    held = LocalGenerator(model, pad_id=0)
    held.admission = Held(2.0)
    contexts, res, prefills = asyncio.run(run(held))
    assert prefills == 1  # both turns in one prefill
    assert 0.015 <= res[0].queue_s < 1.0  # waited for the second, not for the 2 s bound
    plain = LocalGenerator(model, pad_id=0, admission_wait=0)
    _, base, base_prefills = asyncio.run(run(plain))
    assert base_prefills == 2 and plain.stats["admission_waits"] == 0
    for c, r, b in zip(contexts, res, base):
        assert r.token_ids == b.token_ids == reference(model, c, 4)
        assert torch.allclose(torch.tensor(r.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_the_real_policy_holds_a_lone_turn_in_a_stream_of_arrivals():
    """The generator as built, no fake: 24 trajectories come back one every 2 ms while few rows
    run, so it may hold steps (how many depends on the machine's speed): the greedy tokens are
    those of `generate` one at a time whatever it held."""
    model = tiny_random_lm()
    gen = LocalGenerator(model, pad_id=0, admission_wait=2.0)
    ps = prompts(24)

    async def main():
        contexts = await first_turns(gen, ps)
        reqs = [GenRequest(c, max_new_tokens=3, sampling=GREEDY, session=f"s{i}") for i, c in enumerate(contexts)]

        async def one(i: int):
            await asyncio.sleep(0.002 * i)
            return await gen.submit(reqs[i])

        return contexts, await asyncio.gather(*(one(i) for i in range(len(reqs))))

    contexts, res = asyncio.run(main())
    for c, r in zip(contexts, res):
        assert r.token_ids == reference(model, c, 3)
