"""Tool-verified rewards: run the model's artifact (a SQL query, a Python snippet) through a tool
and compare what it returns with the expected result from the dataset row.

    VerifyReward(tool, make_arguments=artifact_arguments("query", code_block("sql")),
                 compare=same_rows("expected_rows"))

`tool` is any `rlfactory.tools.base.Tool`. Comparators are `compare(result, trajectory) -> float`.
"""

from __future__ import annotations

import inspect
import json
from collections import Counter
from typing import Any, Callable

from rlfactory.rewards.base import RewardScore, require_scorable
from rlfactory.rewards.text import AnswerExtractor, tagged_answer
from rlfactory.tools.base import CRASHED, Tool, ToolResult
from rlfactory.trajectory import Trajectory

Compare = Callable[[ToolResult, Trajectory], float]
MakeArguments = Callable[[Any], "dict[str, Any] | None"]


def artifact_arguments(argument: str = "query", extractor: AnswerExtractor | None = None) -> MakeArguments:
    """make_arguments: `{argument: <extracted artifact>}`, or None when nothing was extracted.

    `extractor` defaults to the last `<answer>...</answer>`; use `code_block("sql")` for fenced code.
    """
    extract = extractor or tagged_answer("answer")

    def make(trajectory: Trajectory) -> dict[str, Any] | None:
        artifact = extract(trajectory)
        return None if artifact is None else {argument: artifact}

    return make


class VerifyReward:
    """Score = compare(tool result, trajectory) when the artifact ran cleanly, else 0.

    Terms: `ran` (1.0 when an artifact was found and the tool returned without error) and
    `match` (the comparator's value, 0 when it did not run). A tool that raises is treated as a
    crashed call (`ran` 0), never as an exception in training.
    """

    def __init__(self, tool: Tool, make_arguments: MakeArguments, compare: Compare) -> None:
        self.tool, self.make_arguments, self.compare = tool, make_arguments, compare

    async def run(self, trajectory: Trajectory) -> ToolResult | None:
        """The tool's result on the trajectory's artifact (None when there is no artifact)."""
        arguments = self.make_arguments(trajectory)
        if arguments is None:
            return None
        try:
            return await self.tool.call(arguments)
        except Exception as e:  # a tool should not raise; if it does, it is a failed run
            return ToolResult.error(f"{type(e).__name__}: {e}", status=CRASHED)

    async def score(self, trajectory: Trajectory) -> RewardScore:
        require_scorable(trajectory)
        result = await self.run(trajectory)
        if result is None or result.is_error:
            return RewardScore(total=0.0, terms={"ran": 0.0, "match": 0.0})
        value = self.compare(result, trajectory)
        if inspect.isawaitable(value):
            value = await value
        return RewardScore(total=float(value), terms={"ran": 1.0, "match": float(value)})


# --- comparators -----------------------------------------------------------------------------------


def _expected(trajectory: Trajectory, expected: str | Callable[[Trajectory], Any]) -> Any:
    if callable(expected):
        return expected(trajectory)
    info = trajectory.info
    if expected not in info:
        raise KeyError(f"the dataset row has no {expected!r} field to verify against (fields: {sorted(info)})")
    return info[expected]


def _cell(value: Any, digits: int) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return round(float(value), digits)
    text = str(value).strip()
    try:
        return round(float(text), digits)
    except ValueError:
        return text


def rows_of(value: Any, digits: int = 6) -> list[tuple]:
    """Rows as tuples of normalised cells (numbers -> rounded floats, text stripped).

    Accepts a list of rows (lists, tuples, dicts (values in order) or scalars), a dict with
    "rows", a ToolResult (its `data`, else its text parsed as JSON, else one row per line), or a
    JSON string.
    """
    if isinstance(value, ToolResult):
        value = value.data if value.data is not None else value.text
    if isinstance(value, dict) and "rows" in value:
        value = value["rows"]
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = [[line] for line in value.splitlines() if line.strip()]
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, list):
        value = [value]
    rows = []
    for row in value:
        cells = list(row.values()) if isinstance(row, dict) else list(row) if isinstance(row, (list, tuple)) else [row]
        rows.append(tuple(_cell(c, digits) for c in cells))
    return rows


def same_rows(expected: str | Callable[[Trajectory], Any] = "expected_rows", ordered: bool = False, digits: int = 6) -> Compare:
    """Comparator: 1.0 when the result's rows equal the expected rows as a multiset (order-insensitive,
    duplicates counted) or, with `ordered`, as a sequence. `expected`: an info key or a function."""

    def compare(result: ToolResult, trajectory: Trajectory) -> float:
        got, want = rows_of(result, digits), rows_of(_expected(trajectory, expected), digits)
        return float(got == want if ordered else Counter(got) == Counter(want))

    return compare


def _printed(text: str) -> str:
    lines = [line.rstrip() for line in str(text).replace("\r\n", "\n").split("\n")]
    return "\n".join(lines).strip("\n")


def same_output(expected: str | Callable[[Trajectory], Any] = "expected_output") -> Compare:
    """Comparator: 1.0 when the result's text equals the expected printed output, ignoring trailing
    whitespace on each line and blank lines at both ends. `expected`: an info key or a function."""

    def compare(result: ToolResult, trajectory: Trajectory) -> float:
        return float(_printed(result.text) == _printed(_expected(trajectory, expected)))

    return compare
