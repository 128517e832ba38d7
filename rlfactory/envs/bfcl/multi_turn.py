"""BFCL's multi-turn categories: the entries and their scoring by bfcl-eval's own state and response
checkers (`multi_turn_checker`, which replays the model's calls and the ground truth on BFCL's
executable backends: file system, messaging, trading, travel, vehicle, ...).

Rolling them out is the `bfcl_multi_turn` env's (multi_turn_env.py). `check_multi_turn` takes the
calls per turn and step as call strings (`cd(folder='document')`, as BFCL's `decode_execute` gives
them).

bfcl-eval keeps backend instances in a module's globals, named by model, entry and class, and
reuses one that exists: scoring the same entry twice (n samples of a group) would start from the
state the first one left. Each check therefore runs under a model name of its own and removes its
instances afterwards.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

from rlfactory.envs.bfcl.package import MODEL_NAME, bfcl
from rlfactory.envs.bfcl.score import Verdict


def multi_turn_categories() -> list[str]:
    return list(bfcl().categories.MULTI_TURN_CATEGORY)


def load_multi_turn(category: str, limit: int | None = None) -> list[dict[str, Any]]:
    """Rows of a multi-turn category: `id`, `category`, `turns` (the user messages of each turn),
    `functions`, `entry` (BFCL's entry as its checker takes it) and `ground_truth` (call strings
    per turn)."""
    b = bfcl()
    if category not in b.categories.MULTI_TURN_CATEGORY:
        raise ValueError(f"bfcl: {category!r} is not a multi-turn category ({', '.join(multi_turn_categories())})")
    entries = b.utils.load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False)
    truth = {e["id"]: e["ground_truth"] for e in b.utils.load_ground_truth_entry(category)}
    rows = []
    for entry in entries[:limit] if limit is not None else entries:
        rows.append({"id": entry["id"], "category": category, "turns": entry["question"],
                     "functions": entry["function"], "entry": entry, "ground_truth": truth[entry["id"]]})
    return rows


def to_call_strings(calls: list[dict[str, Any]]) -> list[str]:
    """`[{name: arguments}]` as BFCL's executable call strings (its `convert_to_function_call`)."""
    return list(bfcl().handler_utils.convert_to_function_call(calls))


def check_multi_turn(row: dict[str, Any], calls: list[list[list[str]]]) -> Verdict:
    """BFCL's verdict on `calls` (per turn, per step, call strings) for a multi-turn `row`: as its
    eval runner, a run with another number of turns than the ground truth is force-terminated."""
    b = bfcl()
    truth = row["ground_truth"]
    if len(calls) != len(truth):
        return Verdict(False, [f"Model was force-terminated during inference phase. The length of the model result "
                               f"turns ({len(calls)}) does not match the length of the ground truth turns "
                               f"({len(truth)})."], "multi_turn:force_terminated")
    steps = [[step for step in turn if not b.multi_turn.is_empty_execute_response(step)] for turn in calls]
    name = f"{MODEL_NAME}_{uuid.uuid4().hex}"
    utils_globals = vars(b.multi_turn)["execute_multi_turn_func_call"].__globals__
    try:
        result = b.multi_turn.multi_turn_checker(steps, truth, copy.deepcopy(row["entry"]), row["category"], name)
    finally:
        for key in [k for k in utils_globals if k.startswith(name)]:
            del utils_globals[key]
    if result["valid"]:
        return Verdict(True)
    return Verdict(False, [result.get("error_message", "")], str(result.get("error_type", "")))
