"""A rollout worker killed mid-step (SIGKILL on its process): the step still returns every
trajectory, a replacement worker starts, and the run goes on. With ray.shard_retries=0 the dead
worker's trajectories end infra_error; with 1 they are rolled out again on the replacement and
come out the same as an undisturbed rollout (per-trajectory seeds)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from ray_fixtures import gate_config, question_rows

pytestmark = pytest.mark.slow

SEEDS = [101, 202, 303, 404]


async def until(condition, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def run_killing_worker_0(session, gate, rows):
    """Roll out `rows` x2; once every trajectory waits in the gate tool, SIGKILL worker 0, then
    open the gate. Returns (trajectories, the killed pid)."""
    gate.unlink(missing_ok=True)
    pool = session.pools[0]
    before = (await pool.stats.remote())["calls_started"]
    task = asyncio.ensure_future(session.engine.run(rows, 2, policy_version=0, seeds=SEEDS))

    async def all_waiting() -> bool:
        s = await pool.stats.remote()
        return s["calls_started"] - before >= 2 * len(rows) and s["in_flight"] >= 2 * len(rows)

    await until(all_waiting, "every trajectory to call the gate tool")
    victim = session.workers.pids[0]
    os.kill(victim, signal.SIGKILL)
    # Let the driver see the death before the gate opens (worker 1's trajectories wait meanwhile).
    await until(lambda: _replaced(session, victim), "the dead worker to be replaced")
    gate.touch()
    return await task, victim


async def _replaced(session, victim: int) -> bool:
    return session.workers.pids[0] not in (None, victim)


def test_killed_worker_is_replaced_and_its_trajectories_end_infra_error_or_rerun(ray_cluster, tmp_path):
    from rlfactory.distributed import open_ray_rollout

    gate = tmp_path / "gate"
    cfg = gate_config(gate, shard_retries=0)
    rows = question_rows(4)

    async def go():
        async with open_ray_rollout(cfg, logits_processor="ray_fixtures:policy") as session:
            await session.weight_sync.ensure(session.model, 0)

            # shard_retries=0: worker 0's trajectories (rows 0-1) end infra_error, worker 1's are fine.
            trajs, victim = await run_killing_worker_0(session, gate, rows)
            assert [t.id for t in trajs] == [f"r{i}-{k}" for i in range(4) for k in range(2)]
            lost, kept = trajs[:4], trajs[4:]
            assert all(t.status == "infra_error" and "rollout worker 0 died" in t.error for t in lost)
            assert all(t.status == "ok" and t.tool_calls[0].status == "ok" for t in kept)
            assert session.workers.replacements == 1

            # shard_retries=1: the shard is rolled out again on the replacement.
            session.engine.shard_retries = 1
            rerun, victim2 = await run_killing_worker_0(session, gate, rows)
            assert victim2 != victim and session.workers.replacements == 2 and session.engine.reruns == 1
            assert all(t.status == "ok" for t in rerun)

            # An undisturbed rollout with the same seeds: the same trajectories, token for token.
            clean = await session.engine.run(rows, 2, policy_version=0, seeds=SEEDS)
            assert [t.input_ids for t in rerun] == [t.input_ids for t in clean]
            assert [t.sampler_logprobs for t in rerun] == [t.sampler_logprobs for t in clean]
            assert rerun[4].input_ids == kept[0].input_ids  # worker 1 was never disturbed
            assert {t.id: t.tool_calls[0].arguments for t in clean} == {
                f"r{i}-{k}": {"key": f"q{i}"} for i in range(4) for k in range(2)}
            pool = await session.pools[0].stats.remote()
            return [*session.workers.pids, pool["pid"], *pool["servers"].values()]

    pids = asyncio.run(go())
    # Nothing the session started outlives it: workers, the pool actor, the MCP server.
    deadline = time.monotonic() + 60
    while (alive := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False
