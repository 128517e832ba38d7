"""The Data page: preview a dataset, and convert questions and answers into Search-R1's layout.

Preview reads parquet or JSON lines (a .json list too). Search-R1's layout (data_source, prompt,
ability, reward_model, extra_info) is recognised and shown column by column. Conversion reads a
JSON-lines or CSV file of questions and answers and writes parquet rows made by
rlfactory.envs.data.qa_row, with a prompt template holding `{question}`.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

SEARCHR1_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")
PREVIEW_ROWS = 50


class DataError(ValueError):
    """A dataset problem, with the field or column named."""


def read_table(path: Path, limit: int | None = None) -> tuple[list[dict[str, Any]], int, list[tuple[str, str]]]:
    """(rows, total rows, [(column, type)]) of a parquet / JSON lines / JSON list / CSV file."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        total = pf.metadata.num_rows
        schema = [(f.name, str(f.type)) for f in pf.schema_arrow]
        rows: list[dict[str, Any]] = []
        for batch in pf.iter_batches(batch_size=min(limit or 1024, 1024)):
            rows.extend(batch.to_pylist())
            if limit is not None and len(rows) >= limit:
                break
        return rows[:limit] if limit else rows, total, schema
    text = path.read_text(encoding="utf-8")
    if suffix == ".csv":
        rows = list(csv.DictReader(io.StringIO(text)))
    elif suffix == ".json":
        data = json.loads(text)
        if not isinstance(data, list):
            raise DataError(f"{path.name}: a .json dataset must be a list of rows")
        rows = data
    else:
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as e:
                raise DataError(f"{path.name} line {n}: not valid JSON ({e})") from None
    if any(not isinstance(r, dict) for r in rows):
        raise DataError(f"{path.name}: every row must be an object")
    columns: dict[str, str] = {}
    for r in rows[:1000]:
        for k, v in r.items():
            columns.setdefault(k, type(v).__name__)
    return (rows[:limit] if limit else rows), len(rows), list(columns.items())


def preview(path: Path) -> dict[str, Any]:
    rows, total, columns = read_table(path, PREVIEW_ROWS)
    names = [c for c, _ in columns]
    return {"file": path.name, "format": path.suffix.lstrip(".").lower() or "jsonl", "rows": _jsonable(rows),
            "total_rows": total, "columns": [{"name": c, "type": t} for c, t in columns],
            "searchr1": all(c in names for c in SEARCHR1_COLUMNS)}


def convert(src: Path, out: Path, question_column: str, answer_column: str, template: str, data_source: str,
            split: str, ability: str = "fact-reasoning") -> dict[str, Any]:
    """Write `src`'s rows as Search-R1 parquet at `out`; returns the preview of what was written."""
    from rlfactory.envs.data import qa_row, write_parquet

    if "{question}" not in template:
        raise DataError("template: must contain {question}")
    if src.suffix.lower() not in (".jsonl", ".csv", ".json"):
        raise DataError(f"{src.name}: convert reads .jsonl, .json or .csv files")
    rows, _, columns = read_table(src)
    names = [c for c, _ in columns]
    for what, col in (("question column", question_column), ("answer column", answer_column)):
        if col not in names:
            raise DataError(f"{what}: {col!r} is not a column of {src.name} ({', '.join(names)})")
    out_rows = []
    for i, r in enumerate(rows):
        q = r.get(question_column)
        if not isinstance(q, str) or not q.strip():
            raise DataError(f"row {i + 1}: {question_column!r} is empty")
        try:
            prompt = template.format(question=q.strip())
        except (KeyError, IndexError, ValueError) as e:
            raise DataError(f"template: {e!r} (write literal braces as {{{{ and }}}})") from None
        out_rows.append(qa_row(data_source=data_source, split=split, index=i, question=q.strip(),
                               answers=_answers(r.get(answer_column)), prompt_text=prompt, ability=ability))
    if not out_rows:
        raise DataError(f"{src.name}: no rows")
    write_parquet(out_rows, out)
    return preview(out)


def _answers(value: Any) -> list[str]:
    """A JSON list in a cell, a list, or one answer."""
    if isinstance(value, list):
        return [str(v) for v in value]
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            parsed = json.loads(value)
            if isinstance(parsed, list):
                return [str(v) for v in parsed]
        except ValueError:
            pass
    return [] if value is None else [str(value)]


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if hasattr(x, "tolist"):
        return _jsonable(x.tolist())
    return str(x)
