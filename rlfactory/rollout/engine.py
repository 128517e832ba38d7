"""The multi-turn rollout loop: asynchronous engine and lock-step baseline.

async (default): every trajectory is its own coroutine, generate -> parse -> tools -> observe.
  Generation requests go to the generator the moment they are ready, and it batches whatever is
  ready at each decode step (continuous batching), so a trajectory waiting for a tool never holds
  the others back and a slow tool call delays only its own trajectory.
lockstep (baseline, as Search-R1 / RL-Factory): every turn, all live trajectories generate
  together; when the whole batch is done, that turn's tool calls run (`lockstep_tools`: all at
  once, or one after another); then the next turn starts.

The per-turn rules (limits, statuses, observation truncation) live in episode.py and are the same
in both modes. The engine does not score: `Trajectory.reward` stays None.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Callable

from rlfactory.chat.base import ToolManager
from rlfactory.rollout.config import RolloutConfig, SamplingConfig
from rlfactory.rollout.episode import Episode
from rlfactory.rollout.generator import GenerationUnavailable, Generator
from rlfactory.rollout.trajectory import Trajectory
from rlfactory.tools.base import ToolCall


class RolloutEngine:
    """Roll out n trajectories per dataset row with `generator`, `tool_manager`, `runner`, `env`.

    `runner` is a rlfactory.tools ToolRunner (`specs()`, `await run(calls)`); `env` turns a row into
    messages (`reset`) and runs calls (`step`); with env=None the runner runs calls directly and a
    row must carry `messages`. `tokenizer` (default: `generator.tokenizer`) decodes ids to text.
    """

    def __init__(
        self,
        generator: Generator,
        tool_manager: ToolManager,
        runner: Any,
        env: Any,
        rollout: RolloutConfig,
        sampling: SamplingConfig,
        *,
        tokenizer: Any = None,
    ) -> None:
        self.generator = generator
        self.tool_manager = tool_manager
        self.runner = runner
        self.env = env
        self.rollout = rollout
        self.sampling = sampling
        self.tokenizer = tokenizer if tokenizer is not None else getattr(generator, "tokenizer", None)
        if self.tokenizer is None:
            raise ValueError("RolloutEngine needs a tokenizer (pass tokenizer= or give the generator one)")

    # ---- public -----------------------------------------------------------------------------

    async def run(self, rows: list[dict[str, Any]], n: int, policy_version: int = 0) -> list[Trajectory]:
        """n trajectories per row, row-major (row 0's n, then row 1's ...); group = row id or index."""
        episodes = self._episodes(rows, n, policy_version)
        t0 = time.perf_counter()
        try:
            if self.rollout.mode == "lockstep":
                await self._lockstep(episodes, sequential=self.rollout.lockstep_tools == "sequential")
            else:
                await self._async(episodes)
        finally:
            for ep in episodes:
                self._forget(ep)
        wall = time.perf_counter() - t0
        out = []
        for ep in episodes:
            traj = ep.finish()
            traj.metrics.setdefault("wall_s", wall)
            out.append(traj)
        return out

    # ---- schedulers -------------------------------------------------------------------------

    async def _async(self, episodes: list[Episode]) -> None:
        limit = self.rollout.max_concurrent
        gate = asyncio.Semaphore(limit) if limit else None

        async def drive(ep: Episode) -> None:
            if gate is None:
                return await self._drive(ep)
            async with gate:
                return await self._drive(ep)

        tasks = [asyncio.ensure_future(drive(ep)) for ep in episodes]
        try:
            await asyncio.gather(*tasks)
        except BaseException:  # e.g. the generator failed: stop the other trajectories too
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _drive(self, ep: Episode) -> None:
        """One trajectory, start to end, on its own clock."""
        t0 = time.perf_counter()
        try:
            while (request := ep.next_request()) is not None:
                try:
                    result = await self.generator.submit(request)
                except GenerationUnavailable as e:  # e.g. every generation server down: this trajectory only
                    ep.on_infra_error(f"generation: {e}")
                    break
                calls = ep.on_generation(result)
                if calls:
                    await self._tools(ep, calls)
        finally:
            self._forget(ep)
        ep.traj.metrics["wall_s"] = time.perf_counter() - t0

    async def _lockstep(self, episodes: list[Episode], sequential: bool) -> None:
        t0 = time.perf_counter()
        while True:
            ready = [(ep, req) for ep in episodes if (req := ep.next_request()) is not None]
            if not ready:
                break
            try:
                results = await self.generator.generate([req for _, req in ready])
            except GenerationUnavailable as e:  # the whole lock-step batch waits on this generation
                for ep, _ in ready:
                    ep.on_infra_error(f"generation: {e}")
                continue
            todo = [(ep, calls) for (ep, _), res in zip(ready, results) if (calls := ep.on_generation(res))]
            if sequential:
                for ep, calls in todo:
                    await self._tools(ep, calls, one_by_one=True)
            else:
                await asyncio.gather(*(self._tools(ep, calls) for ep, calls in todo))
        for ep in episodes:
            ep.traj.metrics["wall_s"] = time.perf_counter() - t0

    # ---- pieces -----------------------------------------------------------------------------

    def _forget(self, ep: Episode) -> None:
        forget = getattr(self.generator, "forget", None)
        if ep.session is not None and callable(forget):
            forget(ep.session)

    async def _tools(self, ep: Episode, calls: list[ToolCall], one_by_one: bool = False) -> None:
        t0 = time.perf_counter()
        try:
            if one_by_one:
                results = [r for call in calls for r in await self._step([call])]
            else:
                results = await self._step(calls)
        except Exception as e:  # env.step should not raise; if it does, this trajectory cannot go on
            ep.on_infra_error(f"tool step raised {type(e).__name__}: {e}")
            return
        ep.on_results(calls, list(results), time.perf_counter() - t0)

    async def _step(self, calls: list[ToolCall]) -> list:
        if self.env is None:
            return await self.runner.run(calls)
        return await self.env.step(calls, self.runner)

    def _decode(self) -> Callable[[list[int]], str]:
        tok = self.tokenizer
        return lambda ids: tok.decode(ids, skip_special_tokens=False)

    def _episodes(self, rows: list[dict[str, Any]], n: int, policy_version: int) -> list[Episode]:
        tm = self.tool_manager
        specs = list(self.runner.specs()) if self.runner is not None else []
        max_turns = self.rollout.max_turns or int(getattr(self.env, "max_turns", 4) or 4)
        stop_ids = list(tm.stop_token_ids())
        stop_strings = list(tm.stop_strings()) if hasattr(tm, "stop_strings") else []
        decode = self._decode()
        episodes = []
        for index, row in enumerate(rows):
            messages = self.env.reset(row) if self.env is not None else row["messages"]
            prompt_ids = list(tm.render_prompt(messages, specs))
            prompt_text = decode(prompt_ids)
            info = self.env.info(row) if hasattr(self.env, "info") else dict(row)
            group = str(row.get("id", index))
            for k in range(n):
                traj = Trajectory(id=f"{group}-{k}", group=group, info=dict(info))
                episodes.append(
                    Episode(
                        traj,
                        prompt_ids,
                        tool_manager=tm,
                        decode=decode,
                        rollout=self.rollout,
                        sampling=self.sampling,
                        max_turns=max_turns,
                        policy_version=policy_version,
                        stop_token_ids=stop_ids,
                        stop_strings=stop_strings,
                        prompt_text=prompt_text,
                        session=uuid.uuid4().hex if self.rollout.reuse_kv else None,
                    )
                )
        return episodes
