"""Train any agent: run a user's agent function per dataset row against the recording gateway.

The agent is `module:function`, async or sync, called as `agent(row, client)`: `row` is the
dataset row, `client` an `AgentClient` (`base_url`, `api_key`, `model`, and `openai()` /
`openai_sync()` making the OpenAI SDK clients for them). The agent runs its own loop and its own
tools, talking to the policy through the gateway; its API key is the episode's key. Its return
value is the episode's reward (a number), or the input of `reward` (`module:function(row, result)
-> number`, sync or async) when one is configured.

An agent that raises, hangs past `timeout_s`, returns something that is not a number (without a
`reward` function) or makes no model call gives an `infra_error` trajectory that says why: out of
the baseline and the loss, and the step goes on. Every sample of an episode (gateway_record.py)
carries the episode's reward.

`AgentEngine` has the `run(rows, n, policy_version, seeds=, priority=)` of the rollout engine, so
the GRPO trainer trains on gateway episodes unchanged: `env.name: agent` in a run's config
(options: `agent`, `reward`, `timeout_s`, `max_concurrent`, data as PromptEnv's) makes
`rlfactory train` open its session with `open_agent_rollout`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import logging
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Sequence

import httpx

from rlfactory.config import ConfigError, RunConfig, SamplingConfig
from rlfactory.imports import import_ref
from rlfactory.rewards.base import RewardScore
from rlfactory.rollout.engine import group_names
from rlfactory.rollout.prompt_env import PromptEnv
from rlfactory.generation.sampling import mix_seed
from rlfactory.serve.gateway import Gateway, UnknownEpisode
from rlfactory.protocols import Generator
from rlfactory.trajectory import Trajectory

if TYPE_CHECKING:
    from openai import AsyncOpenAI, OpenAI
    from torch import nn
    from transformers import PreTrainedTokenizerBase

    from rlfactory.envs.base import Env, EnvTools
    from rlfactory.train.session import RolloutSession

log = logging.getLogger("rlfactory.gateway")



class _KeptOpen(httpx.AsyncBaseTransport):
    """An episode's transport, lent to its client: the engine closes it when the episode ends,
    whether or not the agent closed its client (`async with client.openai()`)."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        pass


@dataclass(frozen=True)
class AgentClient:
    """What an agent is handed to reach the policy: an OpenAI-compatible endpoint and its key."""

    base_url: str
    api_key: str
    model: str
    transport: httpx.AsyncBaseTransport | None = field(default=None, repr=False)
    """This episode's transport (`openai()` uses it), made by the engine and closed by it when the
    episode ends: the gateway's app called in process, or a connection pool of its own."""

    def openai(self, **kwargs: Any) -> AsyncOpenAI:
        """An `openai.AsyncOpenAI` client for this episode, on the episode's transport (a client of
        its own would build an SSL context: ~50-250 ms of CPU, on the event loop that the gateway
        and the other agents share). Use it from the event loop the agent was started in."""
        import openai

        if self.transport is not None and "http_client" not in kwargs:
            kwargs["http_client"] = openai.DefaultAsyncHttpxClient(transport=_KeptOpen(self.transport))
        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)

    def openai_sync(self, **kwargs: Any) -> OpenAI:
        """An `openai.OpenAI` client for this episode."""
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)


class AgentEnv(PromptEnv):
    """`env.name: agent`: rows from `env.train_data` / `env.test_data` (as PromptEnv), each run by
    the agent `agent` (module:function). Options: `reward` (module:function(row, result)), the
    agent's `timeout_s` per episode, `max_concurrent` episodes (None: all of a step at once)."""

    name = "agent"

    def __init__(self, agent: str = "", reward: str | None = None, timeout_s: float = 120.0,
                 max_concurrent: int | None = None, train_data: str | None = None, test_data: str | None = None,
                 max_turns: int = 32, family: str | None = None) -> None:
        super().__init__(train_data, test_data, None, max_turns, family)
        if not agent:
            raise ConfigError("env.options.agent: the agent function to train, as module:function")
        self.agent = import_ref(agent, "env.options.agent", "function")
        self.reward_fn = import_ref(reward, "env.options.reward", "function") if reward else None
        if not callable(self.agent) or (self.reward_fn is not None and not callable(self.reward_fn)):
            raise ConfigError(f"env.options.agent / reward: {agent!r} / {reward!r} must name functions")
        if timeout_s <= 0:
            raise ConfigError("env.options.timeout_s must be > 0")
        self.timeout_s = float(timeout_s)
        self.max_concurrent = max_concurrent

    def reward(self) -> "EpisodeReward":
        return EpisodeReward()

    def tools(self) -> EnvTools:
        """Every command but `rlfactory train` (trainer.backend: local) asks an env for its tools
        before its model loads: there the agent env ends the command with one line, instead of
        rolling the rows out without the agent."""
        raise ConfigError("env.name: agent runs a user's agent through the gateway, which only `rlfactory train` "
                          "with trainer.backend: local does so far (not rollout, eval, sft, the studio's "
                          "playground or trainer.backend: ray)")


class EpisodeReward:
    """The trainer's reward for gateway episodes: the score the agent runner already gave."""

    async def score(self, trajectory: Trajectory) -> RewardScore:
        if trajectory.reward is None:
            raise ValueError(f"trajectory {trajectory.id!r} has no episode reward")
        return RewardScore(float(trajectory.reward), dict(trajectory.reward_terms))


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`: awaited when async, in a worker thread when not (a sync agent blocks on HTTP)."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    out = await asyncio.to_thread(fn, *args)
    return await out if inspect.isawaitable(out) else out


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and value == value and abs(value) != float("inf"):
        return float(value)
    return None


class AgentEngine:
    """`run(rows, n)`: n episodes of `agent` per row through `gateway`, as trajectories."""

    def __init__(self, gateway: Gateway, agent: Callable[..., Any], reward: Callable[..., Any] | None = None, *,
                 timeout_s: float = 120.0, max_concurrent: int | None = None,
                 info: Callable[[dict[str, Any]], dict[str, Any]] = dict, in_process: bool = True) -> None:
        self.gateway = gateway
        self.in_process = in_process
        """`client.openai()` calls the gateway's app in this process, without a socket: the same
        routes and JSON, without the HTTP stack on both ends (about half the event loop's CPU per
        call of an OpenAI SDK agent, benchmarks/gateway.py). False: over loopback TCP. Agents that
        make their own clients from `base_url` (and `openai_sync()`) use TCP either way."""
        self.agent = agent
        self.reward = reward
        self.timeout_s = float(timeout_s)
        self.max_concurrent = max_concurrent
        self.info = info
        self.generator = gateway.generator
        self._ssl: ssl.SSLContext | None = None
        """One SSL context for every episode's pool (httpx would make one per pool): a bare one."""

    async def aclose(self) -> None:
        """Nothing is left open between runs: each episode's pool closes with the episode."""

    def _pool(self) -> httpx.AsyncBaseTransport:
        """A transport for one episode: the gateway's app in process (`in_process`), else a
        connection pool of the episode's own. Not one pool shared by all: httpcore matches each
        request against every connection of its pool, and with one pool for 32 episodes that cost
        the event loop (which the gateway and the generator's handoffs share) ~1 ms of CPU per call
        (benchmarks/gateway.py)."""
        if self.in_process and self.gateway.asgi is not None:
            # raise_app_exceptions=False: a failure in the app is a 500, as over HTTP
            return httpx.ASGITransport(self.gateway.asgi, raise_app_exceptions=False)
        if self._ssl is None:
            # The gateway serves plain HTTP on loopback, so no TLS handshake ever happens on these
            # pools: a context without the CA bundle (loading it cost ~32 ms of the event loop's
            # CPU per engine, benchmarks/gateway.py), which would refuse any certificate.
            self._ssl = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        return httpx.AsyncHTTPTransport(verify=self._ssl)

    @property
    def sampling(self) -> SamplingConfig:
        return self.gateway.sampling or SamplingConfig()

    @sampling.setter
    def sampling(self, value: SamplingConfig) -> None:  # evaluation makes it greedy for a while
        self.gateway.sampling = value

    def with_generator(self, generator: Generator) -> AgentEngine:
        """This engine with its episodes generated by `generator` (asynchronous training's copy of
        the policy); the gateway and its SSL context shared."""
        other = copy.copy(self)
        other.generator = generator
        return other

    async def run(self, rows: list[dict[str, Any]], n: int, policy_version: int = 0, *,
                  seeds: Sequence[int] | None = None, priority: int = 0, observer: Any = None) -> list[Trajectory]:
        """n episodes per row; each episode gives one trajectory per sample, row-major, its group
        the row's (rollout.engine.group_names) and ids `<group>-<k>[.<sample>]`. `priority` is not
        used (the agents' calls carry none); an `observer` is refused (not supported here)."""
        if observer is not None:
            raise NotImplementedError("rollout observers are not supported for agent episodes (env.name: agent)")
        if seeds is not None and len(seeds) != len(rows):
            raise ValueError(f"AgentEngine.run: {len(seeds)} seeds for {len(rows)} rows")
        self.gateway.policy_version = policy_version
        gate = asyncio.Semaphore(self.max_concurrent) if self.max_concurrent else contextlib.nullcontext()
        jobs = [(i, row, group, k) for i, (row, group) in enumerate(zip(rows, group_names(rows))) for k in range(n)]

        async def one(i: int, row: dict[str, Any], group: str, k: int) -> list[Trajectory]:
            async with gate:
                return await self.episode(row, group, k, None if seeds is None else mix_seed(seeds[i], k))

        done = await asyncio.gather(*(one(*job) for job in jobs))
        return [t for trajs in done for t in trajs]

    async def episode(self, row: dict[str, Any], group: str, index: int, seed: int | None = None) -> list[Trajectory]:
        """Run the agent once on `row`; its episode's trajectories, scored (or infra_error)."""
        try:
            info = self.info(row)
        except Exception as e:  # a row the env cannot describe costs its own episode only
            info = {}
            log.warning("row %s: info() raised %s: %s", group, type(e).__name__, e)
        key = self.gateway.open_episode(info, seed, generator=self.generator)
        pool = self._pool()
        client = AgentClient(self.gateway.base_url(), key, self.gateway.model_name, pool)
        status, error, reward = "ok", None, None
        try:
            result = await asyncio.wait_for(_call(self.agent, row, client), self.timeout_s)
            score = await _call(self.reward, row, result) if self.reward is not None else result
            reward = _number(score)
            if reward is None:
                status, error = "infra_error", (
                    f"the {'reward function' if self.reward is not None else 'agent'} returned {score!r:.100}, not a "
                    "finite number" + ("" if self.reward is not None else
                                       "; return the episode's reward, or set env.options.reward"))
        except asyncio.TimeoutError:
            status = "infra_error"
            error = f"the agent did not finish within {self.timeout_s:g} s (env.options.timeout_s)"
        except Exception as e:  # the user's agent crashing is data about this episode, not the step's end
            status, error = "infra_error", f"the agent raised {type(e).__name__}: {e}"[:1000]
        finally:
            await pool.aclose()
        try:
            episode = self.gateway.close_episode(key)
        except UnknownEpisode:  # closed already: nothing was recorded under it
            return [Trajectory(f"{group}-{index}", group, status="infra_error", info=info,
                               error=error or "episode lost")]
        if error is not None:
            log.warning("episode %s-%d: %s", group, index, error)
        return episode.trajectories(group, index, status, reward if status != "infra_error" else None, error)


@contextlib.asynccontextmanager
async def open_agent_rollout(cfg: RunConfig, *, model: nn.Module | None = None,
                             tokenizer: PreTrainedTokenizerBase | None = None, env: Env | None = None,
                             logits_processor: Any = None, reward_mode: str = "optional",
                             check_splits: Sequence[str] = (), **_: Any) -> AsyncIterator[RolloutSession]:
    """A rollout session (train.session.RolloutSession) whose engine runs `env.options.agent`
    through an in-process gateway on a free loopback port: what `rlfactory train` opens for
    `env.name: agent`. The trainer's `sampling:` applies to every call (the agent's own
    temperature is ignored: the recorded logprobs must be the trainer's)."""
    from rlfactory.train.session import RolloutSession, checked_tool_manager, pad_id_of
    from rlfactory.generation.local import LocalGenerator
    from rlfactory.generation.model_source import check_model_path, load_model, pick_device
    from rlfactory.train.prepare import build_env

    env = env if env is not None else build_env(cfg)
    if not isinstance(env, AgentEnv):
        raise ConfigError(f"env.name: {cfg.env.name!r} is not an agent env (use env.name: agent)")
    if model is None or tokenizer is None:
        check_model_path(cfg.model.path)
        model, tokenizer = load_model(cfg.model, pick_device(cfg.model.device))
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    tool_manager = checked_tool_manager(cfg.model, tokenizer, model_type)
    generator = LocalGenerator(model, pad_id_of(tokenizer, model), tool_manager.stop_token_ids(), tokenizer=tokenizer,
                               stop_strings=tool_manager.stop_strings(), device=next(model.parameters()).device,
                               max_batch=cfg.rollout.max_batch, seed=cfg.sampling.seed,
                               logits_processor=logits_processor, cuda_graphs=cfg.rollout.cuda_graphs)
    context = int(getattr(model.config, "max_position_embeddings", 0) or 0)
    gateway = Gateway(generator, tool_manager, tokenizer, model_name=cfg.model.path,
                      max_new_tokens=cfg.rollout.max_new_tokens,
                      context=min(context or cfg.rollout.max_total_tokens, cfg.rollout.max_total_tokens))
    gateway.sampling = cfg.sampling
    engine = AgentEngine(gateway, env.agent, env.reward_fn, timeout_s=env.timeout_s,
                         max_concurrent=env.max_concurrent, info=env.info)
    await gateway.start()
    try:
        yield RolloutSession(engine, generator, model, tokenizer, tool_manager, None, env, env.reward())
    finally:
        await engine.aclose()
        await gateway.stop()
        generator.close()
        env.close()
