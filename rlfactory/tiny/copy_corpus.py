"""Generic copy text for `tiny:<size>-copy` (rlfactory/tiny/pretrain.py): conversations in which a
tool call copies values from the question, and an answer copies a value from the tool's result.

Nothing here is about any one task: the tools, their parameters, the questions and the values are
drawn from a seed (invented words and names, numbers of 1 to 8 digits, as many of each length,
and decimals), so the model learns the operation (find a value in the question, write it into the
JSON of a call; find the result in a tool response, among the call's values and other numbers, and
write it into the answer), not any particular content. Four kinds of document:

- chat (`chat_messages`, rendered by `chat_text`): a Qwen3-template conversation with a tools block
  of 1-2 random functions (MCP-style schemas, with `title`s), a question that mentions the values,
  the `<tool_call>` that copies them, a `<tool_response>` and an `<answer>` copying the result,
  written as rlfactory's qwen3 family writes a final answer (no empty `<think>` block before it);
- `compact_doc`: the same copy steps without the long tools block (many copies per token of compute);
- `answer_doc`: the episode's second half only, tool response -> answer, several in a row (the
  answer copy is a few tokens of a chat document; here it is most of the text);
- `recall_doc`: plain copy and key-value recall text.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from rlfactory.tiny.corpus import ADJECTIVES, COLORS, KINDS, VERBS, make_name, sentence

_SYLLABLES = ["a", "e", "i", "o", "u", "ba", "be", "ca", "co", "da", "de", "di", "fa", "fe", "ga", "go", "ha",
              "he", "in", "ja", "ka", "ki", "la", "le", "li", "lo", "ma", "me", "mi", "mo", "na", "ne", "no",
              "on", "pa", "pe", "po", "ra", "re", "ri", "ro", "sa", "se", "si", "so", "ta", "te", "ti", "to",
              "un", "va", "ve", "vi", "wa", "we", "xa", "ya", "yo", "za", "ze", "ter", "ner", "ous", "ing",
              "ers", "ent", "ton", "gram", "lin", "ard", "eek", "our", "ute", "ond", "ile", "und", "ch", "st"]
_PARAM_WORDS = ["value", "amount", "count", "name", "city", "item", "unit", "target", "source", "label",
                "size", "key", "query", "level", "mode", "color", "kind", "owner", "place", "number", "code",
                "index", "limit", "start", "end", "input", "output", "title", "tag", "group"]
_VERB_WORDS = ["get", "find", "set", "make", "add", "lookup", "check", "send", "move", "count", "scale",
               "turn", "map", "fetch", "store", "rate", "list", "open", "build", "pick"]
SYSTEMS = ["Use the tools to answer.", "Call a tool, then answer with <answer>value</answer>.",
           "You can call tools. Put the final answer in <answer></answer>.", "Answer the user's question.",
           "Use the {tool} tool, then answer with the result as <answer>result</answer>."]


def word(rng: random.Random) -> str:
    """A lowercase invented word, sometimes an English one, sometimes plural."""
    r = rng.random()
    if r < 0.25:
        w = rng.choice(COLORS + KINDS + ADJECTIVES + VERBS)
    elif r < 0.45:
        w = make_name(rng).lower()
    else:
        w = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))
    return w + "s" if rng.random() < 0.3 and not w.endswith("s") else w


def number(rng: random.Random) -> int:
    """A number of 1 to 8 digits, each length as likely (a copy of 7 digits must not be new to the
    model: tools return amounts of any size, and one digit is one token)."""
    digits = rng.randint(1, 8)
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def result_value(rng: random.Random) -> str:
    """What a tool returns as its result: mostly a number (sometimes a decimal), else a word."""
    r = rng.random()
    if r < 0.7:
        return str(number(rng))
    if r < 0.85:
        return f"{number(rng) % 100_000}.{rng.randint(0, 10 ** rng.randint(1, 6) - 1)}"
    return word(rng)


def value(rng: random.Random, kind: str) -> Any:
    if kind == "number":
        return number(rng)
    if kind == "name":
        return make_name(rng)
    if kind == "words":
        return " ".join(word(rng) for _ in range(2))
    return word(rng)


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # number | word | name | words


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    params: tuple[Param, ...]

    def schema(self, titles: bool) -> dict[str, Any]:
        props = {}
        for p in self.params:
            prop: dict[str, Any] = {"type": "number" if p.kind == "number" else "string"}
            if titles:
                prop["title"] = p.name.replace("_", " ").title()
            props[p.name] = prop
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                "parameters": {"type": "object", "properties": props, "required": [p.name for p in self.params]}}}


def _snake(rng: random.Random, pool: list[str]) -> str:
    parts = [rng.choice(pool)] if rng.random() < 0.5 else [rng.choice(pool), word(rng).rstrip("s") or "x"]
    return "_".join(parts)


def make_tool(rng: random.Random) -> Tool:
    names: list[str] = []
    while len(names) < rng.randint(1, 3):
        n = _snake(rng, _PARAM_WORDS)
        if n not in names:
            names.append(n)
    kinds = rng.choices(["number", "word", "name", "words"], [4, 4, 2, 1], k=len(names))
    return Tool(name=_snake(rng, _VERB_WORDS), description=sentence(rng),
                params=tuple(Param(n, k) for n, k in zip(names, kinds)))


def _text(v: Any) -> str:
    return str(v)


NAMED_STYLES = (0, 1, 3)  # the questions that name each parameter, so the call is determined by the text


def question(rng: random.Random, tool: Tool, args: dict[str, Any], styles: tuple[int, ...] = (0, 1, 2, 3)) -> str:
    """A question that mentions every argument's value once, in a random order, with or without
    the parameter's name next to it (so the call's order is not always the question's order)."""
    order = list(tool.params)
    rng.shuffle(order)
    style = rng.choice(styles)
    if style == 0:  # named: "with count 12 and city Brathor"
        bits = [f"{p.name.replace('_', ' ')} {_text(args[p.name])}" for p in order]
        return f"{rng.choice(['Please', 'Can you', 'Now'])} {tool.name.replace('_', ' ')} with {' and '.join(bits)}."
    if style == 1:  # "set x to v"
        bits = [f"{p.name.replace('_', ' ')} to {_text(args[p.name])}" for p in order]
        return f"Set {', '.join(bits)}, then {rng.choice(VERBS).rstrip('ed')} it."
    if style == 2:  # loose prose around the values
        filler = [" ".join(word(rng) for _ in range(rng.randint(0, 2))) for _ in order]
        bits = [f"{f} {_text(args[p.name])}".strip() for f, p in zip(filler, order)]
        return f"{rng.choice(['What is', 'How many', 'Which', 'Where is'])} {' '.join(bits)}?"
    bits = [f"the {p.name.replace('_', ' ')} is {_text(args[p.name])}" for p in order]
    text = "; ".join(bits)
    # upper-case the first letter only: str.capitalize() would lower-case the values (names) after it
    return text[0].upper() + text[1:] + ". " + rng.choice(["What do you get?", "Go.", "And the result?"])


def result_text(rng: random.Random, args: dict[str, Any], answer: str) -> str:
    """A tool response that holds `answer` once, often beside the call's values and other numbers,
    so that the answer copies the result, not the first number in sight."""
    vals = [_text(v) for v in args.values()]
    style = rng.randrange(7)
    if style == 0:
        return f"{' '.join(vals)} = {answer} {word(rng)}"
    if style == 1:
        return json.dumps({"result": answer, "input": vals[0]})
    if style == 2:
        return f"The {rng.choice(_PARAM_WORDS)} of {vals[0]} is {answer}."
    if style == 3:
        return f"{vals[0]} {word(rng)} -> {answer}"
    if style == 4:  # a quantity in one unit = the result in another
        return f"{vals[0]} {word(rng)} = {answer} {word(rng)}"
    if style == 5:  # key: value lines, the result among other numbers
        lines = [f"input: {vals[0]}", f"result: {answer}"] + [f"{rng.choice(_PARAM_WORDS)}: {number(rng)}"
                                                             for _ in range(rng.randint(0, 2))]
        rng.shuffle(lines)
        return "\n".join(lines)
    return json.dumps({"status": "ok", rng.choice(_PARAM_WORDS): number(rng), "result": answer,
                       "query": vals[-1]}, ensure_ascii=False)


def _call_text(tool: Tool, args: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": tool.name, "arguments": args}, ensure_ascii=False) + "\n</tool_call>"


def chat_messages(rng: random.Random, styles: tuple[int, ...] = (0, 1, 2, 3)
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages, tool schemas) of one conversation, for the tokenizer's chat template: [system],
    user, assistant's call, tool, assistant's answer."""
    tools: list[Tool] = []
    for _ in range(rng.choice([1, 1, 2])):
        tool = make_tool(rng)
        while any(t.name == tool.name for t in tools):  # two tools of one name would make the call ambiguous
            tool = make_tool(rng)
        tools.append(tool)
    tool = rng.choice(tools)
    args = {p.name: value(rng, p.kind) for p in tool.params}
    answer = result_value(rng)
    msgs: list[dict[str, Any]] = []
    if rng.random() < 0.8:
        msgs.append({"role": "system", "content": rng.choice(SYSTEMS).format(tool=tool.name)})
    q = question(rng, tool, args, styles)
    msgs += [{"role": "user", "content": q},
             {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                 "name": tool.name, "arguments": args}}]},
             {"role": "tool", "content": result_text(rng, args, answer)},
             {"role": "assistant", "content": f"<answer>{answer}</answer>"}]
    titles = rng.random() < 0.7
    return msgs, [t.schema(titles) for t in tools]


def chat_text(tok: Any, msgs: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    """A `chat_messages` conversation as text: the chat template up to the final answer, whose
    turn is written as rlfactory's qwen3 family writes it (rlfactory/chat/qwen3.py: the model's own
    tokens, with no empty `<think>` block, which the template would add before a last turn)."""
    head = tok.apply_chat_template(msgs[:-1], tools=tools, tokenize=False, add_generation_prompt=True)
    return head + msgs[-1]["content"] + "<|im_end|>\n"


def _response_answer(rng: random.Random, args: dict[str, Any], answer: str) -> str:
    """A tool response holding `answer` among the call's values, then the answer that copies it."""
    return (f"<|im_start|>user\n<tool_response>\n{result_text(rng, args, answer)}\n</tool_response><|im_end|>\n"
            f"<|im_start|>assistant\n<answer>{answer}</answer><|im_end|>")


def compact_doc(rng: random.Random) -> str:
    """Two to four question -> call -> result -> answer steps, without the tools block."""
    out = []
    for _ in range(rng.randint(2, 4)):
        tool = make_tool(rng)
        args = {p.name: value(rng, p.kind) for p in tool.params}
        answer = result_value(rng)
        out.append(f"<|im_start|>user\n{question(rng, tool, args)}<|im_end|>\n<|im_start|>assistant\n"
                   f"{_call_text(tool, args)}<|im_end|>\n{_response_answer(rng, args, answer)}")
    return "\n".join(out)


def answer_doc(rng: random.Random) -> str:
    """Three to six tool response -> answer steps: the final turn of an episode, where the answer
    copies the result that the tool returned for a call (whose values the response may repeat)."""
    out = []
    for _ in range(rng.randint(3, 6)):
        tool = make_tool(rng)
        args = {p.name: value(rng, p.kind) for p in tool.params}
        answer = result_value(rng)
        out.append(_response_answer(rng, args, answer))
    return "\n".join(out)


def recall_doc(rng: random.Random) -> str:
    """Plain copying: repeat a list, or recall the value of a key named earlier."""
    if rng.random() < 0.5:
        items = [_text(value(rng, rng.choice(["number", "word", "name"]))) for _ in range(rng.randint(3, 8))]
        line = " ".join(items)
        sep = rng.choice([", ", " ", "; "])
        return f"Repeat after me: {line}\n{line}\nAnd with commas: {sep.join(items)}"
    keys = list(dict.fromkeys(make_name(rng) for _ in range(rng.randint(3, 6))))
    vals = {k: _text(value(rng, rng.choice(["number", "word"]))) for k in keys}
    facts = " ".join(f"{k} has {v}." for k, v in vals.items())
    asks = rng.sample(keys, k=min(3, len(keys)))
    return facts + "\n" + "\n".join(f"Q: What does {k} have? A: {vals[k]}" for k in asks)
