"""The Env contract (DESIGN.md "Env").

An env is built from options, turns one dataset row into the opening messages, runs the model's
tool calls (by default through the shared ToolRunner) and names its reward. A new env is a small
file: tools as typed Python functions or an MCP config, a reward, a dataset.

`Env` is a Protocol. Write `class MyEnv(Env)` to inherit the defaults below and implement only
`reset` (plus, usually, `load_split`, `tools` and `reward`); a class that does not subclass `Env`
must implement every member itself. `make_env` checks either kind and names what is missing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

from rlfactory.chat.base import ParseResult
from rlfactory.rewards.base import Reward
from rlfactory.tools.base import ToolCall, ToolResult
from rlfactory.trajectory import Status, Trajectory

if TYPE_CHECKING:
    from rlfactory.tools.runner import ToolRunner

Message = dict[str, Any]
"""A chat message: {"role": ..., "content": ...} (plus `tool_calls` / `name` where they apply)."""


@dataclass
class EnvTools:
    """The tools an env needs: plain Python functions and/or an MCP config (path or dict)."""

    python: list[Callable[..., Any]] = field(default_factory=list)
    mcp: Any = None


class Env(Protocol):
    """What the rollout engine, the trainer and `rlfactory sft` ask of an env."""

    name: str = "env"
    max_turns: int = 4
    """Model turns per trajectory when `rollout.max_turns` is unset."""

    def reset(self, row: dict[str, Any]) -> list[Message]:
        """Chat messages (system/user) that open the episode for `row`. Required."""
        ...

    def load_split(self, split: str) -> list[dict[str, Any]]:
        """Dataset rows for `train` / `test` (or other splits the env defines)."""
        raise ValueError(f"env {self.name!r} has no {split!r} split")

    def tools(self) -> EnvTools:
        """The tools the env's episodes use (started by the rollout session)."""
        return EnvTools()

    async def step(self, calls: list[ToolCall], runner: ToolRunner) -> list[ToolResult]:
        """Run the model's calls of one turn: one result per call, in order."""
        return await runner.run(calls)

    def reward(self) -> Reward | None:
        """The env's own reward; None when it has none (then `reward:` must be configured)."""
        return None

    def info(self, row: dict[str, Any]) -> dict[str, Any]:
        """What of `row` a trajectory keeps in `Trajectory.info` (rewards read ground truth there)."""
        return dict(row)

    def end_episode(self, trajectory: Trajectory, turn: ParseResult) -> Status | None:
        """Called after each model turn is parsed, before its tool calls run (`turn`: what the
        model's last segment parsed as). Return a status to end the trajectory there with it;
        None lets the rollout go on by its own rules (rlfactory/rollout/episode.py)."""
        return None

    def next_user_turn(self, trajectory: Trajectory) -> str | None:
        """Called when a model turn ends the model's part of a conversation turn (it answered: no
        tool calls), after `end_episode`. Return the next user message of a multi-turn conversation
        (the engine appends it as an observation: a user turn rendered by the chat template, loss
        mask 0, and the model goes on), or None to end the trajectory (the default: one user turn)."""
        return None

    def solve(self, row: dict[str, Any]) -> list[Message]:
        """A demonstration for warm-start SFT: the opening messages of `reset(row)`, then assistant
        turns with `tool_calls`, `tool` turns holding the real tool results, and the final answer.
        An assistant message may carry `"guess": text`, the part of its content that is a guess
        (an answer given without the tools): SFT then learns the turn but not the guessed text,
        which would teach the model to state values without evidence and, in a tiny model, keeps
        it from learning to read them off tool results (issue 29: the search env's guesses)."""
        raise NotImplementedError(f"env {self.name!r} has no solver")

    def augment_demo(self, row: dict[str, Any], messages: list[Message], rng: random.Random) -> list[Message] | None:
        """A variant of `solve(row)`'s demonstration `messages` for one visit of warm-start SFT
        (e.g. the search env's `counterfactual_rate`: the fact read off the last result rewritten,
        in that result and in the answer), or None to train on the demonstration as written (the
        default). Build new messages: `messages` is the written demonstration, shared by every
        visit. `rng` is the visit's own generator, so a run's batches stay reproducible."""
        return None

    def close(self) -> None:
        """Release what the env started (servers, temp dirs). Safe to call twice."""

    def __enter__(self) -> Env:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


REQUIRED = ("reset",)
MEMBERS = ("reset", "load_split", "tools", "step", "reward", "info", "end_episode", "next_user_turn", "solve",
           "close")


def missing_members(env: object) -> list[str]:
    """The members of the Env protocol that `env` lacks (for a subclass of Env: the required ones
    it did not implement)."""
    cls = type(env)
    if Env in cls.__mro__:
        return [m for m in REQUIRED if getattr(cls, m) is getattr(Env, m)]
    missing = [m for m in MEMBERS if not callable(getattr(env, m, None))]
    if not isinstance(getattr(env, "max_turns", None), int):
        missing.append("max_turns")
    return missing


def require_members(env: object) -> None:
    """Raise a TypeError naming what of the Env protocol `env` lacks (nothing when it has all of it)."""
    missing = missing_members(env)
    if missing:
        raise TypeError(f"env {type(env).__qualname__} does not implement {', '.join(missing)} "
                        "(subclass rlfactory.envs.Env to inherit the defaults)")
