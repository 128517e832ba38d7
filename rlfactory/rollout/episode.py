"""One trajectory, top to bottom: `rollout_one`. The engine (engine.py) runs one per trajectory.

A turn: generate -> record the model segment -> parse -> stop rules -> tools -> fit the
observation -> next turn. A turn that answers (no tool calls) ends the trajectory, unless the env
has a next user message (`Env.next_user_turn`, multi-turn conversations): then that user turn,
rendered by the chat template (`render_user_turn`), is the turn's observation.

The trajectory is built token by token as it happens: the model segment is exactly the sampled
ids with their logprobs and the generator's text of them (decoded once, by the generator);
observation segments come from `ToolManager.render_observation` (or `render_user_turn`). Nothing
is re-tokenized, so `loss_mask` is exact.

How a trajectory ends, and its status:
  ok           the model gave an answer (its turn ended on a stop token/string and parsed as Answer)
               and the env had no next user turn.
  truncated    a limit ended it: a model turn reached its max_new_tokens (or the total token
               budget) before stopping; or the model asked for tools on its last allowed turn
               (max_turns), which are then not run, or answered on it while the env had a next user
               turn; or the next observation (tool results or user turn) would not fit in
               rollout.max_total_tokens (it is not appended).
  malformed    the model's last turn was a tool call that could not be parsed (on the last allowed
               turn, or when no budget was left after the error observation), or the parser
               raised (`error` holds the exception). A malformed call on an earlier turn only gets
               an error observation with the reason; the model may recover.
  infra_error  the tool layer could not serve a turn: every call of the turn failed with one of
               `rollout.infra_statuses` (default crashed, circuit_open, unresponsive), or
               env.step raised or returned the wrong number or kind of results; or the tool
               manager raised rendering the observation or the next user turn. The trajectory stops
               there and `error` says why. A tool's own error, an ordinary timeout or bad
               arguments are observations the model reads; so is an infra failure of some (not
               all) calls of a turn. The generator raising GenerationUnavailable (no server could
               serve the turn) also ends the trajectory `infra_error`.
  (any)        the env's `end_episode(trajectory, parsed)` hook returned a status after a turn.
`turns` counts model turns (generations).

Scheduling is not this file's business: `schedule.generate` / `schedule.tools` are where the
lock-step baseline makes every live trajectory wait for the others (engine.py); in async mode
they simply go ahead.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Awaitable, Callable, Protocol, Sequence

from rlfactory.chat.base import Answer, Malformed, ToolCalls, ToolManager, UserTurnRenderer
from rlfactory.chat.turns import parse_turn, turn_text
from rlfactory.chat.vision import Rendered, VisionToolManager, render_observation
from rlfactory.envs.base import Env
from rlfactory.config import RolloutConfig, SamplingConfig
from rlfactory.protocols import GenerationUnavailable, GenRequest, GenResult, Generator
from rlfactory.branches import branch_reason, extends
from rlfactory.rollout.context import Conversation, Summarizer, Turn, open_history
from rlfactory.rollout.observer import RolloutObserver
from rlfactory.generation.sampling import mix_seed
from rlfactory.images import Image
from rlfactory.text import valid_text
from rlfactory.tools.base import MALFORMED, NOT_RUN, OK, ToolCall, ToolResult
from rlfactory.trajectory import STATUSES, Branch, Segment, Status, ToolCallRecord, Trajectory

TRUNCATION_MARK = " [truncated]"


class Schedule(Protocol):
    """Where a trajectory's two waits happen (engine.py: `Concurrent` or `Lockstep`)."""

    async def generate(self, generator: Generator, request: GenRequest, index: int) -> GenResult: ...

    async def tools(self, run: Callable[[], Awaitable[list[ToolResult]]], index: int) -> list[ToolResult]: ...


@dataclass(frozen=True)
class Setup:
    """What every trajectory of one `RolloutEngine.run` shares."""

    generator: Generator
    tool_manager: ToolManager
    env: Env
    runner: object
    """The ToolRunner `env.step` runs calls with."""
    rollout: RolloutConfig
    sampling: SamplingConfig
    schedule: Schedule
    decode: Callable[[list[int]], str]
    """Decodes prompt and observation ids (the model's ids come decoded from the generator)."""
    max_turns: int
    policy_version: int
    stop_token_ids: Sequence[int]
    stop_strings: Sequence[str]
    stop_texts: dict[int, str]
    """The text of each stop token, cut off the end of a turn's text before parsing."""
    one_call_at_a_time: bool = False
    priority: int = 0
    """GenRequest.priority of every turn."""
    observer: RolloutObserver | None = None
    """Told of each turn as it happens (observer.py); None: nobody watches."""
    summarize: Summarizer | None = None
    """rollout.context=summarize: who writes the summary (the policy or rollout.summary_tool)."""


async def rollout_one(traj: Trajectory, prompt_ids: list[int], setup: Setup, index: int,
                      session: str | None = None, seed: int | None = None,
                      prompt_images: list[Image] | None = None,
                      conversation: Conversation | None = None) -> Trajectory:
    """Roll out `traj` (empty, with its id, group and info) from `prompt_ids` until it ends.

    `index` orders this trajectory among the others of its run (the lock-step barrier releases in
    that order); `session` names its KV cache in the generator (kept between its turns); `seed`,
    when given, seeds each turn's draws (GenRequest.seed = mix_seed(seed, turn)); `prompt_images`
    are the images the prompt's pads stand for (a vision-language ToolManager's); `conversation`,
    the env's messages and tools, is what `rollout.context` drop_thinking and summarize re-render
    (context.py: each turn's next prompt; one that does not extend the last adds a
    `traj.branches` entry, where a new sample of the episode starts). Returns
    `traj`, filled in: segments, tool calls, turns, status, error, and metrics: gen_s, queue_s
    (the generator's GenResult timings, summed over turns), tool_s (waiting for tools, barrier
    included), gen_tokens, obs_tokens, wall_s (this trajectory's own start to end). Never raises
    for the trajectory's own failures (they become its status, GenerationUnavailable included);
    any other generator failure, or an env hook returning something that is not a status, propagates.
    `setup.observer`, when set, is told of each turn's start, tokens, tools and end (observer.py).
    """
    t0 = time.perf_counter()
    rollout, tm, observer = setup.rollout, setup.tool_manager, setup.observer
    in_turn = False  # between the observer's turn_started and turn_ended
    traj.segments.append(Segment("prompt", list(prompt_ids), setup.decode(prompt_ids), images=prompt_images or None))
    traj.metrics.update(gen_s=0.0, queue_s=0.0, tool_s=0.0, gen_tokens=0.0, obs_tokens=0.0)
    context = list(prompt_ids)
    history = open_history(rollout, tm, context, conversation, setup.summarize)
    try:
        while True:
            # 1. Generate the next model turn; the prompt is the whole context so far.
            budget = rollout.max_total_tokens - len(context)
            if budget <= 0:
                return _end(traj, "truncated")
            request = GenRequest(list(context), min(rollout.max_new_tokens, budget), setup.sampling,
                                 setup.stop_token_ids, setup.stop_strings, session,
                                 None if seed is None else mix_seed(seed, traj.turns), setup.priority,
                                 images=traj.images() or None)  # a VL generator encodes each new one
            if observer is not None:
                observer.turn_started(traj, request)
                in_turn = True
            try:
                result = await setup.schedule.generate(setup.generator, request, index)
            except GenerationUnavailable as e:  # e.g. every generation server down: this trajectory only
                traj.error = f"generation: {e}"[:1000]
                return _end(traj, "infra_error")

            # 2. Record it as sampled: ids, logprobs and the generator's text (the one decode).
            traj.turns += 1
            version = setup.policy_version if result.policy_version is None else result.policy_version  # a server reports its own
            traj.segments.append(Segment("model", list(result.token_ids), result.text, list(result.logprobs), version))
            context.extend(result.token_ids)
            _add(traj, gen_s=result.gen_s, queue_s=result.queue_s, gen_tokens=len(result.token_ids))
            if observer is not None:
                observer.tokens_generated(traj, result)
            if result.finish_reason == "length":
                return _end(traj, "truncated")

            # 3. Parse the turn (without its stop token).
            try:
                text = turn_text(result, setup.stop_texts)
                parsed = await parse_turn(tm, text)
            except Exception as e:  # parse() must not raise; if it does, only this trajectory ends
                reason = f"the parser raised {type(e).__name__}: {e}"
                traj.tool_calls.append(ToolCallRecord("", None, MALFORMED, 0.0, turn=traj.turns, error=reason[:200]))
                traj.error = reason[:1000]
                return _end(traj, "malformed")

            # 4. Stop rules: the env's hook, an answer (unless the env has a next user turn), the
            # last allowed turn.
            user, shown = None, []  # the observation's user turn or tool results (context.Turn)
            status = setup.env.end_episode(traj, parsed)
            if status is not None:
                if status not in STATUSES:
                    raise ValueError(f"env {setup.env.name!r}: end_episode returned {status!r}; "
                                     f"expected None or one of {', '.join(STATUSES)}")
                return _end(traj, status)
            last_turn = traj.turns >= setup.max_turns
            if isinstance(parsed, Answer) or (isinstance(parsed, ToolCalls) and not parsed.calls):
                user = next_user_turn(traj, setup)
                if user is None:
                    return _end(traj, "ok")
                if last_turn:
                    return _end(traj, "truncated")  # the conversation has more turns than the rollout allows
                # 5. The env's next user message is this turn's observation.
                try:
                    rendered = Rendered(render_user_turn(tm, user))
                except Exception as e:  # a family without user turns, or a template that cannot render it
                    traj.error = f"rendering the next user turn raised {type(e).__name__}: {e}"[:1000]
                    return _end(traj, "infra_error")
                traj.metrics["user_turns"] = traj.metrics.get("user_turns", 0.0) + 1
                overflow: Status = "truncated"
            else:
                if isinstance(parsed, Malformed):
                    traj.tool_calls.append(ToolCallRecord("", None, MALFORMED, 0.0, turn=traj.turns,
                                                          error=parsed.reason[:200]))
                    if last_turn:
                        return _end(traj, "malformed")
                    results, overflow = [ToolResult.error(parsed.reason, status=MALFORMED)], "malformed"
                else:
                    if last_turn:
                        return _end(traj, "truncated")  # the calls of the last allowed turn are not run

                    # 5. Tools: run the turn's calls (at most max_calls_per_turn of them); a turn the
                    # tool layer could not serve ends here.
                    calls = list(parsed.calls)
                    results, error = await run_tools(traj, calls[: rollout.max_calls_per_turn], setup, index)
                    if error is not None:
                        traj.error = error
                        return _end(traj, "infra_error")
                    if len(calls) > rollout.max_calls_per_turn:
                        results.append(not_run(traj, len(calls) - rollout.max_calls_per_turn, rollout.max_calls_per_turn))
                    overflow = "truncated"

                # 6. Fit the observation into its own budget and what is left of the trajectory's. A
                # tool manager that cannot render it ends this trajectory only.
                try:
                    fitted, cut, shown = fit_observation(tm, results, rollout.max_observation_tokens)
                except Exception as e:
                    traj.error = f"rendering the observation raised {type(e).__name__}: {e}"[:1000]
                    return _end(traj, "infra_error")
                if fitted is None:
                    traj.error = "the observation does not fit in rollout.max_observation_tokens"
                    return _end(traj, overflow)
                rendered = fitted
                records = traj.tool_calls[-len(results):]
                for i in cut:
                    records[i].truncated = True
            obs = rendered.ids
            try:  # the next prompt: context + obs, unless rollout.context rewrites the history (context.py)
                nxt, why = ((context + obs, "") if history is None else
                            await history.next_prompt(context, obs, Turn(list(result.token_ids), text, parsed, shown, user)))
            except Exception as e:  # a template that cannot re-render, a summarizer that failed: this trajectory only
                traj.error = f"rollout.context={rollout.context}: {type(e).__name__}: {e}"[:1000]
                return _end(traj, "infra_error")
            if len(nxt) >= rollout.max_total_tokens:
                return _end(traj, overflow)
            if extends(nxt, context):  # one sequence: what the next prompt adds is the observation
                obs = nxt[len(context):]
                traj.segments.append(Segment("observation", obs, setup.decode(obs), images=rendered.images or None))
            else:  # rewritten: the observation as it happened, then a new sample from `nxt`
                traj.segments.append(Segment("observation", obs, setup.decode(obs), images=rendered.images or None))
                diff, where = branch_reason(context, nxt, setup.decode, f"sample {len(traj.branches)}")
                traj.branches.append(Branch(len(traj.segments), list(nxt), setup.decode(nxt), diff, f"{why}; {where}"))
                traj.metrics["samples"] = float(len(traj.branches) + 1)
            context = nxt
            _add(traj, obs_tokens=len(obs))
            if observer is not None:
                in_turn = False
                observer.turn_ended(traj)
    finally:
        traj.metrics["wall_s"] = time.perf_counter() - t0
        if in_turn and observer is not None:  # the trajectory ended (or raised) during this turn
            observer.turn_ended(traj)


def next_user_turn(traj: Trajectory, setup: Setup) -> str | None:
    """The env's next user message after the model answered (`Env.next_user_turn`), told to the
    observer; None ends the trajectory. An env returning something else raises (a bug of the env)."""
    user = setup.env.next_user_turn(traj)
    if user is not None and not isinstance(user, str):
        raise ValueError(f"env {setup.env.name!r}: next_user_turn returned a {type(user).__name__}; "
                         "expected the user message's text or None")
    if user is not None and setup.observer is not None:
        setup.observer.user_turn(traj, user)
    return user


def render_user_turn(tm: ToolManager, text: str) -> list[int]:
    """`tm.render_user_turn(text)`; a ValueError naming the family when it cannot render user turns."""
    if not isinstance(tm, UserTurnRenderer):
        raise ValueError(f"the {tm.family!r} tool manager cannot render a user turn in the middle of an "
                         "episode (qwen3, llama3 and template can)")
    return list(tm.render_user_turn(valid_text(text)[0]))


async def run_tools(traj: Trajectory, calls: list[ToolCall], setup: Setup, index: int
                    ) -> tuple[list[ToolResult], str | None]:
    """Run one turn's calls through `env.step` and record them on `traj`. Returns (results, None),
    or ([], why) when the tool layer could not serve the turn (status infra_error)."""

    async def step() -> list[ToolResult]:
        if setup.one_call_at_a_time:
            return [r for call in calls for r in await setup.env.step([call], setup.runner)]
        return list(await setup.env.step(calls, setup.runner))

    if setup.observer is not None:
        setup.observer.tools_started(traj, calls)
    t0 = time.perf_counter()
    try:
        results = await setup.schedule.tools(step, index)
    except Exception as e:  # env.step should not raise; if it does, this trajectory cannot go on
        return [], f"tool step raised {type(e).__name__}: {e}"
    finally:
        _add(traj, tool_s=time.perf_counter() - t0)
    wrong = next((r for r in results if not isinstance(r, ToolResult)), None)
    if wrong is not None:
        return [], f"the tool step returned a {type(wrong).__name__} where a ToolResult belongs"
    results = [_valid(r) for r in results]
    if setup.observer is not None:
        setup.observer.tool_results(traj, calls, results)
    for call, res in zip(calls, results):
        traj.tool_calls.append(ToolCallRecord(
            call.name, call.arguments, res.status, float(res.latency_s), bool(res.cached), turn=traj.turns,
            truncated=bool(res.truncated), error=None if res.status == OK and not res.is_error else res.text[:200],
            replaced_chars=res.replaced_chars))
    if len(results) != len(calls):
        return [], f"the tool step returned {len(results)} results for {len(calls)} calls"
    infra = setup.rollout.infra_statuses
    if results and all(r.status in infra for r in results):
        return [], "; ".join(f"{c.name}: {r.status}: {r.text[:200]}" for c, r in zip(calls, results))
    bad_reward = record_step_reward(traj, calls, results)
    return ([], bad_reward) if bad_reward else (results, None)


def record_step_reward(traj: Trajectory, calls: list[ToolCall], results: list[ToolResult]) -> str | None:
    """Record the scores that env.step's results carry (`ToolResult.reward`: the env's step reward
    or a tool's own score), summed, as the `step` term and reward of the turn's model segment.
    Returns why not (the trajectory then ends infra_error) when a score is not a finite number."""
    scores = []
    for call, r in zip(calls, results):
        if r.reward is None:
            continue
        value = r.reward
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"{call.name}: the tool step's result has reward {value!r:.100}, not a finite number"
        scores.append(float(value))
    if scores:
        seg = next(s for s in reversed(traj.segments) if s.role == "model")
        seg.reward_terms = {**(seg.reward_terms or {}), "step": sum(scores)}
        seg.reward = (seg.reward or 0.0) + sum(scores)
    return None


def not_run(traj: Trajectory, extra: int, limit: int) -> ToolResult:
    """The result the model reads in place of the `extra` calls of its turn past `limit`; recorded
    as one tool call of status `not_run` and counted in the `calls_not_run` metric."""
    res = ToolResult.error(f"{extra} more tool call(s) of this turn were not run: at most {limit} run per turn", NOT_RUN)
    traj.tool_calls.append(ToolCallRecord("", None, NOT_RUN, 0.0, turn=traj.turns, error=res.text))
    traj.metrics["calls_not_run"] = traj.metrics.get("calls_not_run", 0.0) + extra
    return res


def _valid(result: ToolResult) -> ToolResult:
    """`result` with valid Unicode text (an env's own step may bypass the ToolRunner, which does
    the same): a lone surrogate would make the tokenizer raise."""
    text, replaced = valid_text(result.text)
    if not replaced and text is result.text:
        return result
    return replace(result, text=text, replaced_chars=result.replaced_chars + replaced)


def fit_observation(tm: ToolManager, results: list[ToolResult], limit: int
                    ) -> tuple[Rendered | None, set[int], list[ToolResult]]:
    """Render `results` within `limit` tokens. Images are never cut: a vision-language manager first
    drops whole images, the last first, each leaving a note (`fit_images`). Then, while longer than
    `limit`, the longest result text is cut (never into those notes) and marked. Returns the
    rendering (ids, and images for a vision-language manager; None if even empty texts do not fit),
    which results were cut, and the results as rendered (their texts cut)."""
    keep = [0] * len(results)
    if isinstance(tm, VisionToolManager):
        results, keep = tm.fit_images(results, limit)
    obs = render_observation(tm, results)
    if len(obs.ids) <= limit:
        return obs, set(), list(results)
    # Tokens no text cut removes (images, markup): the texts share what is left of the limit.
    fixed = len(render_observation(tm, [replace(r, text="") for r in results]).ids) if obs.images else 0
    texts = [r.text for r in results]
    cut: set[int] = set()
    for _ in range(12):
        i = max(range(len(texts)), key=lambda j: len(texts[j]) - keep[j] - (len(TRUNCATION_MARK) if j in cut else 0))
        body = texts[i][: -len(TRUNCATION_MARK)] if i in cut else texts[i]
        if len(body) <= keep[i]:
            break
        share = min(0.9, (limit - fixed) / max(1, len(obs.ids) - fixed))
        texts[i] = body[: max(keep[i], int(len(body) * share))] + TRUNCATION_MARK
        cut.add(i)
        shown = [replace(r, text=t) for r, t in zip(results, texts)]
        obs = render_observation(tm, shown)
        if len(obs.ids) <= limit:
            return obs, cut, shown
    if any(keep):  # the notes of dropped images fit (fit_images saw to it), without a mark after them
        shown = [replace(r, text=r.text[:k]) for r, k in zip(results, keep)]
        obs = render_observation(tm, shown)
        if len(obs.ids) <= limit:
            return obs, cut | {j for j, (r, k) in enumerate(zip(results, keep)) if len(r.text) > k}, shown
    return None, cut, []


def _end(traj: Trajectory, status: Status) -> Trajectory:
    traj.status = status
    return traj


def _add(traj: Trajectory, **amounts: float) -> None:
    for key, value in amounts.items():
        traj.metrics[key] += value
