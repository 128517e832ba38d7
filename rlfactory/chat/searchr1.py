"""`searchr1` ToolManager: Search-R1's tag protocol inside one assistant turn.

The model writes `<think>...</think>` then either `<search> query </search>` (generation stops at
`</search>`, a stop string) or `<answer> ... </answer>`. A search becomes
`ToolCall(name=tool_name, arguments={query_arg: query})`; its results come back appended to the same
assistant turn as `\n\n<information>RESULTS</information>\n\n` (Search-R1's format) and the model
continues. So the observation is plain text, not a chat-template turn, and the token contract is:
prompt + model + observation + model ... + end-of-turn equals the prompt followed by the whole
assistant text tokenized at once.

With tokenizers where `</search>` is not a single token (Qwen3's, Llama 3's), the `>` that ends the
model's turn and the newlines that start Search-R1's observation merge into one token (`>\n\n`) when
the whole text is tokenized at once, so that exact format breaks the contract. The default
observation template is therefore picked per tokenizer: Search-R1's exact format when it keeps the
contract (rlfactory's tiny tokenizer, which has the tags as tokens), else
`" <information>{results}</information>\n\n"` (a space does not merge with `>`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from rlfactory.chat.base import Answer, Malformed, ParseResult, ToolCalls
from rlfactory.chat.parsing import ANSWER, TagPair, find_regions, outside_regions, split_reasoning
from rlfactory.chat.template import ChatTemplate, ModelTurn
from rlfactory.chat.templates import load_template
from rlfactory.tools.base import ToolCall, ToolResult, ToolSpec

SEARCH_R1_OBSERVATION = "\n\n<information>{results}</information>\n\n"
SPACED_OBSERVATION = " <information>{results}</information>\n\n"
INVALID_ACTION = (
    "My previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again."
)
DEFAULT_INSTRUCTION = (
    "Answer the given question. Reason inside <think> and </think> every time you get new information. "
    "If you lack some knowledge, call a search engine with <search> query </search>; it returns the top "
    "results between <information> and </information>. You may search as many times as you want. When "
    "no more knowledge is needed, give the answer inside <answer> and </answer> without explanation, "
    "for example <answer> Paris </answer>."
)
_SEARCH = TagPair("<search>", "</search>")
_ACTIONS = [_SEARCH, ANSWER]


class SearchR1ToolManager:
    """ToolManager speaking Search-R1's `<search>` / `<information>` / `<answer>` tags."""

    family = "searchr1"

    def __init__(
        self,
        tokenizer: Any,
        *,
        tool_name: str = "search",
        query_arg: str = "query",
        instruction: str | None = DEFAULT_INSTRUCTION,
        observation_template: str | None = None,
        result_separator: str = "\n",
        known_tools: Collection[str] | None = None,
        chat_template: str | None = None,
        **template_kwargs: Any,
    ):
        """`tool_name` / `query_arg`: the call a `<search>` maps to. `instruction`: a system message
        put first when the messages have none (None: nothing added). `observation_template`: the text
        of an observation, `{results}` replaced by the results joined with `result_separator`; None
        picks Search-R1's format if this tokenizer keeps the token contract with it (see above).
        `known_tools` is accepted for a uniform signature; the only call is `tool_name`.
        `template_kwargs` go to the chat template (e.g. `enable_thinking=False`)."""
        template = chat_template or getattr(tokenizer, "chat_template", None) or load_template("qwen3")
        self.tokenizer = tokenizer
        self.tool_name = tool_name
        self.query_arg = query_arg
        self.instruction = instruction
        self.result_separator = result_separator
        self.template = ChatTemplate(tokenizer, template, **template_kwargs)
        self.observation_template = observation_template or _pick_observation_template(self.template)
        self._end_of_turn = _end_of_turn_marker(self.template)

    # -- ToolManager protocol --------------------------------------------------------------
    def render_prompt(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec] = ()) -> list[int]:
        """Tools are described by the instruction, not by the template (as in Search-R1)."""
        return self.template.encode(self.render_prompt_text(messages, tools))

    def render_prompt_text(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec] = ()) -> str:
        if self.instruction and (not messages or messages[0].get("role") != "system"):
            messages = [{"role": "system", "content": self.instruction}, *messages]
        return self.template.render(messages, None, add_generation_prompt=True)

    def parse(self, text: str, known_tools: Collection[str] | None = None) -> ParseResult:
        """Linear in `len(text)`; never raises."""
        _, visible = split_reasoning(text, protect=_ACTIONS)
        actions = find_regions(visible, _ACTIONS)
        calls: list[ToolCall] = []
        for action in actions:
            body = visible[action.body_start: action.body_end].strip()
            if _ACTIONS[action.pair] is ANSWER:
                if calls:
                    break  # searches come first; the answer is judged after their results
                return Answer(body)
            if not body:
                return Malformed("an empty <search></search> query")
            calls.append(ToolCall(self.tool_name, {self.query_arg: body}))
        rest = outside_regions(visible, actions)
        if calls:
            return ToolCalls(calls, text=rest.strip())
        if "<search>" in rest:
            return Malformed("<search> is not closed with </search>")
        if "<answer>" in rest:
            return Malformed("<answer> is not closed with </answer>")
        return Malformed(INVALID_ACTION)

    def render_observation(self, results: Sequence[ToolResult]) -> list[int]:
        return self.template.encode(self.observation_text(results))

    def stop_token_ids(self) -> list[int]:
        names = [self._end_of_turn, getattr(self.tokenizer, "eos_token", None), "<|endoftext|>", "<|end_of_text|>"]
        return sorted({i for i in (self.template.token_id(n) for n in names) if i is not None})

    def stop_strings(self) -> list[str]:
        return ["</search>", "</answer>"]

    # -- formats ------------------------------------------------------------------------------
    def observation_text(self, results: Sequence[ToolResult]) -> str:
        joined = self.result_separator.join(r.text.strip() for r in results)
        return self.observation_template.replace("{results}", joined)

    def format_turn(self, turn: ModelTurn) -> str:
        """A model turn: optional `<think>`, the content, then one `<search>` per call, or the
        content wrapped in `<answer>` when there are no calls (unless it already has the tags)."""
        out = f"<think> {turn.reasoning} </think>\n" if turn.reasoning is not None else ""
        if not turn.calls:
            if "<answer>" in turn.content:  # already in the answer format: never nest the tags
                return out + turn.content
            return out + f"<answer> {turn.content} </answer>"
        out += turn.content
        return out + "".join(f"<search> {c.arguments.get(self.query_arg, '')} </search>" for c in turn.calls)

    # -- token contract -------------------------------------------------------------------------
    thinks = True

    def model_turn_ids(self, turn: ModelTurn) -> list[int]:
        """A search turn stops at `</search>` (no end-of-turn token); the answer turn ends the turn."""
        text = self.format_turn(turn)
        return self.template.encode(text if turn.calls else text + self._end_of_turn)

    def reference_ids(self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec],
                      steps: Sequence[ModelTurn | Sequence[ToolResult]]) -> list[int]:
        text = "".join(self.format_turn(s) if isinstance(s, ModelTurn) else self.observation_text(s) for s in steps)
        return self.render_prompt(messages, tools) + self.template.encode(text + self._end_of_turn)


def _end_of_turn_marker(template: ChatTemplate) -> str:
    """The token the chat template closes an assistant turn with (e.g. `<|im_end|>`)."""
    probe = template.render([{"role": "user", "content": "?"}, {"role": "assistant", "content": "\x00"}])
    ids = template.encode(probe.split("\x00", 1)[-1].strip())
    return template.tokenizer.decode(ids[:1]) if ids else (getattr(template.tokenizer, "eos_token", None) or "")


def _pick_observation_template(template: ChatTemplate) -> str:
    """Search-R1's exact observation format unless `</search>` + its newlines merge across the boundary."""
    head = SEARCH_R1_OBSERVATION.split("{results}")[0]
    if template.encode("</search>" + head) == template.encode("</search>") + template.encode(head):
        return SEARCH_R1_OBSERVATION
    return SPACED_OBSERVATION
