"""`rlfactory gateway tiny:1m` as a real process: an OpenAI SDK agent (sync client) runs an
episode with a key from POST /v1/episodes; finishing it returns and writes its trajectories."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from gateway_fixtures import EXAMPLES  # noqa: F401  (puts examples/gateway on sys.path)

from rlfactory.serve.gateway_process import GatewayProcess
from rlfactory.trajectory import read_jsonl

HERE = Path(__file__).resolve().parent


def test_gateway_command_serves_records_and_writes_episodes(tmp_path):
    import openai_agent

    out = tmp_path / "episodes.jsonl"
    args = ["--out", str(out), "--logits-processor", "gateway_fixtures:scripted_add", "--seed", "0"]
    with GatewayProcess("tiny:1m", args, cwd=str(HERE)) as gw, httpx.Client(base_url=gw.url, timeout=60) as http:
        key = http.post("/v1/episodes", json={"info": {"id": "q1"}}).json()["episode"]
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)
        messages = [{"role": "user", "content": "Add 20 and 22."}]
        first = client.chat.completions.create(model="tiny:1m", messages=messages, tools=openai_agent.TOOLS)
        call = first.choices[0].message.tool_calls[0]
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id,
                      "content": str(openai_agent.add(**json.loads(call.function.arguments)))}]
        final = client.chat.completions.create(model="tiny:1m", messages=messages, tools=openai_agent.TOOLS)
        assert final.choices[0].message.content == "The answer is 42."
        stats = http.get("/v1/gateway/stats").json()
        finished = http.post(f"/v1/episodes/{key}/finish", json={"reward": 1.0}).json()
        again = http.post(f"/v1/episodes/{key}/finish", json={"reward": 1.0})
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="tiny:1m", messages=messages)
    assert stats["calls"] == 2 and stats["overhead_ms_per_call"] > 0
    (traj,) = read_jsonl(out)
    assert traj.to_dict() == finished["trajectories"][0]
    assert traj.reward == 1.0 and traj.info["id"] == "q1" and traj.turns == 2
    assert [s.role for s in traj.segments] == ["prompt", "model", "observation", "model"]
    assert again.status_code == 401
