"""BFCL's test entries as rlfactory dataset rows, loaded by bfcl-eval's own loaders.

A row: `id` (BFCL's entry id), `category`, `question` (the last user message's text),
`messages` (the first turn's chat messages, as BFCL sends them), `functions` (BFCL's function
docs as the model sees them, with its language hints), `checker_functions` (the same docs without
the hints, as BFCL's eval runner hands them to its checker), `ground_truth` (its possible answers;
None for (ir)relevance),
`prompt_style`, and in the `tools` style `tools`: the functions as JSON-schema tools (BFCL's own
type conversion), which the rollout engine renders for that row instead of the env's tools.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from rlfactory.envs.bfcl.package import bfcl

PromptStyle = Literal["tools", "bfcl"]
"""`tools`: the model's own chat template with the functions as tools (its tool-call format);
`bfcl`: BFCL's system prompt for models without tool support (calls written as
`[func(a=1)]`), as its `_pre_query_processing_prompting` builds it."""

ALIASES = {"simple": "simple_python", "java": "simple_java", "javascript": "simple_javascript"}
"""The issue's and BFCL's leaderboard names for categories whose data file says more."""

DEFAULT_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance",
                      "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
                      "live_irrelevance")


def single_turn_categories() -> list[str]:
    return list(bfcl().categories.SINGLE_TURN_CATEGORY)


def resolve_categories(names: list[str] | tuple[str, ...] | str, multi_turn: bool = False) -> list[str]:
    """BFCL category names (aliases, `single_turn`, `live`, `non_live`, `all` allowed; with
    `multi_turn`, also the multi-turn categories and the group `multi_turn`); a ValueError naming
    the unknown one and the choices."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    b = bfcl()
    known = set(b.categories.SINGLE_TURN_CATEGORY)
    groups = {"single_turn": list(b.categories.SINGLE_TURN_CATEGORY), "live": list(b.categories.LIVE_CATEGORY),
              "non_live": list(b.categories.NON_LIVE_CATEGORY), "all": list(DEFAULT_CATEGORIES)}
    multi = list(b.categories.MULTI_TURN_CATEGORY)
    if multi_turn:
        known |= set(multi)
        groups["multi_turn"] = multi
    out: list[str] = []
    for name in names:
        if name in groups:
            picked = groups[name]
        elif ALIASES.get(name, name) in known:
            picked = [ALIASES.get(name, name)]
        else:
            why = " (a multi-turn category: the bfcl_multi_turn env runs it)" if name in multi else ""
            raise ValueError(f"bfcl: unknown category {name!r}{why}; choose from "
                             f"{', '.join(sorted(known | set(ALIASES) | set(groups)))}")
        out += [c for c in picked if c not in out]
    return out


def openai_tools(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """BFCL's function docs as `{"type": "function", "function": ...}` tools, with BFCL's own type
    conversion (dict -> object, float -> number, tuple -> array, any -> string) and the names kept
    as BFCL gives them (its converter turns `.` into `_` for APIs that forbid dots; a chat template
    does not, so the checker then needs no renaming either)."""
    b = bfcl()
    converted = b.handler_utils.convert_to_tool(functions, b.type_mappings.GORILLA_TO_OPENAPI,
                                                b.enums.ModelStyle.OSSMODEL)
    out = []
    for original, tool in zip(functions, converted):
        tool = dict(tool, name=original["name"])
        out.append({"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters")
                                                     if k in tool}})
    return out


def load_category(category: str, style: PromptStyle = "tools", limit: int | None = None) -> list[dict[str, Any]]:
    """The entries of one single-turn `category` as rows (the first `limit` of them)."""
    b = bfcl()
    entries = b.utils.load_dataset_entry(category)
    plain = {e["id"]: e["function"] for e in b.utils.load_dataset_entry(category, include_language_specific_hint=False)}
    truth: dict[str, Any] = {}
    if not b.utils.is_relevance_or_irrelevance(category):
        truth = {e["id"]: e["ground_truth"] for e in b.utils.load_ground_truth_entry(category)}
    rows = []
    for entry in entries[:limit] if limit is not None else entries:
        functions = entry["function"]
        messages = copy.deepcopy(entry["question"][0])
        if style == "bfcl":
            messages = b.handler_utils.system_prompt_pre_processing_chat_model(messages, functions, entry["id"])
        user = [m["content"] for m in messages if m.get("role") == "user"]
        row: dict[str, Any] = {
            "id": entry["id"], "category": category, "question": user[-1] if user else "",
            "messages": messages, "functions": functions, "checker_functions": plain[entry["id"]],
            "ground_truth": truth.get(entry["id"]),
            "prompt_style": style,
        }
        if not b.utils.is_relevance_or_irrelevance(category) and row["ground_truth"] is None:
            raise ValueError(f"bfcl: entry {entry['id']} of {category} has no possible answer in bfcl-eval's data")
        if style == "tools":
            row["tools"] = openai_tools(functions)
        rows.append(row)
    return rows
