"""A deterministic, made-up training corpus for rlfactory's tiny tokenizer (and smoke SFT).

Everything is generated from a seed: English-like sentences, questions and answers about invented
entities (names, attributes, numbers), Qwen3-style tool calls in JSON (`<tool_call>`,
`<tool_response>`, `<think>`) and Search-R1-style traces (`<search>`, `<information>`,
`<answer>`). The same seed always gives the same documents, so the tokenizer trained on them is
reproducible byte for byte.
"""

from __future__ import annotations

import json
import random

_ONSETS = ["b", "br", "c", "ch", "d", "dr", "f", "g", "gr", "h", "j", "k", "l", "m", "n", "p", "qu",
           "r", "s", "sh", "st", "t", "th", "tr", "v", "w", "z"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "io", "ou", "y"]
_CODAS = ["", "", "n", "r", "s", "l", "th", "nd", "x", "m", "k"]

COLORS = ["red", "blue", "green", "yellow", "purple", "orange", "black", "white", "silver", "brown"]
KINDS = ["city", "river", "mountain", "robot", "planet", "company", "island", "forest", "ship", "tower"]
ATTRIBUTES = ["color", "age", "height", "population", "founder", "capital", "speed", "weight"]
VERBS = ["visited", "built", "found", "painted", "measured", "named", "crossed", "studied", "sold", "saw"]
ADJECTIVES = ["old", "small", "large", "quiet", "bright", "famous", "strange", "ancient", "new", "tall"]
FILLER = ["the", "a", "of", "and", "in", "on", "with", "near", "from", "to", "is", "was", "that"]
TOOLS = [
    ("search", {"query": "str"}),
    ("calculator", {"expression": "str"}),
    ("get_weather", {"city": "str", "unit": "str"}),
    ("lookup", {"entity": "str", "attribute": "str"}),
    ("python", {"code": "str"}),
    ("get_time", {"timezone": "str"}),
]


def make_name(rng: random.Random) -> str:
    """An invented proper name such as `Brathor` or `Quel`."""
    n = rng.choice([1, 2, 2, 3])
    word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(n))
    return word.capitalize()


def _number(rng: random.Random) -> str:
    return str(rng.choice([rng.randint(0, 20), rng.randint(10, 999), rng.randint(1000, 99999)]))


def _value(rng: random.Random, attribute: str) -> str:
    if attribute == "color":
        return rng.choice(COLORS)
    if attribute in ("founder", "capital"):
        return make_name(rng)
    return _number(rng)


def sentence(rng: random.Random) -> str:
    """One English-like sentence about invented things."""
    a, b = make_name(rng), make_name(rng)
    form = rng.randrange(5)
    if form == 0:
        return f"{a} {rng.choice(VERBS)} the {rng.choice(ADJECTIVES)} {rng.choice(KINDS)} of {b}."
    if form == 1:
        return f"The {rng.choice(KINDS)} {a} is {rng.choice(ADJECTIVES)} and {rng.choice(COLORS)}."
    if form == 2:
        return f"In {rng.randint(1000, 2099)}, {a} {rng.choice(VERBS)} {_number(rng)} {rng.choice(KINDS)}s."
    if form == 3:
        words = [rng.choice(FILLER + ADJECTIVES + KINDS) for _ in range(rng.randint(4, 10))]
        return " ".join(words).capitalize() + rng.choice([".", "!", "?"])
    return f"{a} said that {b} has {_number(rng)} {rng.choice(ADJECTIVES)} {rng.choice(KINDS)}s."


def fact_qa(rng: random.Random) -> tuple[str, str, str]:
    """(question, fact, answer) about an invented entity."""
    name, kind, attr = make_name(rng), rng.choice(KINDS), rng.choice(ATTRIBUTES)
    value = _value(rng, attr)
    return f"What is the {attr} of the {kind} {name}?", f"The {attr} of the {kind} {name} is {value}.", value


def _tool_args(rng: random.Random, params: dict[str, str]) -> dict[str, object]:
    args: dict[str, object] = {}
    for key in params:
        if key == "expression":
            args[key] = f"{rng.randint(1, 999)} {rng.choice('+-*/')} {rng.randint(1, 999)}"
        elif key == "unit":
            args[key] = rng.choice(["celsius", "fahrenheit"])
        elif key == "attribute":
            args[key] = rng.choice(ATTRIBUTES)
        elif key == "code":
            args[key] = f"print({rng.randint(1, 99)} * {rng.randint(1, 99)})"
        else:
            args[key] = rng.choice([make_name(rng), fact_qa(rng)[0]])
    return args


def tool_dialogue(rng: random.Random) -> str:
    """A Qwen3-format multi-turn conversation with tool calls and tool responses."""
    question, fact, answer = fact_qa(rng)
    parts = [f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"]
    if rng.random() < 0.6:
        parts.append(f"<think>\nI should look this up. {sentence(rng)}\n</think>\n\n")
    calls = [rng.choice(TOOLS) for _ in range(rng.choice([1, 1, 2]))]
    blocks = []
    for name, params in calls:
        call = {"name": name, "arguments": _tool_args(rng, params)}
        blocks.append("<tool_call>\n" + json.dumps(call, ensure_ascii=False) + "\n</tool_call>")
    parts.append("\n".join(blocks) + "<|im_end|>\n<|im_start|>user")
    for _ in calls:
        result = rng.choice([fact, json.dumps({"result": _number(rng)}), f"Error: {sentence(rng)}"])
        parts.append(f"\n<tool_response>\n{result}\n</tool_response>")
    parts.append("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    parts.append(rng.choice([f"The answer is {answer}.", f"<answer>{answer}</answer>", answer]) + "<|im_end|>")
    return "".join(parts)


def search_trace(rng: random.Random) -> str:
    """A Search-R1-style trace: think, search, information, answer."""
    question, fact, answer = fact_qa(rng)
    out = [f"Question: {question}\n"]
    for _ in range(rng.randint(1, 2)):
        out.append(f"<think> I need to find {rng.choice(ATTRIBUTES)} facts. </think>\n")
        out.append(f"<search> {question.rstrip('?')} </search>\n\n")
        docs = " ".join([fact] + [sentence(rng) for _ in range(rng.randint(1, 3))])
        out.append(f"<information>Doc 1(Title: {make_name(rng)}) {docs}</information>\n\n")
    out.append(f"<think> The answer is {answer}. </think>\n<answer> {answer} </answer>")
    return "".join(out)


def json_blob(rng: random.Random) -> str:
    """A JSON tool schema or result object."""
    name, params = rng.choice(TOOLS)
    schema = {"type": "function", "function": {
        "name": name, "description": sentence(rng),
        "parameters": {"type": "object", "properties": {k: {"type": "string"} for k in params},
                       "required": list(params)}}}
    return json.dumps(schema if rng.random() < 0.5 else {"result": _number(rng), "ok": rng.random() < 0.5})


def _qa_pair(rng: random.Random) -> str:
    question, fact, answer = fact_qa(rng)
    return f"Q: {question}\nA: {answer}\n{fact}"


def generate_corpus(seed: int, n_docs: int = 4000) -> list[str]:
    """`n_docs` documents, the same for the same `seed`."""
    rng = random.Random(seed)
    makers = [
        lambda: " ".join(sentence(rng) for _ in range(rng.randint(2, 6))),
        lambda: _qa_pair(rng),
        lambda: tool_dialogue(rng),
        lambda: search_trace(rng),
        lambda: json_blob(rng),
    ]
    weights = [3, 2, 3, 2, 1]
    return [rng.choices(makers, weights)[0]() for _ in range(n_docs)]
