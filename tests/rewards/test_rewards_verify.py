"""VerifyReward with real tools: SQL on an in-memory sqlite database (a function tool) and Python
snippets run in a subprocess."""

import asyncio
import sqlite3
import subprocess
import sys

import pytest

from rlfactory.config import RewardConfig, validate
from rlfactory.rewards import (
    VerifyReward,
    artifact_arguments,
    build_reward,
    code_block,
    rows_of,
    same_output,
    same_rows,
)
from rlfactory.trajectory import Segment, Trajectory
from rlfactory.tools.base import ToolResult
from rlfactory.tools.function import function_tool

SCHEMA = """
CREATE TABLE city (name TEXT, country TEXT, population INTEGER);
INSERT INTO city VALUES ('Paris', 'FR', 2100000), ('Lyon', 'FR', 520000), ('Rome', 'IT', 2800000);
"""


def run_sql(query: str) -> list:
    """Run a read-only SQL query on the city database.

    Args:
        query: one SQLite SELECT statement.
    """
    db = sqlite3.connect(":memory:")
    try:
        db.executescript(SCHEMA)
        return [list(r) for r in db.execute(query).fetchall()]
    finally:
        db.close()


class PythonTool:
    """A Tool that runs a snippet in a fresh Python process and returns what it printed."""

    name = "python"
    description = "Run Python code and return its standard output."
    parameters = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}

    async def call(self, arguments):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-c", arguments["code"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout=20)
        if proc.returncode:
            return ToolResult.error(err.decode()[-500:])
        return ToolResult(text=out.decode())


def make(text, **info):
    segs = [Segment("prompt", [1], "p"), Segment("model", [2], text, logprobs=[0.0])]
    return Trajectory(id="t", group="g", segments=segs, info=info)


EXPECTED = [["Paris", 2100000], ["Lyon", 520000]]


def test_sql_result_set_comparison():
    reward = VerifyReward(function_tool(run_sql), artifact_arguments("query", code_block("sql")), same_rows())
    ok = make("```sql\nSELECT name, population FROM city WHERE country = 'FR' ORDER BY population\n```", expected_rows=EXPECTED)
    s = asyncio.run(reward.score(ok))  # order differs from EXPECTED: still the same result set
    assert s.total == 1.0 and s.terms == {"ran": 1.0, "match": 1.0}
    wrong = make("```sql\nSELECT name, population FROM city\n```", expected_rows=EXPECTED)
    assert asyncio.run(reward.score(wrong)).terms == {"ran": 1.0, "match": 0.0}
    broken = make("```sql\nSELECT nope FROM city\n```", expected_rows=EXPECTED)
    assert asyncio.run(reward.score(broken)).terms == {"ran": 0.0, "match": 0.0}  # sqlite error -> error result
    assert asyncio.run(reward.score(make("no sql here", expected_rows=EXPECTED))).total == 0.0
    ordered = VerifyReward(function_tool(run_sql), artifact_arguments("query", code_block("sql")), same_rows(ordered=True))
    assert asyncio.run(ordered.score(ok)).total == 0.0


def test_rows_of_normalises_cells_and_shapes():
    assert rows_of([["a ", 1], ("b", 2.0000001)]) == [("a", 1.0), ("b", 2.0)]
    assert rows_of(ToolResult(text='[{"x": "3"}]')) == [(3.0,)]
    assert rows_of(ToolResult(text="line one\n\nline two")) == [("line one",), ("line two",)]
    assert rows_of({"rows": [[1]]}) == [(1.0,)]
    assert rows_of("[[1, 2], [1, 2]]") != rows_of("[[1, 2]]")  # duplicates count


def test_python_printed_output():
    reward = VerifyReward(PythonTool(), artifact_arguments("code", code_block("python")), same_output())
    t = make("```python\nfor i in range(3):\n    print(i * i)   \n```", expected_output="0\n1\n4\n")
    assert asyncio.run(reward.score(t)).terms == {"ran": 1.0, "match": 1.0}
    t = make("```python\nprint('0 1 4')\n```", expected_output="0\n1\n4")
    assert asyncio.run(reward.score(t)).terms == {"ran": 1.0, "match": 0.0}
    t = make("```python\nraise SystemExit('boom')\n```", expected_output="")
    assert asyncio.run(reward.score(t)).terms["ran"] == 0.0


def test_a_raising_tool_is_a_failed_run_and_missing_field_is_loud():
    class Raises:
        name, description, parameters = "x", "", {}

        async def call(self, arguments):
            raise RuntimeError("transport down")

    reward = VerifyReward(Raises(), artifact_arguments(), same_rows())
    assert asyncio.run(reward.score(make("<answer>1</answer>", expected_rows=[[1]]))).terms["ran"] == 0.0
    reward = VerifyReward(function_tool(run_sql), artifact_arguments(), same_rows())
    with pytest.raises(KeyError, match="expected_rows"):
        asyncio.run(reward.score(make("<answer>SELECT 1</answer>")))


def test_build_reward_verify_part_from_config():
    cfg = validate(RewardConfig, {
        "terms": {"format": 1.0},
        "verify": {"tool": "run_sql", "artifact": "code:sql", "compare": "rows", "weight": 2.0},
    })
    reward = build_reward(cfg, tools={"run_sql": function_tool(run_sql)})
    t = make("```sql\nSELECT name, population FROM city WHERE country='FR'\n```", expected_rows=EXPECTED)
    s = asyncio.run(reward.score(t))
    assert s.terms == {"rule": 0.0, "rule/format": 0.0, "verify": 1.0, "verify/ran": 1.0, "verify/match": 1.0}
    assert s.total == 2.0
    by_path = validate(RewardConfig, {"verify": {"tool": f"{__name__}:run_sql", "artifact": "code:sql"}})
    assert asyncio.run(build_reward(by_path).score(t)).total == 1.0
