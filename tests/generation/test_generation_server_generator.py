"""ServerGenerator against real HTTP servers that answer with vLLM's and SGLang's documented
bodies (fixtures/) or fail: sticky routing, least-loaded placement, retry elsewhere with a
cool-down, a clear GenerationUnavailable when no server is left (the engine then ends just those
trajectories `infra_error`: tests/rollout/test_rollout_server_infra_error.py), and the weight-sync gate that keeps a turn on one set of weights."""

from __future__ import annotations

import asyncio
import time

import pytest
from fixture_server import FixtureServer, dead_url, fixture_response

from rlfactory.config import SamplingConfig
from rlfactory.protocols import GenerationUnavailable, GenRequest
from rlfactory.generation.server_generator import ServerGenerator

IM_END = 151645
VLLM_STOP = fixture_response("vllm_completions_stop_token.json")
SGLANG_LEN = fixture_response("sglang_generate_length.json")


class IdsTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return " ".join(str(i) for i in ids)


def gen(urls, api="vllm", **kw) -> ServerGenerator:
    kw.setdefault("timeout_s", 5.0)
    return ServerGenerator(urls, api, IdsTokenizer(), [IM_END], **kw)


def req(session=None, n=4) -> GenRequest:
    return GenRequest([1, 2, 3], n, SamplingConfig(), session=session)


async def use(g: ServerGenerator, coro):
    try:
        return await coro
    finally:
        await g.aclose()


def test_vllm_turn_over_http_is_the_fixture_and_the_body_is_the_documented_request():
    with FixtureServer(VLLM_STOP) as srv:
        g = gen([srv.url], served_model="Qwen/Qwen2.5-1.5B-Instruct", seed=5)
        res = asyncio.run(use(g, g.submit(req("traj-a"))))
    assert res.token_ids == [19, 17, IM_END] and res.stop_token == IM_END and res.finish_reason == "stop"
    assert res.logprobs == VLLM_STOP["choices"][0]["logprobs"]["token_logprobs"]
    assert res.text == "19 17 151645" and res.policy_version == 0  # vLLM reports none: the recorded version
    path, body = srv.requests[0]
    assert path == "/v1/completions" and body["prompt"] == [1, 2, 3] and body["max_tokens"] == 4
    assert body["return_token_ids"] is True and body["logprobs"] == 0 and body["stop_token_ids"] == [IM_END]
    assert body["seed"] == 5 and body["session_id"] == "traj-a" and body["model"] == "Qwen/Qwen2.5-1.5B-Instruct"


def test_sglang_turn_carries_the_weight_version_the_server_reports():
    with FixtureServer(SGLANG_LEN) as srv:
        g = gen([srv.url], api="sglang")
        res = asyncio.run(use(g, g.submit(req("traj-a"))))
    assert res.token_ids == [40, 1184, 311, 11047] and res.finish_reason == "length" and res.policy_version == 7
    path, body = srv.requests[0]
    assert path == "/generate" and body["input_ids"] == [1, 2, 3] and body["return_logprob"] is True
    assert "session_id" not in body  # a real SGLang server is not sent rlfactory's field


def test_a_trajectory_sticks_to_its_server_and_new_ones_go_to_the_least_loaded():
    with FixtureServer(VLLM_STOP) as a, FixtureServer(VLLM_STOP) as b:
        g = gen([a.url, b.url])

        async def main():
            await g.submit(req("t1"))  # both idle: the first server
            await g.submit(req("t2"))  # the other one now has served fewer
            for _ in range(3):
                await g.submit(req("t1"))
            await g.submit(req("t2"))
            g.forget("t1")
            return [s.pinned for s in g.servers]

        pinned = asyncio.run(use(g, main()))
    assert len(a.requests) == 4 and len(b.requests) == 2  # t1's four turns on a, t2's two on b
    assert {body["session_id"] for _, body in a.requests} == {"t1"}
    assert pinned == [0, 1]


def test_concurrent_new_trajectories_spread_over_the_servers():
    with FixtureServer(VLLM_STOP, delay_s=0.2) as a, FixtureServer(VLLM_STOP, delay_s=0.2) as b:
        g = gen([a.url, b.url])

        async def main():
            return await asyncio.gather(*(g.submit(req(f"t{i}")) for i in range(6)))

        asyncio.run(use(g, main()))
    assert len(a.requests) == 3 and len(b.requests) == 3  # by requests in flight


@pytest.mark.parametrize("mode", ["500", "garbage", "malformed", "down", "deep", "negative_id"])
def test_a_failing_server_is_retried_elsewhere_and_cooled_down(mode):
    with FixtureServer(VLLM_STOP, mode="ok" if mode == "down" else mode) as bad, FixtureServer(VLLM_STOP) as good:
        bad_url = dead_url() if mode == "down" else bad.url
        g = gen([bad_url, good.url], cooldown_s=60.0)

        async def main():
            first = await g.submit(req("t1"))  # tries the first server, fails, goes to the other one
            second = await g.submit(req("t2"))  # the failed server is cooling down: not tried
            return first, second, g.servers[0]

        first, second, state = asyncio.run(use(g, main()))
    assert first.token_ids == second.token_ids == [19, 17, IM_END]
    assert len(good.requests) == 2 and len(bad.requests) == (0 if mode == "down" else 1)
    assert state.failures == 1 and state.down_until > time.monotonic()
    expected = {"500": "HTTP 500", "garbage": "not JSON", "malformed": "return_token_ids", "down": "ConnectError",
                "deep": "not JSON", "negative_id": "is not a list of token ids"}[mode]
    assert expected in state.last_error


def test_bytes_that_are_not_utf8_in_a_servers_text_do_not_fail_the_turn():
    with FixtureServer(VLLM_STOP, mode="bad_utf8") as srv:
        g = gen([srv.url])
        res = asyncio.run(use(g, g.submit(req("t1"))))
    assert res.token_ids == [19, 17, IM_END] and g.servers[0].failures == 0  # the ids are what count


def test_a_server_that_times_out_is_retried_elsewhere():
    with FixtureServer(VLLM_STOP, mode="slow") as slow, FixtureServer(VLLM_STOP) as good:
        g = gen([slow.url, good.url], timeout_s=2.0)
        res = asyncio.run(use(g, g.submit(req("t1"))))
    assert res.token_ids == [19, 17, IM_END] and "timed out after 2 s" in g.servers[0].last_error


def test_a_server_is_tried_again_after_its_cooldown():
    with FixtureServer(VLLM_STOP, mode="500") as flaky, FixtureServer(VLLM_STOP) as good:
        g = gen([flaky.url, good.url], cooldown_s=0.2)

        async def main():
            await g.submit(req("t1"))
            flaky.mode = "ok"
            await asyncio.sleep(0.3)
            g.servers[1].served += 10  # make the recovered server the less loaded one
            return await g.submit(req("t2"))

        asyncio.run(use(g, main()))
    assert len(flaky.requests) == 2  # the failed turn, then t2 after the cool-down


def test_when_every_server_is_down_the_turn_raises_a_clear_error():
    with FixtureServer(VLLM_STOP, mode="500") as bad:
        urls = [dead_url(), bad.url]
        g = gen(urls)

        async def main():
            with pytest.raises(GenerationUnavailable) as first:
                await g.submit(req("t1"))
            with pytest.raises(GenerationUnavailable) as again:  # both cooling down: fails at once
                await g.submit(req("t2"))
            return str(first.value), str(again.value)

        first, again = asyncio.run(use(g, main()))
    assert first.startswith("no generation server could serve this turn")
    assert f"{urls[0]}: ConnectError" in first and f"{urls[1]}: HTTP 500" in first
    assert "down for" in again and len(bad.requests) == 1


def test_a_refused_request_is_not_retried_and_the_server_stays_up():
    with FixtureServer(VLLM_STOP, mode="reject") as picky, FixtureServer(VLLM_STOP) as other:
        g = gen([picky.url, other.url])

        async def main():
            with pytest.raises(GenerationUnavailable, match="refused the request: HTTP 400.*maximum context length"):
                await g.submit(req("t1"))

        asyncio.run(use(g, main()))
    assert len(other.requests) == 0 and g.servers[0].failures == 0 and g.servers[0].down_until == 0


async def until(condition, what: str, timeout_s: float = 30.0) -> None:
    """Wait for `condition()` to hold (a state the code reaches, not a duration)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"never reached: {what}"
        await asyncio.sleep(0.01)


def test_hold_waits_for_turns_in_flight_and_later_turns_get_the_new_version():
    """The weight-sync gate: a turn in flight finishes on the old version; a turn submitted during
    the update waits at the gate (nothing is sent) and is served with the new version."""
    with FixtureServer(VLLM_STOP, delay_s=0.3) as srv:
        g = gen([srv.url])
        server = g.servers[0]

        async def main():
            before = asyncio.ensure_future(g.submit(req("t1")))
            await until(lambda: server.inflight == 1, "t1 sent")
            await g.hold(server)
            held_after_t1 = before.done()
            during = asyncio.ensure_future(g.submit(req("t2")))
            await until(lambda: server.assigned == 1, "t2 picked its server")
            waiting = (server.inflight, len(srv.requests), during.done())
            g.release(server, 3)
            return held_after_t1, waiting, await before, await during

        held_after_t1, waiting, old, new = asyncio.run(use(g, main()))
    assert held_after_t1 and waiting == (0, 1, False)
    assert old.policy_version == 0 and new.policy_version == 3


def test_a_server_whose_sync_failed_gets_no_turns_until_one_succeeds():
    with FixtureServer(VLLM_STOP) as a, FixtureServer(VLLM_STOP) as b:
        g = gen([a.url, b.url])

        async def main():
            g.release(g.servers[0], None)  # a's sync failed
            for i in range(3):
                await g.submit(req(f"t{i}"))
            g.release(g.servers[0], 1)
            g.servers[1].served += 10
            return await g.submit(req("t9"))

        res = asyncio.run(use(g, main()))
    assert len(a.requests) == 1 and len(b.requests) == 3 and res.policy_version == 1


async def sent_so_far(server, srv) -> tuple[int, int]:
    """(turns in flight at `server`, requests `srv` received) once every task that is ready has
    run: yields to the event loop, no waiting on a clock."""
    for _ in range(20):
        await asyncio.sleep(0)
    return server.inflight, len(srv.requests)


def test_a_turn_woken_by_one_release_waits_for_an_update_that_began_before_it_ran():
    """Back-to-back updates (asynchronous training pushes while turns wait at the gate): a turn
    woken by the first release but not yet run when the second hold closes the gate again must
    not be sent during the second update, and is served with the version after it."""
    with FixtureServer(VLLM_STOP) as srv:
        g = gen([srv.url])
        server = g.servers[0]

        async def main():
            await g.submit(req("t0"))  # the server is probed and known
            await g.hold(server)  # update to version 1
            waiting = asyncio.ensure_future(g.submit(req("t1")))
            await until(lambda: server.assigned == 1, "t1 waits at the gate")
            g.release(server, 1)
            await g.hold(server)  # update to version 2 begins before t1 has run
            sent_during_update = await sent_so_far(server, srv)
            g.release(server, 2)
            return sent_during_update, await waiting

        sent_during_update, res = asyncio.run(use(g, main()))
    assert sent_during_update == (0, 1) and res.policy_version == 2


def test_a_turn_that_probes_its_server_is_not_sent_during_an_update_that_began_meanwhile():
    """A server's first turn probes it (`/health`) first; an update that holds the server during
    that probe finds nothing in flight, so the turn must wait for its release."""
    with FixtureServer(VLLM_STOP) as srv:
        g = gen([srv.url])
        server = g.servers[0]

        async def main():
            turn = asyncio.ensure_future(g.submit(req("t1")))
            await until(lambda: server.assigned == 1, "t1 picked its server")
            await g.hold(server)  # nothing in flight yet: the update begins
            await until(lambda: server.kind is not None, "the probe answered")
            sent_during_update = await sent_so_far(server, srv)
            g.release(server, 1)
            return sent_during_update, await turn

        sent_during_update, res = asyncio.run(use(g, main()))
    assert sent_during_update == (0, 0) and res.policy_version == 1
