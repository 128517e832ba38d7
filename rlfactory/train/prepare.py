"""What a run builds and checks before it loads a model: the env, its tools, its reward.

Every command that rolls out (`rollout`, `sft`, `train`, `eval`) and `tools list` go through
these steps, in this order, so that a user's mistake ends the command in seconds with one line
(a `ConfigError`) naming the config key, instead of a traceback after the model has loaded:

1. `build_env`: `env.module` imported, `env.name` found (with "did you mean"), the env built
   from `env.options`; the turn limit resolved (`env.options.max_turns` / `rollout.max_turns`).
2. `build_runner`: `tools.python` functions imported, every stdio MCP command found, the tools of
   the config and of the env merged into one ToolRunner; `start_runner` starts the MCP servers
   and says in one line which tools were renamed because two share a name.
3. `build_run_reward`: the env's own reward and the `reward:` section built.
4. `check_split`: the rows of the splits the command uses checked against what the reward reads
   (a reference answer for `exact_match` and the like).

What each command asks of steps 3 and 4 is `command_checks` (train and eval need a reward,
rollout scores when it can, sft needs none); `check_command` runs steps 1-4 and stops what they
started: the studio's config check is the command's own.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rlfactory.config import ConfigError, RunConfig
from rlfactory.imports import import_ref, where

if TYPE_CHECKING:
    from rlfactory.config import ToolsConfig
    from rlfactory.envs.base import Env, EnvTools
    from rlfactory.rewards.base import Reward
    from rlfactory.tools.runner import ToolRunner


def _where(exc: BaseException) -> str:
    return f" ({where(exc)})"


def _one_line(text: str) -> str:
    return re.sub(r"\s*\n\s*", " | ", str(text).strip())


def build_env(cfg: RunConfig) -> Env:
    """The env of `cfg` (a RunConfig). Raises ConfigError naming `env.*` on any mistake, including
    an exception raised by the env's own constructor (with its file and line)."""
    from rlfactory.envs.registry import env_from_config

    try:
        env = env_from_config(cfg.env, family=cfg.model.family)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"env.name: building env {cfg.env.name!r} failed: {type(e).__name__}: "
                          f"{_one_line(str(e))}{_where(e)}") from e
    resolve_max_turns(cfg, env)
    return env


def resolve_max_turns(cfg: RunConfig, env: Env) -> int:
    """The one turn limit of the run: `rollout.max_turns` when set, else the env's `max_turns`
    (which `env.options.max_turns` sets). When both keys are set and disagree: a ConfigError."""
    option = cfg.env.options.get("max_turns")
    if cfg.rollout.max_turns is not None and option is not None and option != cfg.rollout.max_turns:
        raise ConfigError(f"rollout.max_turns={cfg.rollout.max_turns} and env.options.max_turns={option} disagree: "
                          "set the turn limit in one of them")
    return int(cfg.rollout.max_turns or env.max_turns or 4)


def env_tools(cfg: RunConfig, env: Env) -> EnvTools:
    """`env.tools()`, with its failure as a ConfigError naming the env."""
    try:
        return env.tools()
    except Exception as e:
        raise ConfigError(f"env.name: {cfg.env.name!r}: tools() raised {type(e).__name__}: "
                          f"{_one_line(str(e))}{_where(e)}") from e


def build_runner(tools: ToolsConfig, own: EnvTools | None = None, connect_server: Any = None) -> ToolRunner:
    """A ToolRunner (not started) with the tools of `tools` (a ToolsConfig, the `tools:` section)
    plus `own` (an env's EnvTools, or None); `connect_server` reaches its MCP servers (see
    ToolRunner; None: it starts them itself). Mistakes are ConfigErrors naming the key."""
    from rlfactory.tools import ToolRunner
    from rlfactory.tools.mcp_config import check_commands

    for i, ref in enumerate(tools.python):
        fn = import_ref(ref, f"tools.python[{i}]", "function")
        if not callable(fn):
            raise ConfigError(f"tools.python[{i}]: {ref!r} is not a function")
    check_commands(tools.mcp)
    if own is not None and own.mcp is not None:
        check_commands(own.mcp)
    try:
        return ToolRunner.from_config(tools, python_tools=own.python if own else (), mcp=own.mcp if own else None,
                                      connect_server=connect_server)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:  # two tools of one name, a function that cannot be a tool
        raise ConfigError(f"tools: {_one_line(str(e))}") from e


async def start_runner(runner: ToolRunner, tools: ToolsConfig) -> None:
    """Start the runner's MCP servers; a server that cannot start is a ConfigError (one line).
    Prints one line when tools were renamed `server.tool` because two share a name."""
    from rlfactory.tools.runner import ToolStartError

    try:
        await runner.start()
    except ToolStartError as e:
        sources = [f"tools.mcp ({tools.mcp})"] if tools.mcp is not None else []
        if _has_other_servers(runner, tools):
            sources.append("the env's tools().mcp")
        raise ConfigError(f"{' or '.join(sources) or 'tools'}: {_one_line(str(e))}") from None
    line = renamed_tools(runner, tools.qualify_names)
    if line:
        print(line, file=sys.stderr)


def _has_other_servers(runner: ToolRunner, tools: ToolsConfig) -> bool:
    """Whether the runner serves MCP servers that `tools.mcp` does not define (the env's)."""
    from rlfactory.tools.mcp_config import load_mcp_config

    return bool(set(runner.connections) - set(load_mcp_config(tools.mcp)))


def renamed_tools(runner: ToolRunner, qualify_names: bool = False) -> str | None:
    """One line naming the tools that were renamed `server.tool` because two share a name, or None."""
    if qualify_names:
        return None
    names = [s.name for s in runner.specs()]
    clashes: dict[str, list[str]] = {}
    for name in names:
        server = runner.server_of(name)
        if server and name.startswith(server + "."):
            clashes.setdefault(name[len(server) + 1:], []).append(name)
    if not clashes:
        return None
    parts = []
    for base, renamed in clashes.items():
        seen = ([f"{base!r} (python)"] if base in names else []) + [repr(n) for n in renamed]
        parts.append(f"{base!r} is served more than once, so the model sees {', '.join(seen)}")
    return ("tools: " + "; ".join(parts) + " (hide a copy with the server's `exclude`, or set "
            "tools.qualify_names: true to always name MCP tools server.tool)")


def env_reward(cfg: RunConfig, env: Env) -> Reward | None:
    """The env's own reward (None when it has none), with its failure (a reward term typo inside
    the env, say) as a ConfigError naming the env."""
    try:
        return env.reward()
    except NotImplementedError:
        return None
    except Exception as e:
        raise ConfigError(f"env.name: {cfg.env.name!r}: reward() raised {type(e).__name__}: "
                          f"{_one_line(str(e))}{_where(e)}") from e


def build_run_reward(cfg: RunConfig, env: Env, runner: ToolRunner) -> Reward | None:
    """The run's reward: the `reward:` section over the env's own; None when neither gives one."""
    from rlfactory.rewards import build_reward

    default = env_reward(cfg, env)
    r = cfg.reward
    if default is None and not (r.terms or r.judge is not None or r.verify is not None):
        return None
    return build_reward(cfg.reward, default=default, tools=runner.tools())


def split_rows(env: Env, split: str, env_name: str | None = None) -> list[dict[str, Any]]:
    """The rows of `split`, or [] when the env has no such split. A data file the env cannot read
    (a missing system file, say) is a ConfigError naming the env, the split and the file."""
    try:
        return list(env.load_split(split))
    except (NotImplementedError, ValueError, KeyError):
        return []
    except OSError as e:
        name = env_name or getattr(env, "name", None) or type(env).__qualname__
        raise ConfigError(f"env {name!r}: load_split({split!r}) raised {type(e).__name__}: "
                          f"{_one_line(str(e))}{_where(e)}") from e


def check_split(cfg: RunConfig, env: Env, reward: Reward | None, split: str, rows: list[dict[str, Any]],
                try_terms: bool = True) -> None:
    """Raise a ConfigError when a row of `split` lacks what `reward` reads (the row and the field
    named). Does nothing without a reward. `try_terms`: see `check_rows`."""
    from rlfactory.rewards.requirements import check_rows

    if reward is None or not rows:
        return
    problem = check_rows(reward, (env.info(row) for row in rows),
                         f"env {cfg.env.name!r}: {split} row", try_terms)
    if problem:
        raise ConfigError(problem)


RewardMode = Literal["optional", "required", "off"]


@dataclass(frozen=True)
class CommandChecks:
    """What a command asks of the reward and the data before it loads a model."""

    reward_mode: RewardMode
    """required: no reward is a ConfigError; optional: scored when one is configured; off: none built."""
    check_splits: tuple[str, ...]
    """Splits whose rows are checked against what the reward reads."""


def command_checks(command: str, cfg: RunConfig, split: str = "test", reward: bool = True) -> CommandChecks:
    """The checks of `rlfactory COMMAND` (train | eval | rollout | sft) on `cfg`; `split` is
    eval's and rollout's --split, `reward=False` rollout's --no-reward."""
    if command == "train":
        return CommandChecks("required", ("train", "test") if cfg.trainer.eval_every else ("train",))
    if command == "eval":
        return CommandChecks("required", (split,))
    if command == "rollout":
        return CommandChecks("optional" if reward else "off", (split,))
    if command == "sft":
        return CommandChecks("off", ("train",))
    raise ValueError(f"no checks for command {command!r} (train, eval, rollout or sft)")


async def prepare_tools_and_reward(cfg: RunConfig, env: Env, checks: CommandChecks,
                                   connect_server: Any = None) -> tuple[ToolRunner, Reward | None]:
    """Steps 2-4 for `env`: the started ToolRunner (the caller closes it) and the run's reward
    (None where `checks` allow it). A mistake is a ConfigError; nothing is left running then."""
    runner = build_runner(cfg.tools, env_tools(cfg, env), connect_server)
    try:
        await start_runner(runner, cfg.tools)
        reward = build_run_reward(cfg, env, runner) if checks.reward_mode != "off" else None
        if reward is None and checks.reward_mode == "required":
            raise ConfigError("reward: nothing configured (reward.terms / judge / verify) and the env has no reward()")
        for i, split in enumerate(checks.check_splits):  # read even without a reward: a missing data file shows now
            check_split(cfg, env, reward, split, split_rows(env, split, cfg.env.name), try_terms=i == 0)
    except BaseException:
        await runner.aclose()
        raise
    return runner, reward


async def check_command(cfg: RunConfig, checks: CommandChecks) -> None:
    """Steps 1-4 as the command runs them, then stop what they started (MCP servers, the env).
    Raises the ConfigError the command would end with; returns when it would go on to load the model."""
    from rlfactory.generation.model_source import check_model_path

    check_model_path(cfg.model.path)  # as open_rollout does first
    env = build_env(cfg)
    try:
        runner, _ = await prepare_tools_and_reward(cfg, env, checks)
        await runner.aclose()
    finally:
        env.close()
