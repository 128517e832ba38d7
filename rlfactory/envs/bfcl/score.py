"""Scoring a model's calls the way BFCL's eval runner does, with bfcl-eval's own checkers.

`check(row, decoded)` mirrors `_evaluate_single_ast_entry` / `_evaluate_single_relevance_entry` of
bfcl_eval/eval_checker/eval_runner.py: the decoded calls (`[{name: {arg: value}}]`, or a decode
error) go through `is_function_calling_format_output` and `ast_checker`; for (ir)relevance an
empty or undecodable output is "no call". Only that glue lives here; every verdict is the
package's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlfactory.envs.bfcl.package import MODEL_NAME, bfcl


@dataclass
class Decoded:
    """What the model's turn decoded to: calls in BFCL's form, or why it could not be decoded."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


@dataclass
class Verdict:
    valid: bool
    error: list[str] = field(default_factory=list)
    error_type: str = ""


def decode_prompting(text: str) -> Decoded:
    """A `bfcl`-style reply (`[func(a=1), ...]`) decoded by BFCL's `default_decode_ast_prompting`."""
    b = bfcl()
    try:
        calls = b.handler_utils.default_decode_ast_prompting(text, b.enums.ReturnFormat.PYTHON)
    except Exception as e:  # BFCL's decoder raises whatever ast/its parser raise: that is "no valid call"
        return Decoded(error=f"{type(e).__name__}: {e}"[:300])
    return Decoded(calls=list(calls) if isinstance(calls, list) else [calls])


def check(row: dict[str, Any], decoded: Decoded) -> Verdict:
    """BFCL's verdict on `decoded` for `row` (see the module doc)."""
    b = bfcl()
    category = row["category"]
    if b.utils.is_relevance_or_irrelevance(category):
        has_call = decoded.error is None and not b.utils.is_empty_output(decoded.calls)
        success = not has_call if "irrelevance" in category else has_call
        if success:
            return Verdict(True)
        if "irrelevance" in category:
            return Verdict(False, ["Valid syntax. Successfully decode AST when it should not."],
                           "irrelevance_error:decoder_success")
        return Verdict(False, [f"Invalid syntax. Failed to decode AST when it should have. {decoded.error}"],
                       "relevance_error:decoder_failed")
    if decoded.error is not None:
        return Verdict(False, [f"Invalid syntax. Failed to decode AST. {decoded.error}"], "ast_decoder:decoder_failed")
    if not b.utils.is_function_calling_format_output(decoded.calls):
        return Verdict(False, ["Did not output in the specified format."], "ast_decoder:decoder_wrong_output_format")
    language = _language(b, category)
    result = b.ast.ast_checker(row["checker_functions"], decoded.calls, row["ground_truth"], language, category,
                               MODEL_NAME)
    return Verdict(bool(result["valid"]), list(result.get("error", [])), str(result.get("error_type", "")))


def _language(b: Any, category: str) -> Any:
    if b.utils.is_java(category):
        return b.enums.Language.JAVA
    if b.utils.is_js(category):
        return b.enums.Language.JAVASCRIPT
    return b.enums.Language.PYTHON


def accuracy_summary(per_category: dict[str, tuple[float, int]]) -> dict[str, float]:
    """BFCL's leaderboard aggregates over the categories present, with its own
    calculate_(un)weighted_accuracy: `non_live_ast` (unweighted over simple (itself unweighted over
    python/java/javascript), multiple, parallel, parallel_multiple), `live_ast` (weighted by entries
    over the live_ ones), `multi_turn` (unweighted over the multi-turn ones, BFCL's "Multi Turn
    Overall"), and the irrelevance/relevance categories as they are."""
    helper = bfcl().summary

    def acc(names: list[str]) -> list[dict[str, Any]]:
        return [{"accuracy": per_category[n][0], "total_count": per_category[n][1],
                 "display_accuracy": per_category[n][0]} for n in names if n in per_category]

    out: dict[str, float] = {}
    simple = acc(["simple_python", "simple_java", "simple_javascript"])
    non_live = ([helper.calculate_unweighted_accuracy(simple, False)] if simple else []) + \
        acc(["multiple", "parallel", "parallel_multiple"])
    if non_live:
        out["non_live_ast"] = helper.calculate_unweighted_accuracy(non_live, False)["accuracy"]
    live = acc(["live_simple", "live_multiple", "live_parallel", "live_parallel_multiple"])
    if live:
        out["live_ast"] = helper.calculate_weighted_accuracy(live, False)["accuracy"]
    multi = acc(list(bfcl().categories.MULTI_TURN_CATEGORY))
    if multi:
        out["multi_turn"] = helper.calculate_unweighted_accuracy(multi, False)["accuracy"]
    for name in ("irrelevance", "live_irrelevance", "live_relevance"):
        if name in per_category:
            out[name] = per_category[name][0]
    return out


def answer_calls(ground_truth: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One set of calls that BFCL's possible answers accept: per parameter its first allowed value
    other than "" (BFCL's "may be omitted"), the parameter left out when "" is all it allows. Nested
    dicts (and lists of them) hold option lists of their own, resolved the same way. For the warm
    start and for tests."""

    def pick(options: dict[str, Any]) -> dict[str, Any]:
        return {k: _resolve(next(o for o in v if o != "")) for k, v in options.items()
                if isinstance(v, list) and any(o != "" for o in v)}

    def _resolve(value: Any) -> Any:
        if isinstance(value, dict):
            return pick(value)
        if isinstance(value, list):
            return [_resolve(x) for x in value]
        return value

    return [{name: pick(args)} for call in ground_truth for name, args in call.items()]
