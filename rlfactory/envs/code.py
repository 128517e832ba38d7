"""The Python env: arithmetic and word problems that need exact results, solved with a sandboxed
Python tool (`python(code)`; see rlfactory.envs.sandbox for what the sandbox guarantees). Reward:
numeric equality + format.

Problems are generated deterministically by seed; train and test never share a question.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

from rlfactory.envs.base import Env, EnvTools
from rlfactory.envs.data import qa_row, question_of, read_parquet, targets, write_parquet
from rlfactory.envs.registry import register_env
from rlfactory.envs.sandbox import SANDBOX_MODES, arun_python, check_sandbox, run_python
from rlfactory.rewards.base import Reward
from rlfactory.rewards.rule import RuleReward
from rlfactory.tools.base import ERROR, TIMEOUT, ToolResult

SYSTEM_PROMPT = (
    "Solve the problem. Use the python tool to compute exact results: print what you need. "
    "Give the final answer as <answer>number</answer>."
)
DATA_SOURCE = "rlfactory_code"


@dataclass(frozen=True)
class Problem:
    question: str
    expression: str  # a Python expression whose value is the answer

    @property
    def answer(self) -> str:
        return str(eval(self.expression, {"__builtins__": {}}))  # our own generated arithmetic only


def _n(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def _arith(rng: random.Random) -> Problem:
    a, b, c = _n(rng, rng.choice((3, 4))), _n(rng, rng.choice((3, 4))), _n(rng, 2)
    form = rng.randrange(4)
    if form == 0:
        expr = f"{a} * {b}"
    elif form == 1:
        expr = f"{a} + {b} * {c}"
    elif form == 2:
        expr = f"({a} - {b}) * {c}"
    else:
        expr = f"{_n(rng, 1) + 1} ** {rng.randint(10, 30)} % {_n(rng, 3)}"
    return Problem(f"What is {expr}?", expr)


def _word(rng: random.Random) -> Problem:
    a, b, c = _n(rng, 3), _n(rng, 2), _n(rng, 2)
    form = rng.randrange(5)
    if form == 0:
        return Problem(f"A box holds {a} pens. How many pens are in {b} boxes?", f"{a} * {b}")
    if form == 1:
        return Problem(f"Ann has {a} coins. She gets {b} coins a day for {c} days. How many coins does she have?",
                       f"{a} + {b} * {c}")
    if form == 2:
        total = a * b
        return Problem(f"{total} apples are shared equally by {b} kids. How many apples does each kid get?",
                       f"{total} // {b}")
    if form == 3:
        return Problem(f"A car drives {a} km a day for {b} days. How far does it drive?", f"{a} * {b}")
    stock = b * c + a
    return Problem(f"A shop has {stock} eggs and sells {b} boxes of {c} eggs. How many eggs are left?",
                   f"{stock} - {b} * {c}")


def make_problems(seed: int, n_train: int, n_test: int, word_fraction: float = 0.5) -> dict[str, list[Problem]]:
    """`n_train` / `n_test` problems; a question never appears in both splits."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: dict[str, list[Problem]] = {}
    for split, n in (("train", n_train), ("test", n_test)):
        probs: list[Problem] = []
        while len(probs) < n:
            p = _word(rng) if rng.random() < word_fraction else _arith(rng)
            if p.question not in seen:
                seen.add(p.question)
                probs.append(p)
        out[split] = probs
    return out


def problem_rows(problems: list[Problem], split: str) -> list[dict[str, Any]]:
    return [
        qa_row(data_source=DATA_SOURCE, split=split, index=i, question=p.question, answers=[p.answer],
               prompt_text=p.question, ability="math", extra={"expression": p.expression})
        for i, p in enumerate(problems)
    ]


def python_tool(timeout_s: float = 5.0, memory_mb: int = 512, max_output_chars: int = 2000,
                sandbox: str = "strict") -> Callable[..., Any]:
    """The `python` tool as a typed async function (make a Tool of it with `function_tool`).
    `sandbox`: `strict` or `weak` (see rlfactory.envs.sandbox); call `check_sandbox` at start-up."""

    async def python(code: str) -> ToolResult:
        """Run a Python program in a sandbox and return what it prints (stdout, then stderr and the
        exit status if any). No network, a time and a memory limit.

        Args:
            code: The Python program; print the values you need.
        """
        r = await arun_python(code, timeout_s=timeout_s, memory_mb=memory_mb, max_output_chars=max_output_chars,
                              mode=sandbox)
        if r.ok:
            return ToolResult(text=r.text(), truncated=r.truncated)
        return ToolResult(text=r.text(), is_error=True, status=TIMEOUT if r.timed_out else ERROR, truncated=r.truncated)

    return python


@register_env("code")
class CodeEnv(Env):
    """Options: `seed` (0), `n_train` (1000), `n_test` (200), `word_fraction` (0.5), `train_data` /
    `test_data` (parquet in Search-R1's layout; replace the generated problems), `timeout_s` (5),
    `memory_mb` (512), `max_turns` (3), `system_prompt`, `family` (unused: every tool-calling
    family gets the same messages), `sandbox` (`strict`, the default: bubblewrap namespaces, and
    the run stops at start-up with one line naming the cause where they are unavailable; `weak`:
    no isolation from the trainer's user, chosen by name only, announced by a warning line at
    start-up; see rlfactory.envs.sandbox)."""

    name = "code"

    def __init__(self, *, seed: int = 0, n_train: int = 1000, n_test: int = 200, word_fraction: float = 0.5,
                 train_data: str | None = None, test_data: str | None = None, timeout_s: float = 5.0,
                 memory_mb: int = 512, max_turns: int = 3, system_prompt: str | None = None,
                 family: str | None = None, sandbox: str = "strict", **options: Any) -> None:
        if options:
            raise TypeError(f"code env: unknown option(s) {', '.join(sorted(options))}")
        if sandbox not in SANDBOX_MODES:
            raise ValueError(f"code env: env.options.sandbox={sandbox!r}: expected one of {SANDBOX_MODES}")
        self.sandbox = sandbox
        self.seed, self.n_train, self.n_test, self.word_fraction = seed, n_train, n_test, word_fraction
        self.data = {"train": train_data, "test": test_data}
        self.timeout_s, self.memory_mb, self.max_turns = timeout_s, memory_mb, max_turns
        self.system_prompt = system_prompt or SYSTEM_PROMPT
        self.family = family
        self._generated: dict[str, list[Problem]] | None = None

    def load_split(self, split: str) -> list[dict[str, Any]]:
        path = self.data.get(split)
        if path:
            return read_parquet(path)
        if split not in ("train", "test"):
            raise ValueError(f"code env: unknown split {split!r} (train, test)")
        if self._generated is None:
            self._generated = make_problems(self.seed, self.n_train, self.n_test, self.word_fraction)
        return problem_rows(self._generated[split], split)

    def write_data(self, out_dir: str) -> dict[str, str]:
        """Write the generated splits as parquet files; returns {split: path}."""
        return {s: str(write_parquet(self.load_split(s), f"{out_dir}/{s}.parquet")) for s in ("train", "test")}

    def reset(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": question_of(row)}]

    def tools(self) -> EnvTools:
        check_sandbox(self.sandbox)  # strict: refuse here, at start-up; weak: say so, once
        return EnvTools(python=[python_tool(self.timeout_s, self.memory_mb, sandbox=self.sandbox)])

    def reward(self) -> Reward:
        return RuleReward({"numeric": 0.9, "format": 0.1})

    def solve(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """Print the problem's expression in the sandbox, answer with what it printed."""
        expr = (row.get("extra_info") or {}).get("expression")
        if not expr:
            raise ValueError("code env solver: the row has no extra_info.expression (not a generated problem)")
        code = f"print({expr})"
        result = run_python(code, timeout_s=self.timeout_s, memory_mb=self.memory_mb, mode=self.sandbox)
        if not result.ok:
            raise RuntimeError(f"code env solver: the sandbox failed on {code!r}: {result.text()}")
        answer = result.stdout.strip()
        if targets(row) and answer not in targets(row):
            raise RuntimeError(f"code env solver: printed {answer!r}, expected {targets(row)}")
        return self.reset(row) + [
            {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function", "function": {"name": "python", "arguments": {"code": code}}}]},
            {"role": "tool", "name": "python", "content": result.text()},
            {"role": "assistant", "content": f"<answer>{answer}</answer>"},
        ]
