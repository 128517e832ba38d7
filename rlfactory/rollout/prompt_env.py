"""PromptEnv: the plainest env, for rollouts of any dataset of prompts with the `tools:` section's
tools. Use it as `env.name: rlfactory.rollout.prompt_env:PromptEnv`.

A row opens with its `messages` (or Search-R1's `prompt`, a list of messages), or else one user
message from its `question` (or `prompt` string), after an optional system prompt. Data files:
JSON lines, a JSON list, or parquet, given as `env.train_data` / `env.test_data`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from rlfactory.envs.base import Env
from rlfactory.text import valid_strings, valid_text

log = logging.getLogger("rlfactory.rollout")


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a .jsonl, .json (a list) or .parquet file.

    Text that is not valid Unicode (bytes that are not UTF-8, `"\\ud800"` escapes of half a
    character) is read as U+FFFD, with one warning that counts it: a tokenizer would refuse it
    later. A line that is not JSON is an error naming the file and the line."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"dataset not found: {p}")
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(p).to_pylist()
    raw = p.read_bytes()
    text, replaced = valid_text(raw)
    if p.suffix == ".json":
        rows = _loads(text, f"{p}")
        if not isinstance(rows, list):
            raise ValueError(f"{p}: expected a JSON list of rows")
    else:
        rows = [_loads(line, f"{p}:{i}") for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    rows, lone = valid_strings(rows)
    if replaced or lone:
        log.warning("%s: %d character(s) that are not valid text (%d bytes that are not UTF-8, %d lone surrogates) "
                    "read as U+FFFD", p, replaced + lone, replaced, lone)
    return rows


def _loads(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:  # RecursionError: nested past Python's stack
        raise ValueError(f"{where}: not valid JSON: {e}") from None


class PromptEnv(Env):
    name = "prompt"

    def __init__(
        self,
        train_data: str | None = None,
        test_data: str | None = None,
        system: str | None = None,
        max_turns: int = 4,
        family: str | None = None,
    ) -> None:
        self.family = family  # unused: every family gets the same messages
        self.data = {"train": train_data, "test": test_data}
        self.system = system
        self.max_turns = max_turns

    def reset(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        messages = row.get("messages")
        if messages is None and isinstance(row.get("prompt"), list):
            messages = row["prompt"]
        if messages is None:
            text = row.get("question", row.get("prompt"))
            if not isinstance(text, str):
                raise ValueError(f"row has no `messages`, `prompt` or `question`: {sorted(row)}")
            messages = [{"role": "user", "content": text}]
        messages = [dict(m) for m in messages]
        if self.system and not (messages and messages[0].get("role") == "system"):
            messages.insert(0, {"role": "system", "content": self.system})
        return messages

    def load_split(self, split: str) -> list[dict[str, Any]]:
        path = self.data.get(split)
        if not path:
            raise ValueError(f"PromptEnv has no {split!r} data: set env.{split}_data")
        return read_rows(path)
