"""`env.name: verifiers`: a `verifiers` (v1) taskset as an rlfactory env (`pip install 'rlfactory[verifiers]'`).

    env:
      name: verifiers
      options:
        taskset: my_tasks:MathTaskset    # a verifiers.v1 Taskset subclass (module:Class)
        config: {}                       # fields of its TasksetConfig
        n_test: 10                       # the last 10 tasks are the test split

Each task is a dataset row: its `system_prompt` and `prompt` open the episode. The `@vf.tool`
methods of the task's toolsets (`Task.toolsets(config)`) become rlfactory tools, run in this
process. Scoring builds a verifiers `Trace` of the episode (the prompt, each model turn as an
assistant message with its tool calls, each observation as a tool message) and runs the task's
own `score`: each `@vf.reward` becomes a reward term (its score), and the reward is their
weighted sum, as verifiers adds them. Rewards that need a runtime (a sandbox box) are skipped,
as verifiers skips them offline.
"""

from __future__ import annotations

import json
from typing import Any

from rlfactory.config import ConfigError
from rlfactory.envs.base import Env, EnvTools, Message
from rlfactory.imports import import_ref
from rlfactory.rewards.base import RewardScore, require_scorable
from rlfactory.trajectory import Trajectory


def _verifiers() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        raise ConfigError(f"env.name: verifiers needs the verifiers package (v1 API): pip install 'rlfactory[verifiers]' "
                          f"({type(e).__name__}: {e})") from None
    return vf


class VerifiersEnv(Env):
    """A verifiers (v1) Taskset: its tasks, its toolsets' tools and its @vf.reward scoring."""

    name = "verifiers"

    def __init__(self, taskset: str, config: dict[str, Any] | None = None, n_test: int = 0, max_turns: int = 4,
                 system_prompt: str | None = None) -> None:
        vf = _verifiers()
        from verifiers.v1.configs.taskset import TasksetConfig
        from verifiers.v1.utils.generic import concrete_type

        cls = import_ref(taskset, "env.options.taskset", "class")
        if not (isinstance(cls, type) and issubclass(cls, vf.Taskset)):
            raise ConfigError(f"env.options.taskset: {taskset} is not a verifiers.v1 Taskset subclass")
        config_cls = concrete_type(cls, TasksetConfig) or TasksetConfig
        try:
            self.taskset = cls(config_cls(**(config or {})))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"env.options.config: {config_cls.__name__}: {e}".splitlines()[0]) from None
        if not self.taskset.bounded:
            raise ConfigError(f"env.options.taskset: {taskset} yields tasks forever; bound it in its config")
        self.tasks = list(self.taskset)
        if n_test < 0 or n_test >= len(self.tasks):
            raise ConfigError(f"env.options.n_test: {n_test} of {len(self.tasks)} tasks leaves no training task")
        self.n_test, self.max_turns, self.system_prompt = n_test, max_turns, system_prompt
        self._vf = vf

    # ---- data ------------------------------------------------------------------------------

    def load_split(self, split: str) -> list[dict[str, Any]]:
        cut = len(self.tasks) - self.n_test
        if split == "train":
            indices = range(cut)
        elif split == "test" and self.n_test:
            indices = range(cut, len(self.tasks))
        else:
            raise ValueError(f"env 'verifiers' has no {split!r} split (env.options.n_test sets a test split)")
        return [{"id": self._task_id(i), "task_index": i} for i in indices]

    def _task_id(self, i: int) -> str:
        data = self.tasks[i].data
        return str(data.id or data.name or f"task-{i}")

    def _task(self, row: dict[str, Any]) -> Any:
        try:
            return self.tasks[int(row["task_index"])]
        except (KeyError, ValueError, IndexError, TypeError):
            raise ValueError(f"row {row!r} names no task of this taskset (task_index)") from None

    def reset(self, row: dict[str, Any]) -> list[Message]:
        data = self._task(row).data
        messages: list[Message] = []
        system = self.system_prompt or data.system_prompt
        if system:
            messages.append({"role": "system", "content": system})
        if isinstance(data.prompt, str):
            messages.append({"role": "user", "content": data.prompt})
        else:
            messages.extend(m.model_dump(exclude_none=True) for m in data.prompt or [])
        return messages

    def info(self, row: dict[str, Any]) -> dict[str, Any]:
        return {"task_index": int(row["task_index"]), "task_id": self._task_id(int(row["task_index"]))}

    # ---- tools -----------------------------------------------------------------------------

    def tools(self) -> EnvTools:
        """The `@vf.tool` methods of the toolsets of the taskset's task class."""
        from verifiers.v1.utils.decorators import discover_decorated

        if not self.tasks:
            return EnvTools()
        task = self.tasks[0]
        functions = []
        for toolset in type(task).toolsets(task.config):
            for fn in discover_decorated(toolset, "tool"):
                name = getattr(fn, "tool_name", None) or fn.__name__
                if name != fn.__name__:
                    raise ConfigError(f"env verifiers: tool {fn.__name__} is served as {name!r}; renamed tools are not "
                                      "supported by the adapter")
                functions.append(fn)
        return EnvTools(python=functions)

    # ---- reward ----------------------------------------------------------------------------

    def reward(self) -> "VerifiersReward":
        return VerifiersReward(self)

    def trace(self, trajectory: Trajectory) -> Any:
        """A verifiers Trace of the episode (what the task's @vf.reward functions read)."""
        vf = self._vf
        from verifiers.v1.graph import MessageNode
        from verifiers.v1.trace import AgentInfo, TraceTask

        task = self.tasks[int(trajectory.info["task_index"])]
        opening = self.reset({"task_index": trajectory.info["task_index"]})
        kinds = {"system": vf.SystemMessage, "user": vf.UserMessage, "assistant": vf.AssistantMessage}
        messages: list[tuple[Any, bool]] = [(kinds[m["role"]].model_validate(m), False) for m in opening]
        turn, last_ids = 0, []
        for seg in trajectory.segments[1:]:
            if seg.role == "model":
                calls = [c for c in trajectory.tool_calls if c.turn == turn]
                last_ids = [f"call-{turn}-{k}" for k in range(len(calls))]
                tool_calls = [vf.ToolCall(id=i, name=c.name, arguments=json.dumps(c.arguments, default=str))
                              for i, c in zip(last_ids, calls)] or None
                messages.append((vf.AssistantMessage(content=seg.text, tool_calls=tool_calls), True))
                turn += 1
            else:
                messages.append((vf.ToolMessage(tool_call_id=last_ids[0] if last_ids else f"obs-{turn}",
                                                content=seg.text), False))
        nodes = [MessageNode(parent=i - 1 if i else None, message=m, sampled=sampled)
                 for i, (m, sampled) in enumerate(messages)]
        return vf.Trace(task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                        agent=AgentInfo(config=vf.AgentConfig()), nodes=nodes,
                        stop_condition="max_turns" if trajectory.status == "truncated" else None)


class VerifiersReward:
    """The task's own `score`: @vf.reward scores as terms, their weighted sum as the total."""

    def __init__(self, env: VerifiersEnv) -> None:
        self.env = env

    async def score(self, trajectory: Trajectory) -> RewardScore:
        require_scorable(trajectory)
        trace = self.env.trace(trajectory)
        await self.env.tasks[int(trajectory.info["task_index"])].score(trace)
        rewards = {k: r for k, r in trace.rewards.items() if r is not None}
        terms = {k: float(r.score) for k, r in rewards.items()}
        terms.update({f"metric/{k}": float(v) for k, v in trace.metrics.items() if isinstance(v, (int, float))})
        return RewardScore(total=float(sum(r.value for r in rewards.values())), terms=terms)
