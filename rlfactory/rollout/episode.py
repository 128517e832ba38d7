"""One trajectory in the making: the per-turn rules that the async engine and the lock-step
baseline share (the schedulers in engine.py only decide *when* each step runs).

A turn: `next_request()` -> generate -> `on_generation(result)` -> run the returned calls ->
`on_results(...)`. The trajectory is built token by token as it happens: the model segment is
exactly the sampled ids with their logprobs; observation segments come from
`ToolManager.render_observation`. Nothing is re-tokenized, so `loss_mask` is exact.

How a trajectory ends, and its status:
  ok           the model gave an answer (its turn ended on a stop token/string and parsed as Answer).
  truncated    a limit ended it: a model turn reached its max_new_tokens (or the total token
               budget) before stopping; or the model asked for tools on its last allowed turn
               (max_turns), which are then not run; or the next observation would not fit in
               rollout.max_total_tokens (it is not appended).
  malformed    the model's last turn was a tool call that could not be parsed (on the last allowed
               turn, or when no budget was left after the error observation). A malformed call on an
               earlier turn only gets an error observation with the reason; the model may recover.
  infra_error  the tool layer could not serve a turn: every call of the turn failed with an
               infrastructure status (crashed, circuit_open), or env.step raised. The trajectory
               stops there and `error` says why. A tool's own error, a timeout or bad arguments are
               ordinary observations; so is an infra failure of some (not all) calls of a turn.
               The generator raising GenerationUnavailable (no server could serve the turn) also
               ends the trajectory `infra_error` (the engine calls `on_infra_error`).
`turns` counts model turns (generations).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

from rlfactory.chat.base import Answer, Malformed, ToolCalls, ToolManager
from rlfactory.rollout.config import RolloutConfig, SamplingConfig
from rlfactory.rollout.generator import GenRequest, GenResult
from rlfactory.rollout.trajectory import Segment, ToolCallRecord, Trajectory
from rlfactory.tools.base import CIRCUIT_OPEN, CRASHED, MALFORMED, OK, ToolCall, ToolResult

INFRA_STATUSES = frozenset({CRASHED, CIRCUIT_OPEN})
TRUNCATION_MARK = " [truncated]"


class Episode:
    """The state of one trajectory. Not thread-safe; one coroutine drives it."""

    def __init__(
        self,
        traj: Trajectory,
        prompt_ids: list[int],
        *,
        tool_manager: ToolManager,
        decode: Callable[[list[int]], str],
        rollout: RolloutConfig,
        sampling: SamplingConfig,
        max_turns: int,
        policy_version: int = 0,
        stop_token_ids: Sequence[int] | None = None,
        stop_strings: Sequence[str] | None = None,
        prompt_text: str | None = None,
        session: str | None = None,
    ) -> None:
        self.traj = traj
        self.tm = tool_manager
        self.decode = decode
        self.rollout = rollout
        self.sampling = sampling
        self.max_turns = max_turns
        self.policy_version = policy_version
        self.stop_token_ids = stop_token_ids
        self.stop_strings = stop_strings
        self.session = session
        self.context: list[int] = list(prompt_ids)
        self.done = False
        traj.segments.append(Segment("prompt", list(prompt_ids), prompt_text if prompt_text is not None else decode(prompt_ids)))
        traj.metrics.update(gen_s=0.0, queue_s=0.0, tool_s=0.0, gen_tokens=0.0, obs_tokens=0.0)

    # ---- the turn ---------------------------------------------------------------------------

    def next_request(self) -> GenRequest | None:
        """The next model turn to generate, or None when the trajectory is over."""
        if self.done:
            return None
        budget = self.rollout.max_total_tokens - len(self.context)
        if budget <= 0:
            return self._end("truncated")
        return GenRequest(
            prompt_ids=list(self.context),
            max_new_tokens=min(self.rollout.max_new_tokens, budget),
            sampling=self.sampling,
            stop_token_ids=self.stop_token_ids,
            stop_strings=self.stop_strings,
            session=self.session,
        )

    def on_generation(self, res: GenResult) -> list[ToolCall]:
        """Record a model turn. Returns the tool calls to run now (empty: nothing to run)."""
        t = self.traj
        t.turns += 1
        text = res.text or self.decode(res.token_ids)
        version = self.policy_version if res.policy_version is None else res.policy_version  # a server reports its own
        t.segments.append(Segment("model", list(res.token_ids), text, list(res.logprobs), version))
        self.context.extend(res.token_ids)
        t.metrics["gen_s"] += res.gen_s
        t.metrics["queue_s"] += res.queue_s
        t.metrics["gen_tokens"] += len(res.token_ids)
        if res.finish_reason == "length":
            self._end("truncated")
            return []
        body = res.token_ids[:-1] if res.stop_token is not None else res.token_ids
        parsed = self.tm.parse(self.decode(body) if res.stop_token is not None else text)
        last_turn = t.turns >= self.max_turns
        if isinstance(parsed, Answer):
            self._end("ok")
            return []
        if isinstance(parsed, Malformed):
            t.tool_calls.append(ToolCallRecord("", None, MALFORMED, 0.0, turn=t.turns, error=parsed.reason[:200]))
            if last_turn:
                self._end("malformed")
            else:
                self._observe([ToolResult.error(parsed.reason, status=MALFORMED)], end_status="malformed")
            return []
        if isinstance(parsed, ToolCalls) and parsed.calls:
            if last_turn:
                self._end("truncated")
                return []
            return list(parsed.calls)
        self._end("ok")  # ToolCalls with no call: treat the turn as an answer
        return []

    def on_results(self, calls: list[ToolCall], results: list[ToolResult], seconds: float) -> None:
        """Record the tool turn's results (one per call, in order) and append the observation."""
        t = self.traj
        t.metrics["tool_s"] += seconds
        for call, res in zip(calls, results):
            t.tool_calls.append(
                ToolCallRecord(
                    call.name,
                    call.arguments,
                    res.status,
                    float(res.latency_s),
                    bool(res.cached),
                    turn=t.turns,
                    truncated=bool(res.truncated),
                    error=None if res.status == OK and not res.is_error else res.text[:200],
                )
            )
        if len(results) != len(calls):
            self.on_infra_error(f"the tool step returned {len(results)} results for {len(calls)} calls")
            return
        if results and all(r.status in INFRA_STATUSES for r in results):
            self.on_infra_error("; ".join(f"{c.name}: {r.status}: {r.text[:200]}" for c, r in zip(calls, results)))
            return
        self._observe(list(results))

    def on_infra_error(self, message: str) -> None:
        self.traj.error = message
        self._end("infra_error")

    # ---- helpers ----------------------------------------------------------------------------

    def _observe(self, results: list[ToolResult], end_status: str = "truncated") -> None:
        """Append the observation for `results`, cut to the per-observation budget."""
        obs, cut = self._fit(results)
        if obs is None:
            self.traj.error = "the observation does not fit in rollout.max_observation_tokens"
            self._end(end_status)
            return
        records = self.traj.tool_calls[-len(results):]
        for i in cut:
            records[i].truncated = True
        if len(self.context) + len(obs) >= self.rollout.max_total_tokens:
            self._end(end_status)
            return
        self.traj.segments.append(Segment("observation", obs, self.decode(obs)))
        self.traj.metrics["obs_tokens"] += len(obs)
        self.context.extend(obs)

    def _fit(self, results: list[ToolResult]) -> tuple[list[int] | None, set[int]]:
        """Render `results`; while too long, cut the longest result text and mark it. Returns the
        ids (None if even empty texts do not fit) and which results were cut."""
        limit = self.rollout.max_observation_tokens
        obs = self.tm.render_observation(results)
        if len(obs) <= limit:
            return obs, set()
        texts = [r.text for r in results]
        cut: set[int] = set()
        for _ in range(12):
            i = max(range(len(texts)), key=lambda j: len(texts[j]) - (len(TRUNCATION_MARK) if j in cut else 0))
            body = texts[i][: -len(TRUNCATION_MARK)] if i in cut else texts[i]
            if not body:
                return None, cut
            texts[i] = body[: int(len(body) * min(0.9, limit / len(obs)))] + TRUNCATION_MARK
            cut.add(i)
            obs = self.tm.render_observation([replace(r, text=t) for r, t in zip(results, texts)])
            if len(obs) <= limit:
                return obs, cut
        return None, cut

    def _end(self, status: str) -> None:
        self.traj.status = status  # type: ignore[assignment]
        self.done = True
        return None

    def finish(self) -> Trajectory:
        self.done = True
        return self.traj

