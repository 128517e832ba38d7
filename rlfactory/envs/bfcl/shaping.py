"""Shaping terms for training on BFCL, after ToolRL (Qian et al. 2025): partial credit for the
format, the function names and the argument names of the calls, beside BFCL's all-or-nothing
verdict. Each term is in [0, 1]; the verdict itself stays BFCL's.

- `format`: 1 when the turn decoded (calls, or for an (ir)relevance entry any reply); 0 when the
  model tried a call that could not be parsed.
- `name_match`: Jaccard similarity of the called function names and the possible answer's (for
  irrelevance, 1 without a call, else 0).
- `arg_match`: per expected call, the Jaccard similarity of its argument names with those of the
  best call of the same name (0 when none), averaged over the expected calls.

And, weighted on its own (`type_terms`):
- `type_match`: the share of the arguments the calls passed whose JSON type is the one the
  function's schema declares (an integer where it says integer, not the string "10"; an integer
  also passes for a float, as BFCL's Python checker allows); 1 for calls without arguments. A turn
  with no call (or one that could not be decoded) gets 0 where calls are expected and 1 on an
  (ir)relevance entry, where no call is what it asks: otherwise not calling would earn the term
  for free (a first version did, and GRPO stopped calling within 8 steps). An argument the schema does not list, or a type it does not
  know, is not counted. BFCL's own verdict rejects a quoted number for most functions; some `live_`
  possible answers accept one, so training on them alone can teach a policy to quote numbers.
"""

from __future__ import annotations

from typing import Any

from rlfactory.envs.bfcl.score import Decoded, answer_calls


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def shaping_terms(row: dict[str, Any], decoded: Decoded) -> dict[str, float]:
    """{format, name_match, arg_match} for `decoded` against `row`'s possible answer."""
    truth = row.get("ground_truth")
    calls = [(name, args) for c in decoded.calls if isinstance(c, dict) for name, args in c.items()]
    if not truth:  # (ir)relevance: no expected call
        no_call = float(not calls)
        hit = no_call if "irrelevance" in row["category"] else 1.0 - no_call
        return {"format": 1.0, "name_match": hit, "arg_match": hit}
    if decoded.error is not None:
        return {"format": 0.0, "name_match": 0.0, "arg_match": 0.0}
    expected = [(name, args) for c in answer_calls(truth) for name, args in c.items()]
    names = _jaccard({n for n, _ in calls}, {n for n, _ in expected})
    per_call = []
    for name, args in expected:
        keys = set(args)
        scores = [_jaccard(set(a) if isinstance(a, dict) else set(), keys) for n, a in calls if n == name]
        per_call.append(max(scores, default=0.0))
    return {"format": 1.0, "name_match": names, "arg_match": sum(per_call) / len(per_call)}


_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,), "int": (int,), "float": (int, float), "number": (int, float), "double": (int, float),
    "string": (str,), "str": (str,), "boolean": (bool,), "bool": (bool,), "array": (list,), "list": (list,),
    "tuple": (list,), "dict": (dict,), "object": (dict,),
}


def _type_ok(value: Any, declared: Any) -> bool | None:
    """Whether `value` has the JSON type `declared` names (None: a type this does not know)."""
    kinds = _TYPES.get(declared) if isinstance(declared, str) else None
    if kinds is None:
        return None
    if isinstance(value, bool) and bool not in kinds:  # True is an int to Python, not to a schema
        return False
    return isinstance(value, kinds)


def type_terms(row: dict[str, Any], decoded: Decoded) -> dict[str, float]:
    """{type_match} for `decoded` against the schemas of `row`'s functions."""
    calls = [c for c in decoded.calls if isinstance(c, dict)]
    if decoded.error is not None or not calls:  # no call: right for an (ir)relevance entry only
        return {"type_match": 0.0 if row.get("ground_truth") else 1.0}
    schemas = {f.get("name"): (f.get("parameters") or {}).get("properties") or {} for f in row.get("functions") or []}
    checked = []
    for call in calls:
        for name, args in call.items():
            props = schemas.get(name, {})
            for key, value in (args.items() if isinstance(args, dict) else ()):
                ok = _type_ok(value, (props.get(key) or {}).get("type"))
                if ok is not None:
                    checked.append(ok)
    return {"type_match": sum(checked) / len(checked) if checked else 1.0}
