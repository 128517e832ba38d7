"""What one verl agent loop worker keeps between trajectories: the env, its ToolManager and a
started ToolRunner (MCP servers included).

verl builds a new agent loop object for every sample, inside long-lived `AgentLoopWorker` Ray
actors, each running one event loop. Starting MCP servers per trajectory would start thousands of
subprocesses per step; so they start once per worker process and event loop, on the first
trajectory that needs them (`get_worker`), and every later trajectory of that worker shares them.
`close_workers()` stops them (a worker process that simply exits closes its servers' stdin, and
stdio MCP servers exit on that).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from rlfactory.chat import check_token_contract, make_tool_manager
from rlfactory.config import ConfigError
from rlfactory.envs.registry import env_from_config
from rlfactory.integrations.verl.config import VerlAgentConfig, load_verl_agent_config
from rlfactory.tools import ToolRunner

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rlfactory.chat.base import ToolManager
    from rlfactory.envs.base import Env
    from rlfactory.rewards.base import Reward

log = logging.getLogger("rlfactory.integrations.verl")


class WorkerStartError(RuntimeError):
    """This worker's env and tools failed to start earlier; the message says why."""


@dataclass
class VerlWorker:
    """The env, ToolManager and started ToolRunner that a worker's trajectories share."""

    config: VerlAgentConfig
    source: str
    """The config file (for error messages)."""
    tokenizer: PreTrainedTokenizerBase
    tool_manager: ToolManager
    env: Env
    runner: ToolRunner
    reward: Reward | None = None
    """The env's reward, when `score` is on."""
    trajectories: int = 0
    infra_errors: int = 0
    loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)

    def prompt_ids(self, row: dict[str, Any]) -> list[int]:
        """The prompt the rollout engine renders for `row`: env.reset, then the ToolManager with
        the runner's tool specs."""
        return list(self.tool_manager.render_prompt(self.env.reset(row), self.runner.specs()))

    async def aclose(self) -> None:
        try:
            await self.runner.aclose()
        finally:
            self.env.close()


_workers: dict[tuple, VerlWorker] = {}
_starting: dict[tuple, asyncio.Lock] = {}
_failed: dict[tuple, str] = {}


def worker_key(config_path: str, overrides: Sequence[str], tokenizer: PreTrainedTokenizerBase) -> tuple:
    loop = asyncio.get_running_loop()
    name = getattr(tokenizer, "name_or_path", None) or id(tokenizer)
    return (str(Path(config_path).resolve()), tuple(overrides), name, id(loop))


async def get_worker(config_path: str, overrides: Sequence[str], tokenizer: PreTrainedTokenizerBase,
                     model_type: str | None = None) -> VerlWorker:
    """The VerlWorker of this process and event loop for (config, overrides, tokenizer), started
    on first use. Raises what the start raised (ConfigError naming the key and file, the runner's
    ToolStartError naming the server) for the trajectory that tried; the other trajectories of
    the worker then get a WorkerStartError at once instead of each trying again (a server that
    does not start would otherwise cost its startup timeout once per trajectory)."""
    key = worker_key(config_path, overrides, tokenizer)
    worker = _workers.get(key)
    if worker is not None:
        return worker
    lock = _starting.setdefault(key, asyncio.Lock())
    async with lock:
        if key in _failed:
            raise WorkerStartError(f"the rlfactory agent loop could not start ({config_path}): {_failed[key]}")
        worker = _workers.get(key)
        if worker is None:
            try:
                worker = await start_worker(config_path, overrides, tokenizer, model_type)
            except Exception as e:
                _failed[key] = f"{type(e).__name__}: {e}"
                raise
            _workers[key] = worker
    return worker


async def start_worker(config_path: str, overrides: Sequence[str], tokenizer: PreTrainedTokenizerBase,
                       model_type: str | None = None) -> VerlWorker:
    """Validate the config, build the env and ToolManager (token contract checked against
    `tokenizer`), start the ToolRunner."""
    cfg = load_verl_agent_config(config_path, overrides)
    tool_manager = make_tool_manager(tokenizer, cfg.family, model_type)
    check_token_contract(tool_manager, tokenizer)
    env = env_from_config(cfg.env, family=cfg.family)
    try:
        reward = env_reward(env, cfg, config_path) if cfg.score else None
        env_tools = env.tools()
        runner = ToolRunner.from_config(cfg.tools, python_tools=env_tools.python, mcp=env_tools.mcp)
        await runner.start()
    except BaseException:
        env.close()
        raise
    log.info("rlfactory agent loop worker started: env %s, %d tools, family %s", cfg.env.name,
             len(runner.specs()), getattr(tool_manager, "family", type(tool_manager).__name__))
    return VerlWorker(cfg, str(config_path), tokenizer, tool_manager, env, runner, reward,
                      loop=asyncio.get_running_loop())


def env_reward(env: Env, cfg: VerlAgentConfig, source: str) -> Reward:
    try:
        reward = env.reward()
    except NotImplementedError:
        reward = None
    if reward is None:
        raise ConfigError(f"{source}: score: true, but env {cfg.env.name!r} has no reward of its own "
                          "(set score: false and let verl's reward function score the responses)")
    return reward


async def close_workers() -> None:
    """Stop the tools of every worker started on the running event loop (and forget its failures)."""
    loop = asyncio.get_running_loop()
    for key in [k for k in _failed if k[-1] == id(loop)]:
        del _failed[key]
    for key in [k for k, w in _workers.items() if w.loop is loop]:
        worker = _workers.pop(key)
        _starting.pop(key, None)
        await worker.aclose()


def started_workers() -> list[VerlWorker]:
    """The workers started in this process (any event loop)."""
    return list(_workers.values())
