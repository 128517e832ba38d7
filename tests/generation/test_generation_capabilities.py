"""What a generator offers besides `submit`/`generate` is declared by the Protocols of
rlfactory.protocols and checked with isinstance (not getattr probes): the real backends satisfy
the ones they implement, the versioned gate passes them on, and a bare generator satisfies none,
so the callers skip what it does not offer."""

from __future__ import annotations

import asyncio

import torch
from generation_fakes import CodepointTokenizer, tiny_random_lm

from rlfactory.generation.local import LocalGenerator
from rlfactory.generation.server_generator import ServerGenerator
from rlfactory.generation.versioned import VersionedGenerator
from rlfactory.protocols import (Closeable, FreesCache, GenRequest, GenResult, HasTokenizer, KeepsSessions,
                                 Reseedable)
from rlfactory.train.step import reseed_generation

CAPABILITIES = (KeepsSessions, Reseedable, FreesCache, HasTokenizer, Closeable)


def offers(generator) -> set[str]:
    return {p.__name__ for p in CAPABILITIES if isinstance(generator, p)}


class BareGenerator:
    """Only the Generator contract: no sessions, no RNG of its own, no tokenizer."""

    async def submit(self, request: GenRequest) -> GenResult:
        return GenResult(token_ids=[1], logprobs=[0.0], finish_reason="length")

    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        return [await self.submit(r) for r in requests]


def test_the_backends_declare_what_they_offer():
    tok = CodepointTokenizer()
    local = LocalGenerator(tiny_random_lm(), pad_id=0, tokenizer=tok)
    server = ServerGenerator(["http://127.0.0.1:9"], "vllm", tok, [0])
    try:
        assert offers(local) == {"KeepsSessions", "Reseedable", "FreesCache", "HasTokenizer", "Closeable"}
        assert offers(server) == {"KeepsSessions", "Reseedable", "HasTokenizer"}
        assert offers(BareGenerator()) == set()
    finally:
        local.close()
        asyncio.run(server.aclose())


def test_the_versioned_gate_passes_on_what_its_generator_offers():
    local = LocalGenerator(tiny_random_lm(), pad_id=0, tokenizer=CodepointTokenizer(), seed=1)
    gate = VersionedGenerator(local)
    try:
        assert gate.tokenizer is local.tokenizer
        gate.reseed(7)
        assert torch.equal(local.rng.get_state(), torch.Generator().manual_seed(7).get_state())
        local.loop.kept.sessions["s"] = ([1], [])
        gate.forget("s")
        assert local.kept_sessions == 0
    finally:
        local.close()


def test_a_bare_generator_is_skipped_not_probed():
    bare = BareGenerator()
    gate = VersionedGenerator(bare)
    assert gate.tokenizer is None
    gate.forget("s")  # nothing kept, nothing to drop
    gate.reseed(3)
    reseed_generation(bare, 3)  # no draws of its own to seed
    assert asyncio.run(gate.submit(GenRequest([1], 1))).policy_version == 0
