"""The verl adapter end to end without verl: rlfactory's engine drives a server manager with verl's
`generate` signature (verl_fakes.TinyVerlServer: the tiny model, steered into calculator calls),
rlfactory's calculator MCP server runs in a real subprocess, and each row's AgentLoopOutput fields
are checked against its trajectory and against what the server actually sampled. The same path
inside verl's real AgentLoopWorker: test_integrations_verl_real.py."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer
from verl_fakes import TinyVerlServer

from rlfactory.config import ConfigError
from rlfactory.envs.base import EnvTools
from rlfactory.integrations.verl.rollout import rollout_row
from rlfactory.integrations.verl.worker import close_workers, get_worker
from rlfactory.rewards.base import RewardScore
from rlfactory.rollout.prompt_env import PromptEnv
from rlfactory.trajectory import Trajectory
from rlfactory.tiny import resolve_model
from rlfactory.tools.base import ToolResult

SAMPLING = dict(temperature=1.0, top_p=1.0, top_k=-1, repetition_penalty=1.0, logprobs=True)  # verl's keys
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def tiny():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    path = resolve_model("tiny:1m")
    yield AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    torch.set_num_threads(threads)


@pytest.fixture
def server(tiny):
    s = TinyVerlServer(*tiny)
    yield s
    s.close()


def write_config(tmp_path: Path, **sections) -> str:
    cfg = {"family": "qwen3", "env": {"name": "rlfactory.rollout.prompt_env:PromptEnv", "options": {"max_turns": 4}},
           "rollout": {"max_new_tokens": 64}, "keep_trajectory": True, **sections}
    path = tmp_path / "rlfactory_verl.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def counted_calculator(starts: Path) -> dict:
    """The calculator MCP server behind a shell that appends a line to `starts` each time it starts."""
    cmd = f"echo start >> {starts}; exec {sys.executable} -m rlfactory.tools.servers.calculator"
    return {"mcpServers": {"calculator": {"command": "sh", "args": ["-c", cmd]}}}


async def run_batch(config: str, tokenizer, server, rows, n=2, prompt_length=1024, response_length=512):
    """What verl's AgentLoopWorker does with a batch: every row n times, all at once, one agent loop
    `run` each (RLFactoryAgentLoop.run is get_worker + rollout_row)."""

    async def one(row):
        worker = await get_worker(config, [], tokenizer)
        return await rollout_row(worker, server, dict(SAMPLING), row, prompt_length=prompt_length,
                                 response_length=response_length)

    return await asyncio.gather(*(one(row) for row in rows for _ in range(n)))


def test_multi_turn_rollouts_with_the_calculator_mcp_server_line_up_token_for_token(tmp_path, tiny, server):
    starts = tmp_path / "starts"
    config = write_config(tmp_path, tools={"mcp": counted_calculator(starts)})
    rows = [{"id": f"r{n}", "question": f"Task {n}: add things."} for n in range(4)]

    async def main():
        try:
            first = await run_batch(config, tiny[1], server, rows)
            second = await run_batch(config, tiny[1], server, rows)
            return first + second
        finally:
            await close_workers()

    outputs = asyncio.run(main())
    assert starts.read_text().splitlines() == ["start"]  # one MCP server for 16 trajectories in two batches
    turns_by_request: dict[str, list] = {}
    for turn in server.calls:
        turns_by_request.setdefault(turn.request_id, []).append(turn)
    assert len(turns_by_request) == 16  # one request id per trajectory, kept for all its turns
    for out in outputs:
        traj = Trajectory.from_json(out.extra_fields["rlfactory_trajectory"])
        n = int(traj.info["question"].split()[1].rstrip(":"))
        assert traj.status == "ok" and out.extra_fields["rlfactory_status"] == "ok"
        assert traj.turns == n % 3 + 1 and out.num_turns == 1 + traj.turns + n % 3
        assert out.extra_fields["rlfactory_tool_statuses"] == ({"ok": n % 3} if n % 3 else {})
        assert out.prompt_ids + out.response_ids == traj.input_ids
        assert out.prompt_ids == traj.segments[0].token_ids
        assert out.response_mask == traj.loss_mask[len(out.prompt_ids):]
        # The turns the server sampled for this trajectory, in order: each one's prompt is the
        # context so far, its tokens and logprobs are the next model segment; observation tokens
        # get logprob 0 and mask 0.
        served = turns_by_request[out.extra_fields["rlfactory_request_id"]]
        model_segments = [s for s in traj.segments if s.role == "model"]
        assert [t.token_ids for t in served] == [s.token_ids for s in model_segments]
        offsets = [sum(len(x.token_ids) for x in traj.segments[:i]) for i, x in enumerate(traj.segments)
                   if x.role == "model"]
        assert [t.prompt_ids for t in served] == [traj.input_ids[:k] for k in offsets]
        assert out.response_logprobs == [lp for s in traj.segments[1:] for lp in
                                         (s.logprobs if s.role == "model" else [0.0] * len(s.token_ids))]
        assert [lp for lp, m in zip(out.response_logprobs, out.response_mask) if m] == [
            lp for t in served for lp in t.log_probs]
        observations = [s.text for s in traj.segments if s.role == "observation"]
        assert [float(o.split("<tool_response>\n")[1].split("\n")[0]) for o in observations] == [
            float(n + k) for k in range(n % 3)]  # add(a=n, b=turn), computed by the MCP server
        assert all(t.sampling_params["max_tokens"] <= 64 for t in served)
        assert tiny[1].convert_tokens_to_ids("<|im_end|>") in served[0].sampling_params["stop_token_ids"]
        assert {k: served[0].sampling_params[k] for k in SAMPLING} == SAMPLING  # verl's own settings, as given


def add(a: float, b: float) -> str:
    """Add two numbers.

    Args:
        a: the first
        b: the second
    """
    return str(a + b)


PY_TOOLS = {"python": ["test_integrations_verl_rollout:add"]}


class CrashedToolsEnv(PromptEnv):
    """Every tool call fails as if its server had died (status crashed)."""

    async def step(self, calls, runner):
        return [ToolResult.error("the calculator server died", status="crashed") for _ in calls]


class ScoredEnv(PromptEnv):
    """A PromptEnv with a reward of its own: 1 when the last model turn names the row's number."""

    def tools(self) -> EnvTools:
        return EnvTools(python=[add])

    def reward(self):
        class Said:
            async def score(self, trajectory):
                said = trajectory.info["question"].split()[1].rstrip(":") in trajectory.model_text()[-20:]
                return RewardScore(float(said), {"said_it": float(said)})

        return Said()


class FailingServer:
    """verl's server manager that raises for the trajectories in `fail` (by request id order)."""

    def __init__(self, inner, fail_first: int) -> None:
        self.inner, self.fail_first, self.ids = inner, fail_first, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        if request_id not in self.ids:
            self.ids.append(request_id)
        if self.ids.index(request_id) < self.fail_first:
            raise ConnectionError("the vLLM server actor died")
        return await self.inner.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs)


def rollout(config, tokenizer, server, rows, **lengths):
    async def main():
        try:
            return await run_batch(config, tokenizer, server, rows, n=1, **lengths)
        finally:
            await close_workers()

    return asyncio.run(main())


def test_verl_lengths_bound_the_trajectory(tmp_path, tiny, server, caplog):
    config = write_config(tmp_path, tools=PY_TOOLS)
    rows = [{"question": "Task 2: add things."}]
    [full] = rollout(config, tiny[1], server, rows)
    prompt_len = len(full.prompt_ids)
    [cut] = rollout(config, tiny[1], server, rows, prompt_length=prompt_len, response_length=40)
    assert len(cut.response_ids) <= 40 < len(full.response_ids)
    assert cut.extra_fields["rlfactory_status"] == "truncated"
    traj = Trajectory.from_json(cut.extra_fields["rlfactory_trajectory"])
    assert cut.prompt_ids + cut.response_ids == traj.input_ids and cut.response_mask == traj.loss_mask[prompt_len:]
    [long] = rollout(config, tiny[1], server, rows, prompt_length=prompt_len - 1)
    assert long.extra_fields["rlfactory_status"] == "truncated" and long.response_ids == []
    assert long.prompt_ids == full.prompt_ids[1:]  # verl pads to prompt_length: what fits is returned
    assert "more than actor_rollout_ref.rollout.prompt_length" in long.extra_fields["rlfactory_error"]
    assert "more than actor_rollout_ref.rollout.prompt_length" in caplog.text


def test_a_server_failure_ends_only_its_trajectory_infra_error_and_masked(tmp_path, tiny, server):
    config = write_config(tmp_path, tools=PY_TOOLS)
    rows = [{"question": f"Task {n}: add things."} for n in (1, 2, 4)]
    outs = rollout(config, tiny[1], FailingServer(server, fail_first=1), rows)
    statuses = [o.extra_fields["rlfactory_status"] for o in outs]
    assert sorted(statuses) == ["infra_error", "ok", "ok"]
    failed = outs[statuses.index("infra_error")]
    assert "at turn 1: ConnectionError: the vLLM server actor died" in failed.extra_fields["rlfactory_error"]
    assert failed.response_ids == [] and failed.response_mask == []


def test_tools_that_fail_for_the_infrastructure_mask_the_trajectory_out(tmp_path, tiny, server):
    env = {"name": "test_integrations_verl_rollout:CrashedToolsEnv", "options": {"max_turns": 4}}
    config = write_config(tmp_path, env=env, tools=PY_TOOLS)
    [out] = rollout(config, tiny[1], server, [{"question": "Task 1: add things."}])
    assert out.extra_fields["rlfactory_status"] == "infra_error"
    assert "crashed: the calculator server died" in out.extra_fields["rlfactory_error"]
    assert out.response_mask == [0] * len(out.response_ids) and len(out.response_ids) > 0
    assert out.extra_fields["rlfactory_tool_statuses"] == {"crashed": 1}


def test_score_uses_the_env_reward_and_needs_one(tmp_path, tiny, server):
    env = {"name": "test_integrations_verl_rollout:ScoredEnv", "options": {"max_turns": 4}}
    config = write_config(tmp_path, env=env, score=True)
    outs = rollout(config, tiny[1], server, [{"question": f"Task {n}: add things."} for n in (0, 1)])
    assert [o.reward_score for o in outs] == [1.0, 1.0]  # "The answer is N." (ScriptedPolicy)
    assert all(o.extra_fields["rlfactory_reward_terms"] == {"said_it": 1.0} for o in outs)
    assert outs[1].extra_fields["rlfactory_tool_statuses"] == {"ok": 1}  # the env's own python tool
    with pytest.raises(ConfigError, match="score: true, but env .* has no reward"):
        rollout(write_config(tmp_path, score=True), tiny[1], server, [{"question": "Task 0"}])


def test_a_bad_config_names_the_key_and_the_file(tmp_path, tiny, server):
    config = write_config(tmp_path, rollout={"max_new_token": 5})
    with pytest.raises(ConfigError, match=r"rlfactory_verl.yaml[\s\S]*rollout.max_new_token: unknown key"):
        rollout(config, tiny[1], server, [{"question": "Task 0"}])


def test_a_tool_server_that_does_not_start_is_tried_once_per_worker(tmp_path, tiny, server):
    starts = tmp_path / "starts"
    broken = {"mcpServers": {"calculator": {"command": "sh", "args": ["-c", f"echo start >> {starts}; exit 3"]}}}
    config = write_config(tmp_path, tools={"mcp": broken, "startup_timeout_s": 5})

    async def main():
        try:
            return await asyncio.gather(*(run_batch(config, tiny[1], server, [{"question": "Task 1"}], n=1)
                                          for _ in range(3)), return_exceptions=True)
        finally:
            await close_workers()

    errors = asyncio.run(main())
    assert starts.read_text().splitlines() == ["start"]  # not once per trajectory
    assert "calculator" in str(errors[0]) and all(isinstance(e, Exception) for e in errors)
    assert all("could not start" in str(e) and "calculator" in str(e) for e in errors[1:])
