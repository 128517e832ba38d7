"""A tokenizer's chat template, rendered to text and encoded without extra special tokens.

The template families compute observation ids as a difference of two renderings of a small fixed
conversation, so the ids are exactly what the template adds for the tool turn(s) plus the next
assistant header, whatever the template's details are.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rlfactory.branches import first_difference
from rlfactory.chat.encode import encode_text
from rlfactory.text import valid_text
from rlfactory.tools.base import ToolCall, ToolSpec

log = logging.getLogger("rlfactory.chat")

CONTENT_PROBE = ' \n"<&\'\\{{}} rlfactory-content-probe-{} \t\n'
"""A content `ChatTemplate.delta_after_turn` renders in place of a tool result's to find where the
template writes contents (its spaces, quotes, `<`, `&` and backslash show a trim or an escape)."""

FILL_CHECKS = 16
"""Filled observations per ChatTemplate also rendered in full and compared."""

USER_TURN_CONTEXT = "rlfactory-assistant-turn-before-a-user-turn"
"""The content of the assistant turn `ChatTemplate.user_turn_text` renders a user turn after."""


@dataclass
class ModelTurn:
    """One model turn as structured parts; used to build sample conversations and reference renders."""

    calls: list[ToolCall] = field(default_factory=list)
    content: str = ""
    reasoning: str | None = None  # None: the model writes no thinking block of its own


def openai_tools(tools: Sequence[ToolSpec] | None) -> list[dict[str, Any]] | None:
    """`tools` as chat-template schemas; None when there are none (templates test `if tools`)."""
    return [t.openai_schema() for t in tools] if tools else None


def openai_tool_calls(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def conversation(messages: list[dict[str, Any]], steps: Sequence[Any], assistant_message: Any,
                 tool_role: str) -> list[dict[str, Any]]:
    """`messages` followed by `steps` as chat messages: a ModelTurn becomes `assistant_message(turn)`,
    a sequence of ToolResults becomes one `tool_role` message each (for reference renderings)."""
    conv = list(messages)
    for step in steps:
        if isinstance(step, ModelTurn):
            conv.append(assistant_message(step))
        else:
            conv.extend({"role": tool_role, "content": r.text} for r in step)
    return conv


class ChatTemplate:
    """`tokenizer` + template text + fixed template kwargs (e.g. `enable_thinking`)."""

    def __init__(self, tokenizer: Any, template: str | None = None, **template_kwargs: Any):
        self.tokenizer = tokenizer
        self.template = template if template is not None else getattr(tokenizer, "chat_template", None)
        if not self.template:
            raise ValueError("the tokenizer has no chat template; pass one")
        self.template_kwargs = {k: v for k, v in template_kwargs.items() if v is not None}
        self.replaced_chars = 0
        # delta_after_turn's rendering of its context, by context: the families ask with one fixed
        # context for every tool result, and each render is a full apply_chat_template.
        self._context_renders: dict[str, str] = {}
        """Characters `encode` replaced because they were not valid Unicode."""
        # delta_after_turn's text around its added messages' contents, by context and messages
        # without their contents (None: the template does not render a content verbatim, once).
        self._skeletons: dict[tuple[str, str, str], list[str] | None] = {}
        self._filled_checks = 0  # skeleton fills compared with a full render so far (FILL_CHECKS)

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            chat_template=self.template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; the template writes its own special tokens (bos included).

        Every family encodes prompts and observations here, so this is where outside text (a
        dataset row, a tool result, an external agent's message) meets the tokenizer: a character
        that is not valid Unicode (a lone surrogate), which tokenizers refuse with a TypeError, is
        replaced by U+FFFD and counted in `replaced_chars` (rlfactory/text.py). The ids are the
        tokenizer's `encode(text, add_special_tokens=False)`, by the Rust tokenizer's own encode
        where that gives the same ids (chat/encode.py: it does not wait to win the GIL back)."""
        text, replaced = valid_text(text)
        if replaced:
            if not self.replaced_chars:
                log.warning("replaced %d character(s) that are not valid Unicode (lone surrogates) with U+FFFD "
                            "before tokenizing; the text came from a dataset row, a message or a tool", replaced)
            self.replaced_chars += replaced
        return encode_text(self.tokenizer, text)

    def token_id(self, token: str | None) -> int | None:
        """The id of `token` if it is one token of the vocabulary, else None."""
        if not token:
            return None
        ids = self.encode(token)
        return ids[0] if len(ids) == 1 else None

    def delta_after_turn(
        self,
        context: list[dict[str, Any]],
        added: list[dict[str, Any]],
        end_of_turn: str,
    ) -> str:
        """Text the template adds after `context`'s last end-of-turn marker when `added` messages and
        the generation prompt follow. `context` must end with an assistant turn.

        Added messages whose contents are text are rendered once per context and message shape
        with probe contents (`_skeleton`), and each call puts its contents between the pieces: an
        apply_chat_template (Jinja) per tool result was a third of the rollout engine's event-loop
        CPU, which shares the GIL with generation. A template that does not write a probe verbatim
        exactly once per message (trims, escapes, JSON-quotes it) is always rendered in full; the
        first FILL_CHECKS fills are compared with a full render, and a difference (a template that
        branches on the content) logs one line and renders in full from then on."""
        key = json.dumps(context, sort_keys=True, default=repr)
        contents = [m.get("content") for m in added]
        if self._filled_checks >= 0 and all(isinstance(c, str) for c in contents):
            shape = (key, end_of_turn, json.dumps([{k: v for k, v in m.items() if k != "content"} for m in added],
                                                  sort_keys=True, default=repr))
            if shape not in self._skeletons and len(self._skeletons) < 64:
                self._skeletons[shape] = self._skeleton(key, context, added, end_of_turn)
            pieces = self._skeletons.get(shape)
            if pieces is not None:
                text = pieces[0] + "".join(c + p for c, p in zip(contents, pieces[1:]))
                if self._filled_checks < FILL_CHECKS:
                    full = self._rendered_delta(key, context, added, end_of_turn)
                    if full != text:
                        log.warning("the chat template renders tool results otherwise than a probe showed (at "
                                    "character %d); observations are rendered in full from now on",
                                    first_difference(full, text))
                        self._filled_checks = -1
                        return full
                    self._filled_checks += 1
                return text
        return self._rendered_delta(key, context, added, end_of_turn)

    def _skeleton(self, key: str, context: list[dict[str, Any]], added: list[dict[str, Any]],
                  end_of_turn: str) -> list[str] | None:
        """The delta for `added` with probe contents, cut at each probe: len(added) + 1 pieces; None
        when a probe is not in it verbatim exactly once, in order (the template changes contents)."""
        probes = [CONTENT_PROBE.format(i) for i in range(len(added))]
        text = self._rendered_delta(key, context, [{**m, "content": p} for m, p in zip(added, probes)], end_of_turn)
        pieces = []
        for probe in probes:
            if text.count(probe) != 1:
                return None
            before, text = text.split(probe)
            pieces.append(before)
        return pieces + [text]

    def _rendered_delta(self, key: str, context: list[dict[str, Any]], added: list[dict[str, Any]],
                        end_of_turn: str) -> str:
        base = self._context_renders.get(key)
        if base is None:
            base = self.render(context)
            if len(self._context_renders) < 64:
                self._context_renders[key] = base
        cut = base.rfind(end_of_turn)
        if cut == -1:
            raise ValueError(f"the chat template does not end an assistant turn with {end_of_turn!r}")
        cut += len(end_of_turn)
        full = self.render(context + added, add_generation_prompt=True)
        if full[:cut] != base[:cut]:
            raise ValueError("the chat template re-renders earlier turns when tool results follow; "
                             "observation ids cannot be a pure delta")
        return full[cut:]

    def user_turn_text(self, text: str, end_of_turn: str) -> str:
        """Text the template adds after an assistant turn's end-of-turn marker for a new user message
        `text` plus the next assistant header (a multi-turn conversation's next user turn).

        Unlike `delta_after_turn` this cuts the full rendering after the context's own assistant
        turn (found by its marker content) instead of comparing it with the context rendered alone:
        some templates render an assistant turn differently once a later user message follows
        (Qwen3 drops its reasoning), which changes what comes before the cut, never what comes after."""
        context = [{"role": "user", "content": "?"}, {"role": "assistant", "content": USER_TURN_CONTEXT}]
        full = self.render(context + [{"role": "user", "content": text}], add_generation_prompt=True)
        at = full.find(USER_TURN_CONTEXT)
        end = full.find(end_of_turn, at + len(USER_TURN_CONTEXT)) if at != -1 else -1
        if end == -1:
            raise ValueError(f"the chat template does not end an assistant turn with {end_of_turn!r}")
        return full[end + len(end_of_turn):]

    def reference_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                      end_of_turn: str) -> list[int]:
        """Ids of the whole conversation rendered at once, cut after its last end-of-turn marker."""
        text = self.render(messages, tools)
        cut = text.rfind(end_of_turn)
        return self.encode(text[: cut + len(end_of_turn)] if cut != -1 else text)
