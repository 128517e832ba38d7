"""The rollout engine over a ServerGenerator whose servers are all down: only the affected
trajectories end `infra_error`, with the reason, and `run()` returns."""

from __future__ import annotations

import asyncio

from rollout_fakes import EOT, CharToolManager, FakeRunner, RowsEnv

from rlfactory.config import RolloutConfig, SamplingConfig
from rlfactory.generation.server_generator import ServerGenerator
from rlfactory.rollout.engine import RolloutEngine
from rlfactory.serve.process import free_port


def dead_url() -> str:
    """A loopback URL where nothing listens (connection refused)."""
    return f"http://127.0.0.1:{free_port()}"


def test_the_engine_ends_only_the_affected_trajectories_infra_error():
    """Every server down: each trajectory ends infra_error with the reason, and run() returns."""
    tm = CharToolManager()
    g = ServerGenerator([dead_url(), dead_url()], "vllm", tm.tok, [EOT], timeout_s=5.0)
    engine = RolloutEngine(g, tm, FakeRunner(), RowsEnv(), RolloutConfig(max_new_tokens=8), SamplingConfig())

    async def main():
        return await engine.run([{"question": "hi"}, {"question": "ho"}], n=2)

    trajs = asyncio.run(closing(g, main()))
    assert [t.status for t in trajs] == ["infra_error"] * 4
    assert all("no generation server could serve this turn" in t.error for t in trajs)
    assert all(t.turns == 0 and not any(t.loss_mask) for t in trajs)


async def closing(g: ServerGenerator, coro):
    try:
        return await coro
    finally:
        await g.aclose()
