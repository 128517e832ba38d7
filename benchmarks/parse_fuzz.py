"""Fuzz every ToolManager family's `parse()`: no input may raise, and parsing must stay linear.

    .venv/bin/python benchmarks/parse_fuzz.py [--n 100000] [--seed 0]

Inputs per family (seeded): turns the family's own `format_turn` writes (calls with nested, unicode
and numeric arguments, answers, reasoning; for llama3 also keys in every order, "type": "function",
the OpenAI wrapper, `<|python_tag|>`, lists and `;`), each mutated 1-4 times (spans deleted,
duplicated, swapped, truncated; tags, quotes, braces, backslashes and other turns spliced in), and
one input in ten an adversarial shape: integers of 4,000-6,000 digits, nesting 90-3,000 deep (as
JSON and as a JSON string inside "arguments"), one tag or JSON opening repeated up to 12,000
times, long runs of quotes or backslashes.

Prints per family: inputs, exceptions (must be 0), what the inputs parsed to, the slowest parse in
ms and that input's length. Then a linearity table: for each adversarial shape, the parse time per
character at 8k, 32k and 128k characters as a ratio to the 8k figure (1.0 = linear; the parsers
before this fix, which restarted a search from every opening tag, were quadratic: 16x at 128k).
Times are CPU time of the parsing thread (the slowest wall-clock parse is printed beside it), so
other work on a shared machine inflates them little; the load average is printed at start and end.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

TAGS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<answer>", "</answer>", "<search>", "</search>",
        "<information>", "</information>", "<tool_response>", "<|python_tag|>", "<|im_end|>", "<|eot_id|>"]
PIECES = ['"', "\\", "\\\"", "{", "}", "[", "]", ":", ",", ";", "\n", " ", "null", "true", "-", "0", "1e999",
          "NaN", "Infinity", '{"name": ', '"parameters": ', '"arguments": ', '"type": "function"', '"function": ',
          "\\u00e9", "\\ud800", "é", "漢", "\x00", "\t"]
WORDS = ["Zor", "Brathor", "capital", "search", "now", "calculator", "query", "1 + 2", "Zürich", "漢字", "a\nb"]
ADVERSARIAL_SHARE = 10  # one input in ten is an adversarial shape
LINEARITY_SIZES = (8_000, 32_000, 128_000)


@dataclass
class FamilyReport:
    family: str
    inputs: int = 0
    exceptions: int = 0
    first_exceptions: list[str] = field(default_factory=list)
    results: Counter = field(default_factory=Counter)
    slowest_ms: float = 0.0  # CPU time of this thread (what other load on the machine does not inflate)
    slowest_len: int = 0
    slowest_head: str = ""
    slowest_gc_ms: float = 0.0  # of slowest_ms, time in Python's garbage collector
    slowest_no_gc_ms: float = 0.0  # the slowest parse not counting garbage collection
    slowest_no_gc_len: int = 0
    slowest_wall_ms: float = 0.0  # wall clock, for comparison (includes being preempted)
    slowest_wall_len: int = 0
    total_s: float = 0.0


# -- valid turns -----------------------------------------------------------------------------------
def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return rng.choice(WORDS)
    if kind == 1:
        return rng.randint(-10**9, 10**9)
    if kind == 2:
        return rng.choice([0.5, -1.25e-7, 3.0e20])
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return "".join(rng.choice(WORDS + PIECES) for _ in range(rng.randint(0, 6)))
    if kind == 5:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(WORDS): _value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def _call(rng: random.Random) -> Any:
    from rlfactory.tools.base import ToolCall

    name = rng.choice(["search", "now", "calculator", "lookup_capital", "run_python"])
    return ToolCall(name, {rng.choice(WORDS): _value(rng) for _ in range(rng.randint(0, 3))})


def _llama_call_json(rng: random.Random, call: Any) -> str:
    """One call object in any of the spellings Llama models write, keys in a random order."""
    args: Any = call.arguments if rng.random() < 0.8 else json.dumps(call.arguments)
    keys = [("name", call.name), (rng.choice(["parameters", "arguments"]), args)]
    if rng.random() < 0.3:
        keys.append(("type", "function"))
    rng.shuffle(keys)
    obj: dict[str, Any] = dict(keys)
    if rng.random() < 0.1:
        obj = {"type": "function", "function": {"name": call.name, "arguments": args}}
    return json.dumps(obj, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, None, 2]))


def valid_turn(family: str, manager: Any, rng: random.Random) -> str:
    """A turn the family reads as calls or as an answer."""
    from rlfactory.chat.template import ModelTurn

    calls = [_call(rng) for _ in range(rng.choice([0, 1, 1, 2, 3]))]
    reasoning = rng.choice([None, "I should look it up.", "maybe <tool_call>{}</tool_call>", ""])
    content = rng.choice(["", "Let me check.", "The answer is Brathor.", "<answer> Brathor </answer>"])
    if family == "searchr1":
        for c in calls:
            c.name, c.arguments = "search", {"query": rng.choice(WORDS)}
        return manager.format_turn(ModelTurn(calls, "" if calls else content, reasoning))
    if family == "llama3" and calls:
        objs = [_llama_call_json(rng, c) for c in calls]
        if rng.random() < 0.2:
            body = "[" + ", ".join(objs) + "]"
        else:
            body = rng.choice(["\n", "; ", ";\n"]).join(objs)
        prefix = rng.choice(["", "", "<|python_tag|>", content + "\n" if content else ""])
        return prefix + body
    return manager.format_turn(ModelTurn(calls, content, reasoning if family == "qwen3" else None))


# -- mutations and adversarial shapes -------------------------------------------------------------------
def _span(rng: random.Random, text: str) -> tuple[int, int]:
    a = rng.randint(0, len(text))
    return a, min(len(text), a + rng.randint(0, 40))


def mutate(text: str, rng: random.Random, other: Callable[[], str]) -> str:
    op = rng.randrange(9)
    a, b = _span(rng, text)
    if op == 0:
        return text[:a] + text[b:]
    if op == 1:
        return text[:b] + text[a:b] * rng.randint(1, 5) + text[b:]
    if op == 2:
        return text[:a] + rng.choice(TAGS) + text[a:]
    if op == 3:
        return text[:a] + "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 6))) + text[a:]
    if op == 4:
        return text[: rng.randint(0, len(text))]
    if op == 5:
        c, d = _span(rng, text)
        return text[:a] + text[c:d] + text[b:] if a <= c else text[:c] + text[a:b] + text[d:]
    if op == 6:
        return text[:a] + other() + text[a:]
    if op == 7:
        return text[:a] + "9" * rng.randint(4000, 6000) + text[b:]
    return text[:a] + rng.choice(TAGS) * rng.randint(2, 500) + text[a:]


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


ADVERSARIAL: dict[str, Callable[[int], str]] = {
    # name -> text of about n characters
    "<tool_call> unclosed": lambda n: "<tool_call>" * (n // 11),
    "<search> unclosed": lambda n: "<search>" * (n // 8),
    "<answer> unclosed": lambda n: "<answer>" * (n // 8),
    "<think> unclosed": lambda n: "<think>" * (n // 7),
    "</think> stray": lambda n: "</think>" * (n // 8),
    '{"name": repeated': lambda n: '{"name": ' * (n // 9),
    "line-start { repeated": lambda n: '\n{"a": [' * (n // 8),
    "[ repeated": lambda n: "[" * n,
    "quotes and backslashes": lambda n: '{"name": "' + '\\"' * (n // 2),
    "<tool_call>{ unclosed": lambda n: '<tool_call>{"name": "f", "arguments": ' * (n // 38),
}


def adversarial(rng: random.Random) -> str:
    shape = rng.randrange(6)
    if shape == 0:
        digits = "1" * rng.randint(4000, 6000)
        return rng.choice([
            '<tool_call>{"name":"f","arguments":{"x":' + digits + '}}</tool_call>',
            '{"name": "f", "parameters": {"x": -' + digits + '}}',
            '<tool_call>{"name":"f","arguments":{"x":1.' + digits + 'e99999}}</tool_call>',
        ])
    if shape == 1:
        depth = rng.choice([90, 100, 101, 500, 999, 1000, 2000, 3000])
        args = rng.choice([_deep(depth), json.dumps(_deep(depth)), '{"a":' * depth + "1" + "}" * depth])
        return rng.choice(['<tool_call>{"name":"f","arguments":' + args + '}</tool_call>',
                           '{"name": "f", "parameters": ' + args + '}', "<|python_tag|>" + args])
    if shape == 2:
        return rng.choice(TAGS) * rng.randint(1000, 12000)
    if shape == 3:
        return rng.choice(list(ADVERSARIAL.values()))(rng.randint(1000, 40000))
    if shape == 4:
        return "".join(rng.choice(TAGS + PIECES) for _ in range(rng.randint(1000, 8000)))
    return "<think>" + "x" * rng.randint(0, 100) + rng.choice(TAGS) * rng.randint(100, 3000) + "</think>"


def fuzz_inputs(family: str, manager: Any, n: int, seed: int) -> Iterator[str]:
    """`n` fuzz inputs for `family`, the same ones for the same seed."""
    rng = random.Random(f"{family}:{seed}")
    for i in range(n):
        if i % ADVERSARIAL_SHARE == ADVERSARIAL_SHARE - 1:
            yield adversarial(rng)
            continue
        text = valid_turn(family, manager, rng)
        for _ in range(rng.choice([0, 1, 1, 2, 3, 4])):
            text = mutate(text, rng, lambda: valid_turn(family, manager, rng))
        yield text


class GcClock:
    """CPU time spent in Python's garbage collector (a full collection walks every live object, ~0.1 s
    with transformers loaded, and lands inside whichever parse allocated last)."""

    def __init__(self) -> None:
        self.total = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.thread_time()
        else:
            self.total += time.thread_time() - self._start

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        gc.callbacks.remove(self)


def fuzz_family(family: str, manager: Any, n: int, seed: int) -> FamilyReport:
    """Parse `n` inputs; count exceptions and what each input parsed to; keep the slowest parse."""
    report = FamilyReport(family)
    with GcClock() as gc_clock:
        for text in fuzz_inputs(family, manager, n, seed):
            _parse_one(manager, text, report, gc_clock)
    return report


def _parse_one(manager: Any, text: str, report: FamilyReport, gc_clock: GcClock) -> None:
    """Parse one input into `report`: its outcome or exception, CPU, GC and wall time."""
    gc0, wall0, cpu0 = gc_clock.total, time.perf_counter(), time.thread_time()
    try:
        result = manager.parse(text)
    except Exception as e:  # noqa: BLE001 -- counting them is the point
        report.exceptions += 1
        if len(report.first_exceptions) < 3:
            report.first_exceptions.append(f"{type(e).__name__}: {e} on {text[:80]!r} (len {len(text)})\n"
                                           + traceback.format_exc(limit=-3))
    else:
        report.results[type(result).__name__] += 1
    cpu_ms, wall_ms = (time.thread_time() - cpu0) * 1000, (time.perf_counter() - wall0) * 1000
    gc_ms = (gc_clock.total - gc0) * 1000
    report.inputs += 1
    report.total_s += cpu_ms / 1000
    if cpu_ms > report.slowest_ms:
        report.slowest_ms, report.slowest_gc_ms, report.slowest_len = cpu_ms, gc_ms, len(text)
        report.slowest_head = text[:40]
    if cpu_ms - gc_ms > report.slowest_no_gc_ms:
        report.slowest_no_gc_ms, report.slowest_no_gc_len = cpu_ms - gc_ms, len(text)
    if wall_ms > report.slowest_wall_ms:
        report.slowest_wall_ms, report.slowest_wall_len = wall_ms, len(text)


def linearity(manager: Any, repeats: int = 5) -> dict[str, list[float]]:
    """Per adversarial shape: best-of-`repeats` parse CPU time per character (µs) at each size."""
    table: dict[str, list[float]] = {}
    for name, make in ADVERSARIAL.items():
        row = []
        for size in LINEARITY_SIZES:
            text = make(size)
            best = min(_timed(manager.parse, text) for _ in range(repeats))
            row.append(best / len(text) * 1e6)
        table[name] = row
    return table


def _timed(fn: Callable[[str], Any], text: str) -> float:
    t0 = time.thread_time()
    fn(text)
    return time.thread_time() - t0


def make_managers() -> dict[str, Any]:
    from transformers import AutoTokenizer

    from rlfactory.chat import Llama3ToolManager, Qwen3ToolManager, SearchR1ToolManager
    from rlfactory.tiny.cache import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("tiny:1m"))
    return {"qwen3": Qwen3ToolManager(tok), "llama3": Llama3ToolManager(tok), "searchr1": SearchR1ToolManager(tok)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="inputs per family")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    managers = make_managers()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    print(f"{args.n} inputs per family, seed {args.seed}, one in {ADVERSARIAL_SHARE} adversarial")
    ok = True
    for family, manager in managers.items():
        r = fuzz_family(family, manager, args.n, args.seed)
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(r.results.items()))
        print(f"{family}: {r.inputs} inputs, {r.exceptions} exceptions; {kinds}")
        print(f"    slowest parse {r.slowest_ms:.2f} ms CPU on an input of {r.slowest_len} chars ({r.slowest_head!r}...), "
              f"{r.slowest_gc_ms:.2f} ms of it in Python's garbage collector")
        print(f"    slowest not counting garbage collection {r.slowest_no_gc_ms:.2f} ms CPU ({r.slowest_no_gc_len} chars); "
              f"slowest wall clock {r.slowest_wall_ms:.2f} ms ({r.slowest_wall_len} chars); "
              f"mean {r.total_s / max(r.inputs, 1) * 1e6:.0f} us CPU")
        for e in r.first_exceptions:
            print("    " + e.replace("\n", "\n    "))
        ok &= r.exceptions == 0
    print(f"linearity: parse CPU time per char at {', '.join(f'{s // 1000}k' for s in LINEARITY_SIZES)} chars, "
          "as a ratio to the 8k figure (1.0 = linear, 16 = quadratic at 128k)")
    worst = 0.0
    for family, manager in managers.items():
        for name, row in linearity(manager).items():
            ratios = [x / row[0] for x in row]
            worst = max(worst, ratios[-1])
            print(f"    {family:8s} {name:24s} {row[0]:6.3f} us/char at 8k; "
                  + " ".join(f"{r:5.2f}x" for r in ratios))
    print(f"exceptions: {'none' if ok else 'SOME'}  (target 0)  {'PASS' if ok else 'FAIL'}")
    print(f"worst per-char ratio 128k/8k: {worst:.2f}x  (target <= 2, linear)  {'PASS' if worst <= 2 else 'FAIL'}")
    print(f"load average {os.getloadavg()[0]:.2f} at end (other work on this machine shares the CPUs)")
    return 0 if ok and worst <= 2 else 1


if __name__ == "__main__":
    sys.exit(main())
