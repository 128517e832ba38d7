"""Text helpers shared by the ToolManager parsers.

None of them raises on any input string, and each runs in time linear in the length of its input:
tags are found with `str.find` and paired by one left-to-right pass (`find_regions`), never by a
regex that restarts a search from every opening tag, and JSON is decoded by a bounded decoder
(`decode_json`) that turns every limit (nesting depth, digits of an integer, non-finite numbers,
unpaired surrogates) into a `JsonError` with a reason the model can read, instead of an exception. A parser built only
from these stays linear and exception-free.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rlfactory.text import has_invalid_text, nesting_depth
from rlfactory.tools.base import ToolCall

MAX_JSON_DEPTH = 100  # nested arrays/objects a tool call may have (Python's own limit is ~1000 frames)
MAX_INT_DIGITS = 4300  # digits an integer may have (Python's default int_max_str_digits)


# -- JSON ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JsonValue:
    """A decoded JSON value and the index just after it in the text."""

    value: Any
    end: int


@dataclass(frozen=True)
class JsonError:
    """Why a text is not a usable JSON value. `reason` completes a sentence such as "the tool call
    ..." ("is not valid JSON (Expecting value at char 0)"); `pos` is where decoding stopped, so a
    caller scanning for further values can resume after it."""

    reason: str
    pos: int


def decode_json(text: str, *, max_depth: int = MAX_JSON_DEPTH, max_int_digits: int = MAX_INT_DIGITS) -> JsonValue | JsonError:
    """`text` as exactly one JSON value (whitespace around it allowed), like `json.loads`, but never
    raising: syntax errors, nesting deeper than `max_depth`, integers longer than `max_int_digits`
    digits, numbers JSON cannot carry (NaN, Infinity, 1e999) and strings that are not Unicode
    (unpaired surrogates such as "\\ud800") all come back as a `JsonError`. Linear in `len(text)`."""
    start = _skip_whitespace(text, 0)
    decoded = decode_json_prefix(text, start, max_depth=max_depth, max_int_digits=max_int_digits)
    if isinstance(decoded, JsonValue):
        tail = _skip_whitespace(text, decoded.end)
        if tail != len(text):
            return JsonError(f"is not valid JSON (Extra data at char {tail - start})", tail)
    return decoded


def decode_json_prefix(text: str, start: int = 0, *, max_depth: int = MAX_JSON_DEPTH,
                       max_int_digits: int = MAX_INT_DIGITS) -> JsonValue | JsonError:
    """The JSON value that begins at `text[start]` (like `JSONDecoder.raw_decode`; text may follow
    it), with the limits and the never-raising promise of `decode_json`."""
    refused: list[str] = []
    limit = min(max_int_digits, sys.get_int_max_str_digits() or max_int_digits)

    def parse_int(s: str) -> Any:
        digits = len(s) - s.startswith("-")
        if digits > limit:
            refused.append(f"has a number with {digits} digits (at most {limit})")
            return 0
        return int(s)

    def parse_float(s: str) -> Any:
        value = float(s)
        if not math.isfinite(value):
            refused.append(f"has a number out of range ({_short(s, 40)})")
        return value

    def parse_constant(s: str) -> Any:
        refused.append(f"has {s}, which is not a JSON number")
        return None

    decoder = json.JSONDecoder(parse_int=parse_int, parse_float=parse_float, parse_constant=parse_constant)
    try:
        value, end = decoder.raw_decode(text, start)
    except json.JSONDecodeError as e:
        return JsonError(f"is not valid JSON ({e.msg} at char {e.pos - start})", max(e.pos, start))
    except RecursionError:  # deeper than Python's stack allows: far past max_depth
        # pos: past where the decoder gave up (it cannot nest deeper than the recursion limit)
        return JsonError(f"is nested deeper than {max_depth} levels",
                         _depth_exceeded_at(text, start, sys.getrecursionlimit()))
    if refused:
        return JsonError(refused[0], end)
    if _max_brackets(text, start, end) > max_depth and nesting_depth(value) > max_depth:
        return JsonError(f"is nested deeper than {max_depth} levels", end)
    if _SURROGATE_HINT.search(text, start, end) and has_invalid_text(value):  # a paired escape decodes whole
        # valid JSON syntax, but not Unicode: no UTF-8 encoder (MCP clients, log files) accepts it
        return JsonError("has a string with an unpaired surrogate (\\ud800-\\udfff), which is not valid Unicode", end)
    return JsonValue(value, end)


_WHITESPACE = re.compile(r"[ \t\r\n]*+")


def _skip_whitespace(text: str, pos: int) -> int:
    return _WHITESPACE.match(text, pos).end()  # type: ignore[union-attr]  # `*` always matches


def _max_brackets(text: str, start: int, end: int) -> int:
    """An upper bound on the nesting depth of `text[start:end]` (cheap: two C-level counts)."""
    return text.count("[", start, end) + text.count("{", start, end)


_SURROGATE_HINT = re.compile(r"[\ud800-\udfff]|\\u[dD][89a-fA-F]")  # a surrogate, raw or escaped
_JSON_TOKEN = re.compile(r'"(?:[^"\\]++|\\.)*+"?|[\[\]{}]', re.DOTALL)  # possessive: never backtracks


def _depth_exceeded_at(text: str, start: int, max_depth: int) -> int:
    """Where the value at `start` first nests deeper than `max_depth` (brackets inside strings do not
    count), or where it closes, or len(text). Stops there, so the cost is what it scans."""
    depth = 0
    for m in _JSON_TOKEN.finditer(text, start):
        c = text[m.start()]
        if c in "[{":
            depth += 1
            if depth > max_depth:
                return m.start()
        elif c in "]}":
            depth -= 1
            if depth <= 0:
                return m.end()
    return len(text)


# -- tagged regions ------------------------------------------------------------------------------
@dataclass(frozen=True)
class TagPair:
    """A kind of tagged region: `open`, a body, then `close`.

    `open` is a literal or a compiled pattern whose `finditer` is itself linear (possessive
    quantifiers, no nested unbounded repeats). `close=None`: the region runs to the end of the text.
    `unclosed`: what an opening with no close after it is: plain text ("text", the regex
    `open(.*?)close` behaviour) or a region running to the end of the text ("to_end")."""

    open: str | re.Pattern[str]
    close: str | None = None
    unclosed: Literal["text", "to_end"] = "text"


@dataclass(frozen=True)
class Region:
    """One region found by `find_regions`: `text[start:end]` is the whole region (tags included),
    `text[body_start:body_end]` its body; `pair` is the index of its `TagPair`."""

    pair: int
    start: int
    body_start: int
    body_end: int
    end: int
    closed: bool


def find_regions(text: str, pairs: Sequence[TagPair]) -> list[Region]:
    """The regions of `text`, leftmost first and not overlapping, each ending at the first close of its
    own kind after its opening; tags inside a region are part of its body. At one position the earlier
    pair in `pairs` wins. This is what `re.finditer` over `open1(.*?)close1|open2(.*?)close2|...`
    returns, but in O(len(text) * len(pairs)) time whatever the text (the regex is quadratic when
    openings are not closed).

    Each search resumes where the last one of its kind left off and never rescans: the next opening
    (and close) of each pair is cached until the scan passes it, and once an opening has no close
    after it, neither has any later opening of that pair, so the pair is done."""
    openings = [_UNKNOWN] * len(pairs)  # next opening start per pair at or after pos; _NONE: no more
    bodies = [0] * len(pairs)
    closes = [_UNKNOWN] * len(pairs)  # last close found per pair; _NONE: none after some body start
    regions: list[Region] = []
    pos = 0
    while True:
        best = -1
        for i, pair in enumerate(pairs):
            if openings[i] == _NONE:
                continue
            if openings[i] < pos:
                openings[i], bodies[i] = _find_opening(text, pair.open, pos)
                if openings[i] == _NONE:
                    continue
            if best < 0 or openings[i] < openings[best]:
                best = i
        if best < 0:
            return regions
        pair, start, body_start = pairs[best], openings[best], bodies[best]
        if pair.close:
            if closes[best] != _NONE and closes[best] < body_start:
                closes[best] = text.find(pair.close, body_start)
            close = closes[best]
            if close != _NONE:
                pos = close + len(pair.close)
                regions.append(Region(best, start, body_start, close, pos, True))
                continue
            if pair.unclosed == "text":
                openings[best] = _NONE
                continue
        regions.append(Region(best, start, body_start, len(text), len(text), False))
        return regions


_UNKNOWN, _NONE = -2, -1


def _find_opening(text: str, opening: str | re.Pattern[str], pos: int) -> tuple[int, int]:
    """(start, end) of the first `opening` at or after `pos`, or (_NONE, _NONE)."""
    if isinstance(opening, str):
        i = text.find(opening, pos)
        return (i, i + len(opening)) if i != -1 else (_NONE, _NONE)
    m = opening.search(text, pos)
    return (m.start(), m.end()) if m else (_NONE, _NONE)


def find_json_regions(text: str, pair: TagPair) -> list[Region]:
    """`find_regions(text, [pair])` for tags around a JSON value (`<tool_call>{...}</tool_call>`),
    whose strings may hold the close tag itself (a call whose argument is code or markup that
    contains `</tool_call>`, as a template's `tojson` writes it): a region ends at the first close
    after the JSON value that begins its body (whitespace around it allowed) when that value runs
    past the first close, else at the first close, as `find_regions`.

    Linear in `len(text)`: a decode reads past a later opening only inside a JSON string (outside
    one, `<` ends it), and a string a second decode starts there cannot hold a third's (its quote
    would be an escaped `\\"` inside the first, where the second decode fails on the backslash), so
    no character is read by more than two decodes. `pair.open` and `pair.close` are literals."""
    assert isinstance(pair.open, str) and pair.close is not None
    regions: list[Region] = []
    pos = 0
    while (start := text.find(pair.open, pos)) != -1:
        body_start = start + len(pair.open)
        close = text.find(pair.close, body_start)
        if close == -1:
            if pair.unclosed == "to_end":
                regions.append(Region(0, start, body_start, len(text), len(text), False))
            return regions
        decoded = decode_json_prefix(text, _skip_whitespace(text, body_start))
        if isinstance(decoded, JsonValue) and decoded.end > close:
            after = _skip_whitespace(text, decoded.end)
            if text.startswith(pair.close, after):
                close = after
        pos = close + len(pair.close)
        regions.append(Region(0, start, body_start, close, pos, True))
    return regions


def outside_regions(text: str, regions: Sequence[Region]) -> str:
    """`text` with `regions` (sorted, not overlapping, as `find_regions` returns them) cut out."""
    parts, pos = [], 0
    for r in regions:
        parts.append(text[pos: r.start])
        pos = r.end
    parts.append(text[pos:])
    return "".join(parts)


# -- reasoning and answers ---------------------------------------------------------------------------
THINK = TagPair("<think>", "</think>", unclosed="to_end")
ANSWER = TagPair("<answer>", "</answer>")
_THINK_CLOSE = "</think>"


def split_reasoning(text: str, protect: Sequence[TagPair] = ()) -> tuple[str, str]:
    """(reasoning, visible text). Reasoning is everything inside `<think>...</think>`.

    Also handles a `<think>` opened by the prompt (the first `</think>` outside `protect` regions
    comes before any `<think>`: everything up to it is reasoning) and an unclosed `<think>`
    (everything after it is reasoning). `protect`: kinds of regions, such as tool-call blocks, whose
    text is never reasoning even if it contains the tags; whichever of a region and a `<think>`
    starts first wins, so a call inside `<think>` is reasoning and a `<think>` inside a call's JSON
    is an argument. Linear in `len(text)`."""
    if isinstance(protect, str):  # the old API took a regex; a regex cannot be scanned linearly
        raise TypeError("split_reasoning(protect=...) takes TagPairs, not a regex string")
    think = len(protect)
    regions = find_regions(text, [*protect, THINK])
    first_think = next((r.start for r in regions if r.pair == think), len(text))
    reasoning: list[str] = []
    pos, ri = 0, 0
    close = text.find(_THINK_CLOSE)
    while close != -1 and close < first_think:
        while ri < len(regions) and regions[ri].end <= close:
            ri += 1
        if ri < len(regions) and regions[ri].start <= close:  # inside a protected region
            close = text.find(_THINK_CLOSE, regions[ri].end)
            continue
        reasoning.append(text[:close])  # the prompt opened the block
        pos = close + len(_THINK_CLOSE)
        break
    visible: list[str] = []
    for r in regions:
        if r.pair == think and r.start >= pos:
            visible.append(text[pos: r.start])
            reasoning.append(text[r.body_start: r.body_end])
            pos = r.end
    visible.append(text[pos:])
    return "\n".join(r.strip() for r in reasoning), "".join(visible)


def answer_text(visible: str) -> str:
    """The content of the last `<answer>...</answer>` if there is one, else the stripped text."""
    found = find_regions(visible, [ANSWER])
    return visible[found[-1].body_start: found[-1].body_end].strip() if found else visible.strip()


# -- tool calls --------------------------------------------------------------------------------------
ARG_KEYS = ("arguments", "parameters")


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def call_from_json(blob: str, arg_keys: tuple[str, ...] = ARG_KEYS) -> ToolCall | str:
    """A ToolCall from a JSON call object, or the reason (a str) it cannot be one.

    Accepts `{"name": n, "arguments": {...}}` with its keys in any order, the `"parameters"` spelling,
    arguments given as a JSON string, and the OpenAI `{"function": {...}}` wrapper. Missing
    arguments mean `{}`. JSON is decoded with `decode_json`'s limits."""
    decoded = decode_json(blob)
    if isinstance(decoded, JsonError):
        return f"the tool call {decoded.reason}: {_short(blob.strip())!r}"
    return call_from_object(decoded.value, arg_keys)


def unwrap_function(obj: Any) -> Any:
    """The inner object of an OpenAI-style `{"type": "function", "function": {...}}` call, else `obj`."""
    if isinstance(obj, dict) and "name" not in obj and isinstance(obj.get("function"), dict):
        return obj["function"]
    return obj


def is_call_object(obj: Any, arg_keys: tuple[str, ...] = ARG_KEYS) -> bool:
    """Whether a decoded JSON value has the shape of one tool call: an object with a "name" key and
    one of `arg_keys`, in any order, and "type" (if present) equal to "function"; or such an object
    under an OpenAI "function" wrapper. Other keys are allowed. Values are not checked (see
    `call_from_object`), so a call with bad arguments is still recognised as an attempt."""
    if isinstance(obj, dict) and obj.get("type", "function") != "function":
        return False
    obj = unwrap_function(obj)
    return (isinstance(obj, dict) and "name" in obj and any(k in obj for k in arg_keys)
            and obj.get("type", "function") == "function")


def call_from_object(obj: Any, arg_keys: tuple[str, ...] = ARG_KEYS) -> ToolCall | str:
    """Like `call_from_json` for an already decoded JSON value."""
    obj = unwrap_function(obj)
    if not isinstance(obj, dict):
        return f"a tool call must be a JSON object with \"name\" and arguments, got {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return "the tool call has no \"name\" string"
    args: Any = {}
    for key in arg_keys:
        if key in obj:
            args = obj[key]
            break
    if isinstance(args, str):
        decoded = decode_json(args) if args.strip() else JsonValue({}, 0)
        if isinstance(decoded, JsonError):
            return f"the arguments of {name!r} are a string that {decoded.reason}"
        args = decoded.value
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return f"the arguments of {name!r} must be a JSON object, got {type(args).__name__}"
    return ToolCall(name=name.strip(), arguments=args)


def unknown_tool_reason(calls: list[ToolCall], known: Collection[str] | None) -> str | None:
    """A reason naming the first call to a tool not in `known` (None when all are known or no list)."""
    if known is None:
        return None
    for call in calls:
        if call.name not in known:
            available = ", ".join(sorted(known)) or "none"
            return f"unknown tool {call.name!r}; available tools: {available}"
    return None
