"""The rollout engine: n trajectories per dataset row, each one `rollout_one` (episode.py).

async (default): every trajectory is its own coroutine, generate -> parse -> tools -> observe.
  Generation requests go to the generator the moment they are ready, and it batches whatever is
  ready at each decode step (continuous batching), so a trajectory waiting for a tool never holds
  the others back and a slow tool call delays only its own trajectory.
lockstep (baseline, as Search-R1 / RL-Factory): the same coroutine, but every live trajectory
  waits for all the others before it generates and before its tools run (`Lockstep`): so every
  turn the whole batch generates together, then that turn's tool calls run (`lockstep_tools`:
  all at once, or one after another), then the next turn starts.

The engine does not score: `Trajectory.reward` stays None.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import uuid
from typing import Any, Awaitable, Callable, Sequence

from rlfactory.chat.base import ToolManager
from rlfactory.chat.vision import Rendered, render_prompt
from rlfactory.envs.base import Env, require_members
from rlfactory.config import RolloutConfig, SamplingConfig
from rlfactory.chat.parsing import split_reasoning
from rlfactory.rollout.context import SUMMARY_REQUEST, Conversation, Summarizer, check_context, conversation_text
from rlfactory.chat.turns import turn_text
from rlfactory.rollout.episode import Setup, rollout_one
from rlfactory.protocols import GenRequest, GenResult, Generator, HasTokenizer, KeepsSessions
from rlfactory.rollout.observer import RolloutObserver
from rlfactory.generation.sampling import mix_seed
from rlfactory.tools.base import OK, ToolCall, ToolResult, ToolSpec
from rlfactory.trajectory import Trajectory

log = logging.getLogger("rlfactory.rollout")


class RolloutEngine:
    """Roll out n trajectories per dataset row with `generator`, `tool_manager`, `runner`, `env`.

    `runner` is a rlfactory.tools ToolRunner (`specs()`, `await run(calls)`); `env` (an Env)
    turns a row into messages (`reset`) and runs calls (`step`); env=None is a PromptEnv (a row
    carries its `messages` or `question`). `tokenizer` (default: `generator.tokenizer`) decodes
    prompt and observation ids; the model's ids come decoded from the generator (`GenResult.text`).
    """

    def __init__(
        self,
        generator: Generator,
        tool_manager: ToolManager,
        runner: Any,
        env: Env | None,
        rollout: RolloutConfig,
        sampling: SamplingConfig,
        *,
        tokenizer: Any = None,
    ) -> None:
        if env is None:
            from rlfactory.rollout.prompt_env import PromptEnv

            env = PromptEnv()
        require_members(env)
        self.generator = generator
        self.tool_manager = tool_manager
        self.runner = runner
        self.env = env
        self.rollout = rollout
        self.sampling = sampling
        if tokenizer is None and isinstance(generator, HasTokenizer):
            tokenizer = generator.tokenizer
        self.tokenizer = tokenizer
        if self.tokenizer is None:
            raise ValueError("RolloutEngine needs a tokenizer (pass tokenizer= or give the generator one)")
        check_context(rollout, tool_manager,  # the runner is started by now (a session starts it first)
                      [s.name for s in runner.specs()] if rollout.summary_tool and runner is not None else None)

    def with_generator(self, generator: Generator) -> RolloutEngine:
        """This engine generating with `generator` instead (asynchronous training's copy of the
        policy); everything else shared."""
        other = copy.copy(self)
        other.generator = generator
        return other

    async def run(self, rows: list[dict[str, Any]], n: int, policy_version: int = 0, *,
                  seeds: Sequence[int] | None = None, priority: int = 0,
                  observer: RolloutObserver | None = None) -> list[Trajectory]:
        """n trajectories per row, row-major (row 0's n, then row 1's ...).

        Row i's n trajectories form one group, named after the row's `id` (its index when it has
        none) and unique in this call: a row id met again (a step that wraps around its dataset)
        gets `#2`, `#3`, ... appended. Trajectory ids are `<group>-<k>`.

        `seeds` (one per row), when given, seed the draws of every turn of trajectory k of row i
        from (seeds[i], k, turn) (GenRequest.seed), so each trajectory samples the same tokens
        whatever else is rolled out beside it (in this call, or split over several engines).
        `priority` goes on every turn's request (GenRequest.priority: lower is served first).
        `observer` is told of every trajectory's turns as they happen (observer.py).
        """
        if seeds is not None and len(seeds) != len(rows):
            raise ValueError(f"RolloutEngine.run: {len(seeds)} seeds for {len(rows)} rows")
        lockstep = self.rollout.mode == "lockstep"
        trajs, prompts, conversations = self._start(rows, n)
        schedule: Concurrent | Lockstep = (Lockstep(len(trajs), sequential=self.rollout.lockstep_tools == "sequential")
                                           if lockstep else Concurrent(self.rollout.max_concurrent))
        setup = self._setup(schedule, policy_version, priority, observer)
        # a generator that keeps nothing between turns has nothing to forget
        forget = self.generator.forget if isinstance(self.generator, KeepsSessions) else None

        async def one(i: int) -> None:
            if prompts[i] is None:  # its row could not be made into a prompt (`_start`)
                schedule.leave()
                return
            session = uuid.uuid4().hex if self.rollout.reuse_kv else None
            try:
                async with schedule.slot():
                    await rollout_one(trajs[i], prompts[i].ids, setup, i, session,
                                      None if seeds is None else mix_seed(seeds[i // n], i % n),
                                      prompt_images=prompts[i].images or None, conversation=conversations[i])
            finally:
                schedule.leave()
                if session is not None and forget is not None:
                    forget(session)

        tasks = [asyncio.ensure_future(one(i)) for i in range(len(trajs))]
        try:
            await asyncio.gather(*tasks)
        except BaseException:  # e.g. the generator failed: stop the other trajectories too
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return trajs

    def _setup(self, schedule: Concurrent | Lockstep, policy_version: int, priority: int = 0,
               observer: RolloutObserver | None = None) -> Setup:
        tm, tok = self.tool_manager, self.tokenizer
        stop_ids = list(tm.stop_token_ids())
        return Setup(
            generator=self.generator, tool_manager=tm, env=self.env, runner=self.runner, rollout=self.rollout,
            sampling=self.sampling, schedule=schedule, decode=lambda ids: tok.decode(ids, skip_special_tokens=False),
            max_turns=self.rollout.max_turns or int(self.env.max_turns), policy_version=policy_version,
            stop_token_ids=stop_ids, stop_strings=list(tm.stop_strings()),
            stop_texts={i: tok.decode([i], skip_special_tokens=False) for i in stop_ids},
            one_call_at_a_time=self.rollout.mode == "lockstep" and self.rollout.lockstep_tools == "sequential",
            priority=priority, observer=observer,
            summarize=self._summarizer(priority) if self.rollout.context == "summarize" else None,
        )

    def _summarizer(self, priority: int) -> Summarizer:
        """rollout.context=summarize: `rollout.summary_tool` called with the conversation as text, or
        else the policy asked for a summary after the conversation (its tokens are not trained).
        Raises when the tool fails (the trajectory ends infra_error, saying why)."""
        rollout, tm = self.rollout, self.tool_manager
        stop_ids = list(tm.stop_token_ids())
        stop_texts = {i: self.tokenizer.decode([i], skip_special_tokens=False) for i in stop_ids}

        async def by_tool(messages: list[dict[str, Any]], tools: list[ToolSpec]) -> str:
            [result] = await self.runner.run([ToolCall(str(rollout.summary_tool), {"text": conversation_text(messages)})])
            if result.status != OK or result.is_error:
                raise RuntimeError(f"the summary tool {rollout.summary_tool!r} failed ({result.status}): {result.text[:200]}")
            return result.text

        async def by_policy(messages: list[dict[str, Any]], tools: list[ToolSpec]) -> str:
            prompt = list(tm.render_prompt([*messages, {"role": "user", "content": SUMMARY_REQUEST}], tools))
            result = await self.generator.submit(GenRequest(prompt, rollout.summary_max_tokens, self.sampling, stop_ids,
                                                            list(tm.stop_strings()), None, None, priority))
            return split_reasoning(turn_text(result, stop_texts))[1]

        return by_tool if rollout.summary_tool else by_policy

    def _start(self, rows: list[dict[str, Any]], n: int
               ) -> tuple[list[Trajectory], list[Rendered | None], list[Conversation | None]]:
        """The empty trajectories (id, group, info), their prompt ids and their conversations (the
        env's messages and tools; only for a rollout.context that re-renders), row-major. A row that
        `env.reset`, `env.info` or `render_prompt` cannot take gives n trajectories that are
        already over: status infra_error, no segments, prompt None, `error` saying why."""
        specs = list(self.runner.specs()) if self.runner is not None else []
        trajs: list[Trajectory] = []
        prompts: list[Rendered | None] = []
        conversations: list[Conversation | None] = []
        rerender = self.rollout.context in ("drop_thinking", "summarize")
        for row, group in zip(rows, group_names(rows)):
            prompt: Rendered | None
            conversation = None
            try:
                messages, tools = self.env.reset(row), row_tool_specs(row, specs)
                prompt = render_prompt(self.tool_manager, messages, tools)
                conversation = Conversation(list(messages), tools) if rerender else None
                info, error = self.env.info(row), None
            except Exception as e:  # a bad row costs its own trajectories only
                prompt, info = None, {}
                error = f"the row could not be made into a prompt: {type(e).__name__}: {e}"[:1000]
                log.warning("row %s: %s", group, error)
            for j in range(n):
                traj = Trajectory(id=f"{group}-{j}", group=group, info=dict(info))
                if error is not None:
                    traj.status, traj.error = "infra_error", error
                trajs.append(traj)
                prompts.append(prompt)
                conversations.append(conversation)
        return trajs, prompts, conversations


def row_tool_specs(row: dict[str, Any], default: list[ToolSpec]) -> list[ToolSpec]:
    """The tools a row's prompt shows: its own `tools` column when it has one (OpenAI-style
    `{"type": "function", "function": {name, description, parameters}}` or the bare function, as
    TRL's and BFCL's datasets carry them: every row its own functions), else `default` (the env's)."""
    tools = row.get("tools")
    if tools is None:
        return default
    if not isinstance(tools, list):
        raise ValueError(f"the row's tools must be a list of functions, not {type(tools).__name__}")
    specs = []
    for tool in tools:
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f"a tool of the row is not a function with a name: {str(tool)[:200]}")
        specs.append(ToolSpec(fn["name"], str(fn.get("description", "")), dict(fn.get("parameters") or {})))
    return specs


def failed_trajectories(rows: list[dict[str, Any]], n: int, error: str) -> list[Trajectory]:
    """What `run(rows, n)` gives when it cannot roll them out at all: the same ids and groups,
    every trajectory `infra_error` with `error` and no segments (the trainer's stand-in for a
    rollout that raised)."""
    return [Trajectory(id=f"{group}-{j}", group=group, status="infra_error", error=error)
            for group in group_names(rows) for j in range(n)]


def group_names(rows: list[dict[str, Any]]) -> list[str]:
    """The group name of each row of one `RolloutEngine.run` call: the row's `id` (its index
    when it has none), with `#2`, `#3`, ... appended to a name met again."""
    names, seen = [], set()
    for index, row in enumerate(rows):
        group = name = str(row.get("id", index))
        k = 1
        while group in seen:
            k += 1
            group = f"{name}#{k}"
        seen.add(group)
        names.append(group)
    return names


class Concurrent:
    """async mode: nobody waits for anybody; at most `limit` trajectories in flight (None: all)."""

    def __init__(self, limit: int | None = None) -> None:
        self._gate = asyncio.Semaphore(limit) if limit else None

    def slot(self) -> asyncio.Semaphore | _NoGate:
        return self._gate if self._gate is not None else _NoGate()

    async def generate(self, generator: Generator, request: GenRequest, index: int) -> GenResult:
        return await generator.submit(request)

    async def tools(self, run: Callable[[], Awaitable[list[ToolResult]]], index: int) -> list[ToolResult]:
        return await run()

    def leave(self) -> None:
        pass


class Lockstep:
    """The lock-step barrier. A live trajectory waits at one of two points, before generating or
    before running its tools; when every live trajectory is waiting, one point is released: the
    tool point if anyone waits there (this turn's tools), else the generation point (the next
    turn, generated as one batch). Trajectories are released in index order, so the batch and the
    order of the tool calls do not depend on timing. `leave` is called when a trajectory ends.
    `sequential`: the released tool turns run one after another, in index order (and with
    `Setup.one_call_at_a_time`, each turn's calls one by one)."""

    def __init__(self, live: int, sequential: bool = False) -> None:
        self.live = live
        self.waiting: dict[str, list[tuple[int, asyncio.Future]]] = {"generate": [], "tools": []}
        self._tool_lock = asyncio.Lock() if sequential else None

    def slot(self) -> _NoGate:
        return _NoGate()

    async def generate(self, generator: Generator, request: GenRequest, index: int) -> GenResult:
        await self._wait("generate", index)
        return await generator.submit(request)

    async def tools(self, run: Callable[[], Awaitable[list[ToolResult]]], index: int) -> list[ToolResult]:
        await self._wait("tools", index)
        if self._tool_lock is None:
            return await run()
        async with self._tool_lock:  # released in index order, so acquired in index order
            return await run()

    def leave(self) -> None:
        self.live -= 1
        asyncio.get_running_loop().call_soon(self._release)

    async def _wait(self, point: str, index: int) -> None:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.waiting[point].append((index, future))
        # Released from the loop, not from here: so the last to arrive waits like the others, and
        # all wake up in index order.
        loop.call_soon(self._release)
        await future

    def _release(self) -> None:
        if sum(len(w) for w in self.waiting.values()) < self.live or self.live <= 0:
            return
        point = "tools" if self.waiting["tools"] else "generate"
        released, self.waiting[point] = sorted(self.waiting[point], key=lambda w: w[0]), []
        for _, future in released:
            if not future.done():
                future.set_result(None)


class _NoGate:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: Any) -> None:
        return None
