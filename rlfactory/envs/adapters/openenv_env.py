"""`env.name: openenv`: an OpenEnv environment served over its HTTP API (`pip install 'rlfactory[openenv]'`).

    env:
      name: openenv
      options:
        url: http://127.0.0.1:8000     # the env server (`uvicorn my_env.server.app:app`, a container, ...)
        tool_name: act                 # the one tool the model acts with
        n_train: 64                    # rows = reset seeds 0..n_train-1 (the test split: n_test seeds)

The model acts through one tool whose parameters are the server's action schema (`GET /schema`).
Each trajectory gets its own session (OpenEnv's WebSocket API, one env instance per session),
reset with its row's seed; each call of the tool is one `step`, whose observation the model sees.
The opening prompt shows the observation of `POST /reset` with the same seed, so the env's
reset must be deterministic in its seed (every sample of a row starts where the prompt says).
When a step says `done`, the next model turn ends the episode. The reward term `openenv` is the
sum of the step rewards; `openenv/done` says whether the episode finished.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from dataclasses import dataclass, field
from typing import Any

import httpx

from rlfactory.chat.base import ParseResult
from rlfactory.config import ConfigError
from rlfactory.envs.base import Env, EnvTools, Message
from rlfactory.rewards.base import RewardScore, require_scorable
from rlfactory.tools.base import ToolCall, ToolResult
from rlfactory.trajectory import Status, Trajectory

_SERVED_BY_BASE = ("metadata",)  # fields every OpenEnv action/observation has; not the model's business
TEST_SEED_BASE = 1_000_000


@dataclass
class _Session:
    seed: int
    client: Any = None
    rewards: list[float] = field(default_factory=list)
    done: bool = False


class OpenEnvTool:
    """The env's action as a tool (the schema the model is shown). Calls go through `OpenEnvEnv.step`,
    which knows the trajectory's session; called directly (`rlfactory tools call`), it steps a
    fresh session reset with seed 0."""

    def __init__(self, env: "OpenEnvEnv", name: str, description: str, parameters: dict[str, Any]) -> None:
        self.env, self.name, self.description, self.parameters = env, name, description, parameters

    async def call(self, arguments: dict[str, Any]) -> ToolResult:
        session = _Session(seed=0)
        try:
            return await self.env._act(session, arguments)
        finally:
            await self.env._end(session)


class OpenEnvEnv(Env):
    """An OpenEnv environment over HTTP: one session per trajectory, the action as a tool, step rewards."""

    name = "openenv"

    def __init__(self, url: str, tool_name: str = "act", tool_description: str | None = None, n_train: int = 64,
                 n_test: int = 0, max_turns: int = 4, system_prompt: str | None = None, timeout_s: float = 30.0) -> None:
        try:
            from openenv.core.generic_client import GenericEnvClient
        except ImportError as e:
            raise ConfigError(f"env.name: openenv needs the openenv-core package: pip install 'rlfactory[openenv]' "
                              f"({type(e).__name__}: {e})") from None
        self._client_cls = GenericEnvClient
        self.url, self.timeout_s = url.rstrip("/"), timeout_s
        self.n_train, self.n_test, self.max_turns, self.system_prompt = n_train, n_test, max_turns, system_prompt
        try:
            schema = httpx.get(f"{self.url}/schema", timeout=timeout_s)
            schema.raise_for_status()
            action = schema.json()["action"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"env.options.url: no OpenEnv server answers GET {self.url}/schema "
                              f"({type(e).__name__}: {e})".splitlines()[0]) from None
        params = {k: v for k, v in action.get("properties", {}).items() if k not in _SERVED_BY_BASE}
        parameters = {"type": "object", "properties": params,
                      "required": [k for k in action.get("required", []) if k in params]}
        if action.get("$defs"):
            parameters["$defs"] = action["$defs"]
        description = tool_description or action.get("description") or f"Act in the {action.get('title', 'env')} environment."
        self.tool = OpenEnvTool(self, tool_name, description, parameters)
        self._sessions: dict[str, _Session] = {}
        self._episodes: weakref.WeakKeyDictionary[asyncio.Task, Trajectory] = weakref.WeakKeyDictionary()

    # ---- data ------------------------------------------------------------------------------

    def load_split(self, split: str) -> list[dict[str, Any]]:
        if split == "train":
            return [{"id": f"seed-{i}", "seed": i} for i in range(self.n_train)]
        if split == "test" and self.n_test:
            return [{"id": f"seed-{TEST_SEED_BASE + i}", "seed": TEST_SEED_BASE + i} for i in range(self.n_test)]
        raise ValueError(f"env 'openenv' has no {split!r} split (env.options.n_test sets a test split)")

    def reset(self, row: dict[str, Any]) -> list[Message]:
        reply = httpx.post(f"{self.url}/reset", json={"seed": int(row["seed"])}, timeout=self.timeout_s)
        reply.raise_for_status()
        observation = reply.json().get("observation", {})
        messages: list[Message] = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": _show(observation)})
        return messages

    def tools(self) -> EnvTools:
        return EnvTools(python=[self.tool])

    # ---- episodes --------------------------------------------------------------------------

    def end_episode(self, trajectory: Trajectory, turn: ParseResult) -> Status | None:
        # Called in the trajectory's own coroutine (the rollout runs one task per trajectory), as
        # `step` is: it tells `step` whose session the calls are for.
        task = asyncio.current_task()
        if task is not None:
            self._episodes[task] = trajectory
        session = self._sessions.get(trajectory.id)
        return "ok" if session is not None and session.done else None

    async def step(self, calls: list[ToolCall], runner: Any) -> list[ToolResult]:
        task = asyncio.current_task()
        trajectory = self._episodes.get(task) if task is not None else None
        if trajectory is None:
            raise RuntimeError("openenv: a step outside a trajectory's rollout (no end_episode call in this task)")
        session = self._sessions.setdefault(trajectory.id, _Session(seed=int(trajectory.info["seed"])))
        results = []
        for call in calls:
            if call.name != self.tool.name:
                results.append(ToolResult.error(f"unknown tool {call.name!r}; the tool is {self.tool.name!r}"))
            elif session.done:
                results.append(ToolResult.error("the episode is over; give your final answer"))
            else:
                results.append(await self._act(session, call.arguments))
        return results

    async def _act(self, session: _Session, arguments: dict[str, Any]) -> ToolResult:
        if session.client is None:
            session.client = self._client_cls(base_url=self.url, connect_timeout_s=self.timeout_s,
                                              message_timeout_s=self.timeout_s)
            await session.client.connect()
            await session.client.reset(seed=session.seed)
        try:
            result = await session.client.step(dict(arguments))
        except (ConnectionError, RuntimeError, ValueError) as e:  # the server refused the action or went away
            return ToolResult.error(f"{type(e).__name__}: {e}")
        if result.reward is not None:
            session.rewards.append(float(result.reward))
        session.done = bool(result.done)
        text = _show(result.observation)
        if session.done:
            text += "\n(The episode is over.)"
            await self._end(session)
        return ToolResult(text=text)

    async def _end(self, session: _Session) -> None:
        client, session.client = session.client, None
        if client is not None:
            await client.close()

    # ---- reward ----------------------------------------------------------------------------

    def reward(self) -> "OpenEnvReward":
        return OpenEnvReward(self)

    def close(self) -> None:
        self._sessions.clear()  # an open session's WebSocket closes with its client


class OpenEnvReward:
    """The sum of the trajectory's step rewards (term `openenv`) and whether it finished (`openenv/done`)."""

    def __init__(self, env: OpenEnvEnv) -> None:
        self.env = env

    async def score(self, trajectory: Trajectory) -> RewardScore:
        require_scorable(trajectory)
        session = self.env._sessions.pop(trajectory.id, None)
        if session is None:
            return RewardScore(total=0.0, terms={"openenv": 0.0, "openenv/done": 0.0})
        await self.env._end(session)
        total = sum(session.rewards)
        return RewardScore(total=total, terms={"openenv": total, "openenv/done": float(session.done)})


def _show(observation: Any) -> str:
    """What the model sees of an observation: its own fields as JSON (not done/reward/metadata)."""
    if isinstance(observation, dict):
        observation = {k: v for k, v in observation.items() if k not in ("done", "reward", *_SERVED_BY_BASE)}
        if len(observation) == 1:
            (value,) = observation.values()
            if isinstance(value, str):
                return value
    return json.dumps(observation, default=str)
