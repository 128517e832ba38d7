"""Argument validation against a tool's JSON schema, before the call.

Most tool schemas are flat: an object of typed scalar properties, some required. For those a
direct check decides "valid" in a microsecond or two; anything it does not accept goes to
`jsonschema`, which gives the verdict and the message. So the fast path can only say yes, never
no, and never disagrees with jsonschema on a valid call.

jsonschema validates by recursion, a few Python frames per level of the arguments: with a
recursive `$ref` schema, arguments some 250 levels deep exhaust Python's stack (and take tens of
milliseconds of the event loop well before that). `arguments_problem` therefore refuses arguments
nested deeper than `MAX_ARGUMENT_DEPTH` (or holding text that is not valid Unicode) before any
validation, and a `RecursionError` that still happens is that call's `invalid_arguments`.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import jsonschema
from jsonschema.exceptions import best_match

from rlfactory.text import valid_text

log = logging.getLogger("rlfactory.tools")

MAX_ARGUMENT_DEPTH = 64
"""Nested arrays/objects a call's arguments may have (validating 64 levels of a recursive schema
takes ~2 ms; Python's stack runs out near 250)."""

_TOP_KEYS = {"type", "properties", "required", "additionalProperties", "description", "title", "$schema"}
_PROP_KEYS = {"type", "description", "title", "default", "examples"}
_CHECKS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def _fast_path(schema: dict[str, Any]) -> Callable[[dict[str, Any]], bool] | None:
    """A yes-only checker for flat schemas, or None when the schema is not flat."""
    if schema.get("type", "object") != "object" or set(schema) - _TOP_KEYS:
        return None
    props = schema.get("properties") or {}
    checks: dict[str, Callable[[Any], bool]] = {}
    for name, p in props.items():
        if not isinstance(p, dict) or set(p) - _PROP_KEYS:
            return None
        t = p.get("type")
        if t is None:
            checks[name] = lambda v: True
        elif isinstance(t, str) and t in _CHECKS:
            checks[name] = _CHECKS[t]
        else:
            return None
    required = tuple(schema.get("required") or ())
    extra = schema.get("additionalProperties", True)
    if not isinstance(extra, bool):
        return None

    def ok(args: dict[str, Any]) -> bool:
        for key in required:
            if key not in args:
                return False
        for key, value in args.items():
            check = checks.get(key)
            if check is None:
                if not extra:
                    return False
            elif not check(value):
                return False
        return True

    return ok


class ArgumentValidator:
    """Validates an arguments object; `error(args)` is None or a message the model can read."""

    def __init__(self, validator: Any, fast: Callable[[dict[str, Any]], bool] | None) -> None:
        self._validator = validator
        self._fast = fast

    @classmethod
    def for_schema(cls, tool: str, schema: Any) -> "ArgumentValidator | None":
        """None when there is nothing to check (no schema, or one jsonschema cannot use)."""
        if not isinstance(schema, dict):
            return None
        try:
            jcls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            jcls.check_schema(schema)
        except Exception as e:  # a server's broken schema must not take the runner down
            log.warning("tool %r has an invalid JSON schema, arguments are not validated: %s", tool, e)
            return None
        return cls(jcls(schema), _fast_path(schema))

    def error(self, args: dict[str, Any]) -> str | None:
        if self._fast is not None and self._fast(args):
            return None
        try:
            err = best_match(self._validator.iter_errors(args))
        except RecursionError:
            return "nested too deeply to be checked against the tool's schema"
        if err is None:
            return None
        where = "/".join(str(p) for p in err.absolute_path)
        return err.message + (f" (at {where})" if where else "")


def arguments_problem(args: Any, max_depth: int = MAX_ARGUMENT_DEPTH) -> str | None:
    """Why `args` cannot go to a tool whatever its schema says, or None: nested deeper than
    `max_depth`, or a string that is not valid Unicode (an unpaired surrogate, which no UTF-8
    encoder, MCP server or cache accepts). Linear in the size of `args`."""
    stack: list[tuple[Any, int]] = [(args, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            if not node.isascii() and valid_text(node)[0] != node:
                return "a string in the arguments has an unpaired surrogate (\\ud800-\\udfff), which is not valid Unicode"
        elif isinstance(node, (dict, list)):
            if depth >= max_depth:
                return f"the arguments are nested deeper than {max_depth} levels"
            if isinstance(node, dict):
                stack.extend((key, depth) for key in node)
                node = node.values()
            stack.extend((child, depth + 1) for child in node)
    return None
