"""Prompts of the search env: Search-R1's original template, a tool-calling system prompt, and how
search results are shown to the model (`format_results`)."""

from __future__ import annotations

from typing import Any

# Search-R1's `make_prefix` (template_type="base"), verbatim.
SEARCHR1_TEMPLATE = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> "
    "and it will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)

# For tool-calling families (qwen3, llama3, ...): the tool itself is described by the chat template.
TOOL_SYSTEM_PROMPT = (
    "Answer the question. Use the search tool to look up facts, one search per fact. "
    "Give the final answer as <answer>answer</answer>."
)


def searchr1_prompt(question: str) -> str:
    return SEARCHR1_TEMPLATE.format(question=question)


# Search-R1's instruction without the question (the system message of the `searchr1` family).
SEARCHR1_INSTRUCTION = SEARCHR1_TEMPLATE.split(" Question: ")[0]


def opening_messages(question: str, family: str, system_prompt: str | None = None,
                     searchr1_single_turn: bool = False) -> list[dict[str, Any]]:
    """The messages that open an episode.

    Tool-calling families: a system prompt, then the question. `searchr1`: Search-R1's instruction
    as the system message and `Question: ...` as the user turn (a system message of our own keeps
    the searchr1 ToolManager from adding its default instruction); with `searchr1_single_turn`,
    Search-R1's exact single user turn (instruction + question), as in its parquet files."""
    if family == "searchr1":
        if searchr1_single_turn and not system_prompt:
            return [{"role": "user", "content": searchr1_prompt(question)}]
        return [{"role": "system", "content": system_prompt or SEARCHR1_INSTRUCTION},
                {"role": "user", "content": f"Question: {question}"}]
    return [{"role": "system", "content": system_prompt or TOOL_SYSTEM_PROMPT}, {"role": "user", "content": question}]


def format_results(docs: list[dict[str, Any]]) -> str:
    """Search-R1's `_passages2string`: the first line of `contents` is the title, the rest the text.
    `docs` are either `{"document": {...}, "score": s}` items or the documents themselves."""
    out = []
    for i, item in enumerate(docs):
        doc = item.get("document", item)
        title, _, text = doc.get("contents", "").partition("\n")
        out.append(f"Doc {i + 1}(Title: {title}) {text}\n")
    return "".join(out)
