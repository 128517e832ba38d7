"""Keeping what is reported out of what is trained on.

BFCL's live and non-live categories share a few function names (18 of them, e.g. `send_email`,
`get_current_weather`) and questions (6, e.g. "What is the gold price today in USA?"). Training on
those would leak the report set, so the train split drops every entry that shows a function name
or asks a question (case and surrounding space ignored) of the report split, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Overlap:
    function_names: set[str] = field(default_factory=set)
    questions: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.function_names or self.questions)


def _names(rows: list[dict[str, Any]]) -> set[str]:
    return {f["name"] for r in rows for f in r["functions"]}


def _question(row: dict[str, Any]) -> str:
    return " ".join(str(row["question"]).split()).lower()


def overlap(train: list[dict[str, Any]], report: list[dict[str, Any]]) -> Overlap:
    """The function names and questions of `report` that `train` also has."""
    return Overlap(_names(train) & _names(report), {_question(r) for r in train} & {_question(r) for r in report})


def without_report(train: list[dict[str, Any]], report: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """`train` minus every entry sharing a function name or a question with `report`, and one line
    saying what was dropped and that what is left shares nothing (checked again after dropping)."""
    names, questions = _names(report), {_question(r) for r in report}
    kept = [r for r in train if not ({f["name"] for f in r["functions"]} & names) and _question(r) not in questions]
    left = overlap(kept, report)
    if left:  # cannot happen by construction; a loud failure if the rule above is ever loosened
        raise AssertionError(f"bfcl split: the train split still shares {left} with the report split")
    line = (f"bfcl split: {len(kept)} of {len(train)} train entries kept; {len(train) - len(kept)} dropped for "
            f"sharing a function name or a question with the {len(report)} report entries; the rest share none")
    return kept, line
