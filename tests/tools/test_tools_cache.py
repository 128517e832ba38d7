"""Result cache: LRU in memory, sqlite on disk across restarts, TTL, per-tool off switch."""

import asyncio

from conftest import server

from rlfactory.config import ToolOptions, ToolsConfig
from rlfactory.tools import ResultCache, ToolCall, ToolResult, ToolRunner
from rlfactory.tools.cache import canonical_arguments


def counted():
    calls = {"n": 0}

    def lookup(key: str, page: int = 1) -> str:
        """Deterministic lookup.

        Args:
            key: What to look up.
            page: Which page.
        """
        calls["n"] += 1
        return f"{key}:{page}"

    def roll() -> str:
        """Non-deterministic."""
        calls["n"] += 1
        return f"roll {calls['n']}"

    def fail(x: int) -> str:
        """Always an error."""
        calls["n"] += 1
        raise ValueError("nope")

    return calls, [lookup, roll, fail]


def test_hits_are_marked_and_skip_the_tool():
    calls, tools = counted()
    cfg = ToolsConfig(cache=True, per_tool={"roll": ToolOptions(cache=False)})

    async def main():
        r = ToolRunner(tools, cfg)
        a = await r.call(ToolCall("lookup", {"key": "k", "page": 2}))
        b = await r.call(ToolCall("lookup", {"page": 2, "key": "k"}))  # same call, keys in another order
        assert (a.cached, b.cached) == (False, True) and a.text == b.text == "k:2" and calls["n"] == 1
        c = await r.call(ToolCall("lookup", {"key": "k"}))
        assert not c.cached and calls["n"] == 2
        r1, r2 = await r.call(ToolCall("roll")), await r.call(ToolCall("roll"))
        assert r1.text != r2.text and not r2.cached  # cache off for this tool
        e1, e2 = await r.call(ToolCall("fail", {"x": 1})), await r.call(ToolCall("fail", {"x": 1}))
        assert e1.is_error and e2.is_error and not e2.cached  # errors are never cached
        assert r.metrics()["lookup"].cache_hits == 1 and r.metrics()["lookup"].calls == 3

    asyncio.run(main())


def test_disk_cache_survives_a_restart_and_honours_ttl(tmp_path):
    calls, tools = counted()
    path = str(tmp_path / "cache" / "tools.sqlite")

    async def run_once(ttl=None):
        r = ToolRunner(tools, ToolsConfig(cache=True, cache_path=path, cache_ttl_s=ttl))
        res = await r.call(ToolCall("lookup", {"key": "disk"}))
        await r.aclose()
        return res

    first = asyncio.run(run_once())
    second = asyncio.run(run_once())  # a new runner (and cache object): served from sqlite
    assert not first.cached and second.cached and second.text == "disk:1" and calls["n"] == 1

    now = [1000.0]  # a clock of our own: expiry does not depend on how busy the machine is
    cache = ResultCache(path=path, ttl_s=0.05, clock=lambda: now[0])
    cache.put("t", "{}", ToolResult(text="soon stale"))
    now[0] += 0.04
    assert cache.get("t", "{}").text == "soon stale"
    now[0] += 0.02
    assert cache.get("t", "{}") is None
    cache.close()
    reopened = ResultCache(path=path, clock=lambda: now[0])
    assert reopened.get("t", "{}") is None  # expired on disk too
    reopened.close()
    fresh = ResultCache(path=path, ttl_s=0.05, clock=lambda: now[0])
    fresh.put("t", "{}", ToolResult(text="kept"))
    fresh.close()
    reopened = ResultCache(path=path, clock=lambda: now[0] + 0.04)
    assert reopened.get("t", "{}").text == "kept"  # on disk, not yet expired
    reopened.close()


def test_lru_evicts_the_least_recently_used():
    cache = ResultCache(max_entries=2)
    for k in "abc":
        cache.put("t", k, ToolResult(text=k))
        if k == "b":
            cache.get("t", "a")  # touch a: b becomes the oldest
    assert cache.get("t", "b") is None and cache.get("t", "a").text == "a" and cache.get("t", "c").text == "c"
    assert canonical_arguments({"b": 1, "a": [1, {"y": 2, "x": 1}]}) == '{"a":[1,{"x":1,"y":2}],"b":1}'


def test_mcp_results_are_cached_per_server_and_per_tool_setting():
    # the global switch is off; the server turns caching on, one of its tools turns it off again
    mcp = {"mcpServers": {"calc": server("calculator", cache=True)}}
    cfg = ToolsConfig(cache=False, per_tool={"multiply": ToolOptions(cache=False)})

    async def main():
        async with ToolRunner(config=cfg, mcp=mcp) as r:
            a = await r.call(ToolCall("add", {"a": 1, "b": 2}))
            b = await r.call(ToolCall("add", {"a": 1, "b": 2}))
            assert (a.cached, b.cached, b.text) == (False, True, "3.0")
            m1 = await r.call(ToolCall("multiply", {"a": 2, "b": 3}))
            m2 = await r.call(ToolCall("multiply", {"a": 2, "b": 3}))
            assert not m1.cached and not m2.cached and m2.text == "6.0"

    asyncio.run(main())
