"""The SQL env: questions over a generated SQLite shop database (rlfactory.envs.sql_data); the
model explores with a read-only `sql` tool and answers with one query in `<answer>...</answer>`.

Reward (tool-verified): the final query is run through the same `sql` tool and its rows are
compared, as a multiset, with the reference query's rows (`same_rows`), weight 0.9; plus the
format term, weight 0.1.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, Callable

from rlfactory.envs.base import Env, EnvTools
from rlfactory.envs.data import question_of, read_parquet, targets
from rlfactory.envs.registry import register_env
from rlfactory.envs.sql_data import describe_schema, make_shop_db, question_rows, run_query
from rlfactory.rewards.base import Reward
from rlfactory.rewards.compose import ComposedReward
from rlfactory.rewards.rule import RuleReward
from rlfactory.rewards.verify import VerifyReward, artifact_arguments, same_rows
from rlfactory.tools.base import ToolResult
from rlfactory.tools.function import function_tool

SYSTEM_PROMPT = (
    "Answer the question with one SQL query over this SQLite database. Use the sql tool to run queries. "
    "Give the final query as <answer>SELECT ...</answer>.\nTables:\n{schema}"
)


# What a query may do (sqlite3 authorizer actions): read, call functions, read-only pragmas.
_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
_READ_PRAGMAS = {"table_info", "table_xinfo", "table_list", "index_list", "index_info", "foreign_key_list"}


def _authorize(action: int, arg1: str | None, arg2: str | None, db: str | None, trigger: str | None) -> int:
    if action in _ALLOWED:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA and arg1 in _READ_PRAGMAS:
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY  # writes, ATTACH, other pragmas


def sql_tool(db_path: str | Path, max_rows: int = 20, timeout_s: float = 5.0, max_result_rows: int = 10000
             ) -> Callable[..., ToolResult]:
    """The `sql` tool over `db_path` as a typed function: a read-only connection per call
    (`mode=ro`, `PRAGMA query_only` and an authorizer that denies all but reads, so no
    ATTACH either), one statement, aborted after `timeout_s`. The text shows
    the first `max_rows` rows; `data` holds {"columns", "rows"} (up to `max_result_rows`)."""
    uri = f"file:{Path(db_path).resolve()}?mode=ro"

    def sql(query: str) -> ToolResult:
        """Run one read-only SQL query on the database and return the rows.

        Args:
            query: One SQLite statement, e.g. SELECT name FROM people.
        """
        con = sqlite3.connect(uri, uri=True, check_same_thread=False)
        deadline = time.monotonic() + timeout_s
        con.set_progress_handler(lambda: int(time.monotonic() > deadline), 10000)
        try:
            con.execute("PRAGMA query_only = ON")
            con.set_authorizer(_authorize)
            cur = con.execute(query)
            columns = [d[0] for d in cur.description or []]
            rows = [list(r) for r in cur.fetchmany(max_result_rows + 1)]
        except sqlite3.Error as e:
            msg = "query took too long (interrupted)" if time.monotonic() > deadline else str(e)
            return ToolResult.error(f"error: {msg}")
        finally:
            con.close()
        more = len(rows) > max_result_rows
        rows = rows[:max_result_rows]
        lines = [" | ".join(columns)] if columns else []
        lines += [" | ".join("NULL" if v is None else str(v) for v in r) for r in rows[:max_rows]]
        if not rows:
            lines.append("(no rows)")
        elif len(rows) > max_rows or more:
            lines.append(f"({'more than ' if more else ''}{len(rows)} rows, first {max_rows} shown)")
        return ToolResult(text="\n".join(lines), data={"columns": columns, "rows": rows},
                          truncated=len(rows) > max_rows or more)

    return sql


@register_env("sql")
class SqlEnv(Env):
    """Options: `seed` (0), `n_train_people` (40), `n_test_people` (10), `db_path` (use this SQLite
    file instead of generating one; then give `train_data` / `test_data`), `train_data` /
    `test_data` (parquet: question, reference SQL in reward_model.ground_truth.target, optional
    `expected_rows` JSON), `max_rows` (20), `timeout_s` (5), `max_turns` (3), `system_prompt`
    (may hold `{schema}`), `family` (unused)."""

    name = "sql"

    def __init__(self, *, seed: int = 0, n_train_people: int = 40, n_test_people: int = 10,
                 db_path: str | None = None, train_data: str | None = None, test_data: str | None = None,
                 max_rows: int = 20, timeout_s: float = 5.0, max_turns: int = 3, system_prompt: str | None = None,
                 family: str | None = None, **options: Any) -> None:
        if options:
            raise TypeError(f"sql env: unknown option(s) {', '.join(sorted(options))}")
        self.data = {"train": train_data, "test": test_data}
        self.max_rows, self.timeout_s, self.max_turns, self.family = max_rows, timeout_s, max_turns, family
        self._tmp: str | None = None
        self._rows: dict[str, list[dict[str, Any]]] = {}
        if db_path:
            self.db_path = Path(db_path)
            if not self.db_path.is_file():
                raise FileNotFoundError(f"sql env: database not found: {db_path}")
        else:
            self._tmp = tempfile.mkdtemp(prefix="rlfactory-sql-")
            weakref.finalize(self, shutil.rmtree, self._tmp, True)
            db = make_shop_db(Path(self._tmp) / "shop.sqlite", seed, n_train_people, n_test_people)
            self.db_path = db.path
            self._rows = {s: question_rows(db, s) for s in ("train", "test")}
        self.schema = describe_schema(self.db_path)
        self.system_prompt = (system_prompt or SYSTEM_PROMPT).replace("{schema}", self.schema)
        self._tool = sql_tool(self.db_path, max_rows, timeout_s)

    def load_split(self, split: str) -> list[dict[str, Any]]:
        if self.data.get(split):
            return read_parquet(self.data[split])
        if split not in self._rows:
            raise ValueError(f"sql env: no {split!r} split (give env.{split}_data or use the generated db)")
        return self._rows[split]

    def reset(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": question_of(row)}]

    def tools(self) -> EnvTools:
        return EnvTools(python=[self._tool])

    def expected_rows(self, info: dict[str, Any]) -> list[list[Any]]:
        """The reference rows of a row: its `expected_rows` JSON, else the reference query's rows."""
        if info.get("expected_rows"):
            return json.loads(info["expected_rows"])
        refs = targets(info)
        if not refs:
            raise KeyError("sql env: the row has neither expected_rows nor a reference query")
        return run_query(self.db_path, refs[0])

    def reward(self) -> Reward:
        verify = VerifyReward(function_tool(self._tool), artifact_arguments("query"),
                              same_rows(lambda t: self.expected_rows(t.info)))
        return ComposedReward({"verify": (verify, 0.9), "format": (RuleReward({"format": 1.0}), 0.1)})

    def solve(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """Run the reference query through the tool, then answer with it."""
        refs = targets(row)
        if not refs:
            raise ValueError("sql env solver: the row has no reference query")
        query = refs[0]
        result = self._tool(query)
        if result.is_error:
            raise RuntimeError(f"sql env solver: the reference query failed: {result.text}")
        return self.reset(row) + [
            {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function", "function": {"name": "sql", "arguments": {"query": query}}}]},
            {"role": "tool", "name": "sql", "content": result.text},
            {"role": "assistant", "content": f"<answer>{query}</answer>"},
        ]

    def close(self) -> None:
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
