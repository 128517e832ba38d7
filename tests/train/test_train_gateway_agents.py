"""Agents per dataset row through the recording gateway (rlfactory/train/gateway_agents.py), on
tiny:1m (ScriptedPolicy writes their tool calls). AgentEngine: the OpenAI Agents SDK's runner runs
unchanged; a history the agent rewrites gives a second sample sharing the reward; crashing, hanging
and wrong agents are infra_error trajectories while the others score; a sync agent runs in a worker
thread. GRPO on gateway episodes: `rlfactory train`'s function with `env.name: agent` runs the
OpenAI SDK agent (examples/gateway/openai_agent.py, unchanged) per row x group through an
in-process gateway (the answer has sampled tokens in it, which the reward reads) and trains:
losses finite, weights changed, trajectories logged with their episode."""

from __future__ import annotations

import asyncio
import functools
import json
import math

import pytest
import torch
import yaml
from gateway_fixtures import EXAMPLES, add_plan, serving
from openai import AsyncOpenAI
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlfactory.config import RunConfig, load_config
from rlfactory.rollout.scripted import ScriptedPolicy
from rlfactory.tiny import resolve_model
from rlfactory.train.checkpoint import latest_checkpoint
from rlfactory.train.gateway_agents import AgentEngine, open_agent_rollout
from rlfactory.train.run import train

pytestmark = pytest.mark.usefixtures("one_thread")


def spread_reward(row, answer) -> float:
    """Correct answers score 1 plus a share that depends on the sampled tokens (GRPO needs spread)."""
    return float(str(row["answer"]) in answer) + (sum(map(ord, answer)) % 7) / 7


def test_grpo_trains_on_gateway_episodes(tmp_path):
    rows = [json.loads(line) for line in (EXAMPLES / "rows.jsonl").read_text().splitlines()[:4]]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg_path = tmp_path / "train.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "model": {"path": "tiny:1m"},
        "env": {"name": "agent", "train_data": "rows.jsonl",
                "options": {"agent": "openai_agent:agent", "reward": "test_train_gateway_agents:spread_reward",
                            "timeout_s": 60}},
        "rollout": {"max_new_tokens": 48, "max_total_tokens": 1024},
        "algo": {"group_size": 2},
        "trainer": {"steps": 2, "prompts_per_step": 2, "lr": 1e-3, "run_dir": str(tmp_path / "run"), "save_every": 1,
                    "progress": False},
    }))
    cfg = load_config(RunConfig, cfg_path)
    path = resolve_model("tiny:1m")
    tok = AutoTokenizer.from_pretrained(path)
    policy = ScriptedPolicy(tok, add_plan(free_answer=3), tok.convert_tokens_to_ids("<|im_end|>"))
    history = asyncio.run(train(cfg, open_session=functools.partial(open_agent_rollout, logits_processor=policy)))

    assert len(history) == 2
    for m in history:
        assert math.isfinite(m["loss/policy"]) and m["batch/kept"] == 4
    initial = AutoModelForCausalLM.from_pretrained(path)
    trained = AutoModelForCausalLM.from_pretrained(latest_checkpoint(tmp_path / "run") / "model")
    changed = [n for (n, p), q in zip(initial.named_parameters(), trained.parameters()) if not torch.equal(p, q)]
    assert changed
    step_file = tmp_path / "run" / "trajectories" / "step_000001.jsonl"
    logged = [json.loads(line) for line in step_file.read_text().splitlines()]
    assert len(logged) == 4 and all(t["info"]["samples"] == 1 and t["status"] == "ok" for t in logged)
    assert all([s["role"] for s in t["segments"]] == ["prompt", "model", "observation", "model"] for t in logged)
    assert all(t["advantage"] is not None for t in logged)
    for t in logged:  # each answered with the tool's result, after its sampled tokens
        assert t["segments"][-1]["text"].endswith(f"The answer is {t['info']['answer']}.<|im_end|>")


def test_the_readme_command_trains_the_example_agent(tmp_path, capsys):
    """`rlfactory train examples/gateway/train.yaml` (one small step): the untrained model writes no
    tool call, the agent answers with whatever it wrote, the run finishes and logs its episodes."""
    from rlfactory.cli.main import main

    run = tmp_path / "run"
    assert main(["train", str(EXAMPLES / "train.yaml"), f"trainer.run_dir={run}", "trainer.steps=1",
                 "trainer.prompts_per_step=1", "algo.group_size=2", "rollout.max_new_tokens=8",
                 "trainer.progress=false"]) == 0
    logged = [json.loads(line) for line in (run / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
    assert len(logged) == 2 and all(t["info"]["episode"] and t["status"] == "ok" for t in logged)
    assert json.loads((run / "run_state.json").read_text())["state"] == "finished"


def test_commands_that_cannot_run_an_agent_say_so_in_one_line(tmp_path, capsys):
    from rlfactory.cli.main import main

    assert main(["rollout", str(EXAMPLES / "train.yaml"), "--out", str(tmp_path / "r.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "env.name: agent runs a user's agent through the gateway" in err[0], err


def test_agents_sdk_agent_runs_unchanged(tiny):
    pytest.importorskip("agents")
    import agents_sdk_agent

    model, tok = tiny

    async def main():
        async with serving(model, tok) as gw:
            engine = AgentEngine(gw, agents_sdk_agent.agent, agents_sdk_agent.reward, timeout_s=60)
            return await engine.run([{"id": "a", "question": "Add 2 and 5.", "answer": 7},
                                     {"id": "b", "question": "Add 10 and 1.", "answer": 11}], n=2)

    trajs = asyncio.run(main())
    assert [t.id for t in trajs] == ["a-0", "a-1", "b-0", "b-1"]
    for t in trajs:
        assert t.status == "ok" and t.reward == 1.0, (t.error, t.completion_text())
        assert t.info["samples"] == 1 and [s.role for s in t.segments] == ["prompt", "model", "observation", "model"]
        assert "You add numbers with the add tool." in t.segments[0].text  # the SDK's instructions
        assert t.tool_calls[0].name == "add"


async def summarising_agent(row, client):
    """Drops its history after the first tool call and goes on from a summary (as context
    managers do)."""
    oa = AsyncOpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0)
    import openai_agent

    messages = [{"role": "user", "content": row["question"]}]
    reply = await oa.chat.completions.create(model=client.model, messages=messages, tools=openai_agent.TOOLS)
    first = reply.choices[0]
    args = json.loads(first.message.tool_calls[0].function.arguments)
    summary = [{"role": "user", "content": f"{row['question']} Summary: add gave {openai_agent.add(**args)}."}]
    final = await oa.chat.completions.create(model=client.model, messages=summary, tools=openai_agent.TOOLS)
    return float(str(row["answer"]) in final.choices[0].message.content)


def test_an_agent_that_drops_history_gives_two_samples_sharing_the_reward(tiny):
    model, tok = tiny

    async def main():
        async with serving(model, tok) as gw:
            row = {"id": "s", "question": "Add 1 and 2.", "answer": 3}
            return await AgentEngine(gw, summarising_agent).run([row], 1)

    a, b = asyncio.run(main())
    assert (a.id, b.id) == ("s-0", "s-0.1") and a.reward == b.reward == 1.0 and a.status == b.status == "ok"
    assert a.info["samples"] == b.info["samples"] == 2 and a.info["episode"] == b.info["episode"]
    branch = b.info["branch"]
    assert branch["from_sample"] == 0 and "history rewritten" in branch["reason"]
    assert a.input_ids[: branch["first_diff"]] == b.input_ids[: branch["first_diff"]]
    assert a.input_ids[branch["first_diff"]] != b.input_ids[branch["first_diff"]]
    assert [s.role for s in b.segments] == ["prompt", "model"] and b.segments[1].text == "The answer is 3.<|im_end|>"


async def crashing_agent(row, client):
    raise RuntimeError("the agent broke")


async def hanging_agent(row, client):
    await asyncio.sleep(3600)


def test_crashing_hanging_and_wrong_agents_are_infra_errors_and_the_others_score(tiny):
    import openai_agent

    model, tok = tiny

    async def agent(row, client):
        return await {"crash": crashing_agent, "hang": hanging_agent, "ok": openai_agent.agent,
                      "text": openai_agent.agent}[row["kind"]](row, client)

    def score(row, answer):
        return answer if row["kind"] == "text" else openai_agent.reward(row, answer)

    rows = [{"id": k, "kind": k, "question": "Add 1 and 1.", "answer": 2} for k in ("crash", "hang", "ok", "text")]

    async def main():
        async with serving(model, tok) as gw:
            trajs = await AgentEngine(gw, agent, score, timeout_s=3.0).run(rows, 1)
            return trajs, dict(gw.episodes)

    trajs, left_open = asyncio.run(main())
    by = {t.group: t for t in trajs}
    assert by["crash"].status == "infra_error" and "RuntimeError: the agent broke" in by["crash"].error
    assert by["hang"].status == "infra_error" and "did not finish within 3 s" in by["hang"].error
    assert by["text"].status == "infra_error" and "not a finite number" in by["text"].error
    assert by["ok"].status == "ok" and by["ok"].reward == 1.0
    assert all(t.reward is None for t in trajs if t.status == "infra_error")
    assert left_open == {}  # every episode was closed, its key refused from then on


def sync_agent(row, client):
    """A plain synchronous OpenAI SDK agent (run in a worker thread by the engine)."""
    import openai_agent

    oa = client.openai_sync(max_retries=0)
    messages = [{"role": "user", "content": row["question"]}]
    for _ in range(4):
        message = oa.chat.completions.create(model=client.model, messages=messages,
                                             tools=openai_agent.TOOLS).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return float(str(row["answer"]) in message.content)
        for call in message.tool_calls:
            result = openai_agent.add(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    return 0.0


def test_a_sync_agent_runs_in_a_worker_thread(tiny):
    model, tok = tiny
    rows = [{"id": "x", "question": "Add 4 and 4.", "answer": 8}]

    async def main():
        async with serving(model, tok) as gw:
            return await AgentEngine(gw, sync_agent).run(rows, 2, seeds=[7])

    a, b = asyncio.run(main())
    assert (a.id, b.id) == ("x-0", "x-1") and a.reward == b.reward == 1.0 and a.turns == b.turns == 2


def test_each_episode_has_its_own_connection_pool_closed_when_it_ends(tiny):
    """Over TCP (in_process=False): one pool shared by all episodes made httpcore match every call against every connection
    (~1 ms of event-loop CPU per call at 32 episodes, benchmarks/gateway.py); a pool per episode
    must still be closed by the engine even when the agent never closes its client."""
    import openai_agent

    model, tok = tiny
    seen = {}

    async def agent(row, client):
        oa = client.openai(max_retries=0)  # never closed by this agent
        answer, _ = await openai_agent.run_agent(oa, client.model, row["question"])
        seen[row["id"]] = (client.transport, len(client.transport._pool.connections))  # httpcore's pool
        return openai_agent.reward(row, answer)

    rows = [{"id": f"r{i}", "question": f"Add {i} and 1.", "answer": i + 1} for i in range(3)]

    async def main():
        async with serving(model, tok) as gw:
            return await AgentEngine(gw, agent, in_process=False).run(rows, 1)

    trajs = asyncio.run(main())
    assert [t.reward for t in trajs] == [1.0, 1.0, 1.0]
    pools = [pool for pool, _ in seen.values()]
    assert len({id(p) for p in pools}) == 3 and all(open_ == 1 for _, open_ in seen.values())
    assert all(p._pool.connections == [] for p in pools)  # closed with their episodes


def test_tcp_episodes_load_no_ca_bundle(tiny, monkeypatch):
    """The gateway serves plain HTTP: the engine's pools get an SSL context without the CA bundle
    (loading it cost ~32 ms of the event loop's CPU per engine), one that would refuse any certificate."""
    import ssl

    import openai_agent

    model, tok = tiny
    loads = []
    for name in ("load_verify_locations", "load_default_certs"):
        original = getattr(ssl.SSLContext, name)
        monkeypatch.setattr(ssl.SSLContext, name, lambda self, *a, _o=original, _n=name, **k: (loads.append(_n), _o(self, *a, **k))[1])
    rows = [{"id": f"r{i}", "question": f"Add {i} and 2.", "answer": i + 2} for i in range(2)]

    async def main():
        async with serving(model, tok) as gw:
            engine = AgentEngine(gw, openai_agent.agent, openai_agent.reward, in_process=False)
            return engine, await engine.run(rows, 1)

    engine, trajs = asyncio.run(main())
    assert [t.reward for t in trajs] == [1.0, 1.0] and loads == []
    assert engine._ssl.verify_mode == ssl.CERT_REQUIRED and engine._ssl.cert_store_stats()["x509_ca"] == 0


def test_in_process_agents_reach_the_gateway_without_a_socket_and_record_the_template_ids(tiny):
    """client.openai() calls the gateway's app in process (no HTTP stack on either end); the
    recorded ids are still what the chat template renders for the conversation the agent sent."""
    import httpx
    import openai_agent
    from gateway_fixtures import tool_manager

    from rlfactory.serve.gateway_api import parse_chat

    model, tok = tiny
    sent = {}

    async def agent(row, client):
        async with client.openai(max_retries=0) as oa:
            answer, messages = await openai_agent.run_agent(oa, client.model, row["question"])
        sent[row["id"]] = (type(client.transport), messages)
        return openai_agent.reward(row, answer)

    async def main():
        async with serving(model, tok) as gw:
            trajs = await AgentEngine(gw, agent).run([{"id": "p", "question": "Add 5 and 6.", "answer": 11}], 1)
            return trajs, gw.stats.calls

    (traj,), calls = asyncio.run(main())
    transport, messages = sent["p"]
    assert transport is httpx.ASGITransport and calls == 2 and traj.reward == 1.0 and traj.status == "ok"
    tm = tool_manager(tok)
    last = parse_chat({"messages": messages[:-1], "tools": openai_agent.TOOLS})  # what the second call sent
    prompt = tm.render_prompt(last.messages, last.tools)
    assert [s.role for s in traj.segments] == ["prompt", "model", "observation", "model"]
    assert traj.input_ids[: len(prompt)] == prompt
