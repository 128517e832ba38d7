"""`rollout.context`: what the model sees of its own history from the second turn on.

rollout_one (episode.py) asks a trajectory's `History` for the next prompt after each turn's
observation. When that prompt extends the previous one token for token, the trajectory goes on
as one sequence; when it does not, the history was rewritten and a new sample of the same
episode starts there (`Trajectory.branches`; branches.py turns them into samples). No mode
re-encodes a sampled token where it is trained: rewritten history is context (loss mask 0).

  keep            no History: the whole conversation as sampled (one growing sequence).
  sliding_window  token level: the prompt (system and first user turn) and the last
                  `context_turns` turns (a model turn and its observation), as sampled. From
                  turn context_turns + 1 on, every turn starts a new sample.
  drop_thinking   message level: the conversation re-rendered by the ToolManager's chat
                  template, with the `<think>` blocks of every earlier turn left out (what Qwen3's
                  template does to turns before the last user message). A turn without thinking
                  whose re-rendering equals its sampled tokens continues the sample.
  summarize       token level until the context passes `summarize_at` tokens; then the turns
                  before the last are summarised (by the policy, or `summary_tool` given them as
                  text), and the next prompt is the env's messages, one user message holding the
                  summary, and the last turn (re-rendered by the chat template).

Message-level modes need the env's messages and tools (`Conversation`). Every mode but keep is for
text-only tool managers (a rewritten prompt would hold image pads without their images).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol

from rlfactory.chat.base import Malformed, ParseResult, ToolCalls, ToolManager
from rlfactory.chat.parsing import split_reasoning
from rlfactory.chat.vision import VisionToolManager
from rlfactory.config import ConfigError, RolloutConfig
from rlfactory.config.base import closest
from rlfactory.tools.base import ToolResult, ToolSpec

SUMMARY_REQUEST = ("Summarize the conversation so far for yourself: the task, what each tool call returned, "
                   "and what is still to do. Write only the summary.")
"""The user message that asks the policy for a summary (after the conversation so far)."""
SUMMARY_INTRO = "Summary of the earlier turns of this conversation:\n"


@dataclass(frozen=True)
class Conversation:
    """The env's messages (`Env.reset`) and the tools its prompt shows: what message-level modes
    re-render."""

    messages: list[dict[str, Any]]
    tools: list[ToolSpec]


@dataclass(frozen=True)
class Turn:
    """One finished turn, as the next prompt needs it."""

    model_ids: list[int]
    text: str
    """The model's text without its stop token (what the parser read)."""
    parsed: ParseResult
    results: list[ToolResult]
    """The tool results as shown (cut to fit max_observation_tokens); [] after a user turn."""
    user: str | None = None
    """The env's next user message, when that is the observation (multi-turn conversations)."""


Summarizer = Callable[[list[dict[str, Any]], list[ToolSpec]], Awaitable[str]]
"""(messages so far, tools) -> the summary's text (the policy's or a tool's; engine.py builds it)."""


class History(Protocol):
    async def next_prompt(self, context: list[int], obs: list[int], turn: Turn) -> tuple[list[int], str]:
        """The prompt of the next turn after `context` (the last prompt and the turn's sampled
        ids), `obs` (the turn's observation ids) and `turn`; and why it is not `context + obs`
        ("" when it is)."""
        ...


def open_history(rollout: RolloutConfig, tm: ToolManager, prompt_ids: list[int],
                 conversation: Conversation | None, summarize: Summarizer | None) -> History | None:
    """The trajectory's History for `rollout.context` (None for keep)."""
    mode = rollout.context
    if mode == "keep":
        return None
    check_context(rollout, tm)
    if mode == "sliding_window":
        return SlidingWindow(prompt_ids, rollout.context_turns)
    if conversation is None:
        raise ValueError(f"rollout.context={mode} re-renders the conversation: rollout_one needs its Conversation")
    if mode == "drop_thinking":
        return DropThinking(tm, conversation)
    if summarize is None:
        raise ValueError("rollout.context=summarize needs a summarizer (the policy or rollout.summary_tool)")
    limit = rollout.summarize_at if rollout.summarize_at is not None else rollout.max_total_tokens * 3 // 4
    return Summarize(tm, conversation, limit, summarize)


def check_context(rollout: RolloutConfig, tm: ToolManager, tool_names: list[str] | None = None) -> None:
    """A ConfigError naming the key when `rollout.context` cannot run with `tm` (every mode but keep
    rewrites text-only histories: a rewritten prompt would hold image pads without their images)
    or `rollout.summary_tool` is not one of `tool_names` (None: not checked)."""
    if rollout.context == "keep":
        return
    if isinstance(tm, VisionToolManager):
        raise ConfigError(f"rollout.context={rollout.context} rewrites text-only histories; the {tm.family!r} "
                          "tool manager renders images (use rollout.context=keep)")
    if rollout.context == "summarize" and rollout.summary_tool and tool_names is not None \
            and rollout.summary_tool not in tool_names:
        near = closest(rollout.summary_tool, tool_names)
        raise ConfigError(f"rollout.summary_tool: no tool named {rollout.summary_tool!r}"
                          f"{f' (did you mean {near!r}?)' if near else ''}; the tools are: {', '.join(tool_names) or 'none'}")


class SlidingWindow:
    """The prompt and the last `k` turns, token for token as sampled and observed."""

    def __init__(self, prompt_ids: list[int], k: int) -> None:
        self.prompt = list(prompt_ids)
        self.k = k
        self.turns: list[list[int]] = []

    async def next_prompt(self, context: list[int], obs: list[int], turn: Turn) -> tuple[list[int], str]:
        self.turns.append(list(turn.model_ids) + list(obs))
        if len(self.turns) <= self.k:
            return context + obs, ""
        dropped = len(self.turns) - self.k
        why = (f"sliding_window: turn {dropped} left out" if dropped == 1 else
               f"sliding_window: turns 1-{dropped} left out")
        return self.prompt + [t for ids in self.turns[-self.k:] for t in ids], why


class DropThinking:
    """The conversation re-rendered without earlier turns' reasoning."""

    def __init__(self, tm: ToolManager, conversation: Conversation) -> None:
        self.tm = tm
        self.tools = conversation.tools
        self.messages = list(conversation.messages)

    async def next_prompt(self, context: list[int], obs: list[int], turn: Turn) -> tuple[list[int], str]:
        self.messages += turn_messages(turn, keep_reasoning=False)
        return list(self.tm.render_prompt(self.messages, self.tools)), "drop_thinking: the conversation re-rendered"


class Summarize:
    """As sampled until the context passes `limit` tokens; then the env's messages, a summary of
    the turns before the last, and the last turn."""

    def __init__(self, tm: ToolManager, conversation: Conversation, limit: int, summarize: Summarizer) -> None:
        self.tm = tm
        self.conversation = conversation
        self.messages = list(conversation.messages)
        self.limit = limit
        self.summarize = summarize
        self.summaries = 0

    async def next_prompt(self, context: list[int], obs: list[int], turn: Turn) -> tuple[list[int], str]:
        last = turn_messages(turn, keep_reasoning=True)
        older, self.messages = self.messages, self.messages + last
        if len(context) + len(obs) <= self.limit or len(older) <= len(self.conversation.messages):
            return context + obs, ""  # within budget, or nothing older than this turn to summarise
        summary = (await self.summarize(older, self.conversation.tools)).strip()
        self.summaries += 1
        self.messages = [*self.conversation.messages, {"role": "user", "content": SUMMARY_INTRO + summary}, *last]
        ids = list(self.tm.render_prompt(self.messages, self.conversation.tools))
        return ids, (f"summarize: the context ({len(context) + len(obs)} tokens) passed {self.limit}; "
                     f"summary {self.summaries} replaces the turns before the last")


def turn_messages(turn: Turn, keep_reasoning: bool) -> list[dict[str, Any]]:
    """`turn` as OpenAI-style chat messages: the assistant's (its tool calls as `tool_calls`, its
    thinking as `reasoning_content` when kept) and then each tool result, or the user's message."""
    reasoning, visible = split_reasoning(turn.text)
    parsed = turn.parsed
    msg: dict[str, Any] = {"role": "assistant", "content": visible}
    if isinstance(parsed, ToolCalls) and parsed.calls:
        msg["content"] = parsed.text
        msg["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                             for c in parsed.calls]
    if keep_reasoning and reasoning:
        msg["reasoning_content"] = reasoning
    out = [msg]
    if turn.user is not None:
        out.append({"role": "user", "content": turn.user})
    calls = parsed.calls if isinstance(parsed, ToolCalls) else []
    for i, r in enumerate(turn.results):
        name = calls[i].name if i < len(calls) and not isinstance(parsed, Malformed) else ""
        out.append({"role": "tool", "content": r.text, **({"name": name} if name else {})})
    return out


def conversation_text(messages: list[dict[str, Any]]) -> str:
    """The messages as plain text (a summary tool's input)."""
    lines = []
    for m in messages:
        content = m.get("content")
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        for call in m.get("tool_calls") or []:
            fn = call["function"]
            text += f"\n[call {fn['name']}({json.dumps(fn['arguments'], ensure_ascii=False)})]"
        lines.append(f"{m['role']}: {text}")
    return "\n\n".join(lines)
