"""A small verifiers (v1) taskset written with verifiers' own classes: addition questions, an
`add` tool in a Toolset, and two @vf.reward functions (test fixture of test_envs_adapters)."""

from __future__ import annotations

import verifiers.v1 as vf


class ArithData(vf.TaskData):
    answer: int


class ArithTools(vf.Toolset):
    @vf.tool
    def add(self, a: int, b: int) -> str:
        """Add two whole numbers.

        Args:
            a: the first number
            b: the second number
        """
        return str(a + b)


class ArithTask(vf.Task[ArithData, vf.State, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config):
        return [ArithTools(vf.ToolsetConfig())]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(str(self.data.answer) in trace.last_reply)

    @vf.reward(weight=0.5)
    async def used_tool(self, trace: vf.Trace) -> float:
        calls = [c for m in trace.assistant_messages for c in (m.tool_calls or [])]
        return float(any(c.name == "add" for c in calls))

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class ArithTaskset(vf.Taskset[ArithTask, vf.TasksetConfig]):
    def load(self):
        for i in range(6):
            a, b = 3 + i, 10 + 2 * i
            yield ArithTask(ArithData(id=f"add-{i}", prompt=f"What is {a} + {b}? Use the add tool.", answer=a + b,
                                      system_prompt="You add numbers with tools."))
