"""What the Runs page keeps about a run beside its logs: tags and notes, deletion, config diffs.

Tags and notes live in `<run>/studio_notes.json` (written atomically), never in metrics.jsonl or
config.yaml: the training process never reads or writes that file, and removing it loses nothing
the run logged. Deleting a run removes its folder, and is refused while the run is running.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlfactory.studio.runs import read_config

NOTES_FILE = "studio_notes.json"
MAX_TAGS = 20
MAX_TAG_CHARS = 40
MAX_NOTES_CHARS = 20000


class MetaError(ValueError):
    """Bad tags, notes or a refused deletion; the message is one line that names the cause."""


@dataclass
class RunNotes:
    tags: list[str] = field(default_factory=list)
    notes: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def read_notes(run: Path) -> RunNotes:
    """The run's tags and notes (empty when it has none, or when the file cannot be read)."""
    try:
        data = json.loads((run / NOTES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return RunNotes()
    if not isinstance(data, dict):
        return RunNotes()
    tags = [t for t in data.get("tags") or [] if isinstance(t, str)]
    notes = data.get("notes") if isinstance(data.get("notes"), str) else ""
    return RunNotes(tags, notes)


def _unicode(text: str, what: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from the request's JSON: it could not be stored or sent
        raise MetaError(f"{what}: not valid Unicode (a lone surrogate)") from None
    return text


def clean_tags(raw: Any) -> list[str]:
    """Tags from a request: a list of strings (or one comma-separated string), trimmed, without
    repeats, each 1 to MAX_TAG_CHARS characters without control characters or commas."""
    if isinstance(raw, str):
        raw = raw.split(",")
    if not isinstance(raw, list) or not all(isinstance(t, str) for t in raw):
        raise MetaError("tags: a list of strings, or one string of comma-separated tags")
    out: list[str] = []
    for t in (_unicode(t, "tags").strip() for t in raw):
        if not t or t in out:
            continue
        if len(t) > MAX_TAG_CHARS or any(ord(c) < 32 or c == "," for c in t):
            raise MetaError(f"tag {t[:50]!r}: at most {MAX_TAG_CHARS} characters, no commas or control characters")
        out.append(t)
    if len(out) > MAX_TAGS:
        raise MetaError(f"{len(out)} tags: at most {MAX_TAGS}")
    return out


def write_notes(run: Path, tags: Any, notes: Any) -> RunNotes:
    """Replace the run's tags and notes (validated first: nothing is written on bad input)."""
    notes = "" if notes is None else notes
    if not isinstance(notes, str):
        raise MetaError("notes: a string")
    clean = RunNotes(clean_tags(tags if tags is not None else []), _unicode(notes, "notes"))
    if len(clean.notes) > MAX_NOTES_CHARS:
        raise MetaError(f"notes: {len(clean.notes)} characters, at most {MAX_NOTES_CHARS}")
    tmp = run / f".{NOTES_FILE}.tmp"
    tmp.write_text(json.dumps(clean.to_json(), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, run / NOTES_FILE)
    return clean


def delete_run(root: Path, run: Path, status: str, reason: str) -> None:
    """Remove the run folder `run` (inside `root`); refused for a running run and for `root`."""
    root = root.resolve()
    if run.resolve() == root:
        raise MetaError("the runs folder itself is not a run: nothing deleted")
    if status == "running":
        raise MetaError(f"{run.relative_to(root).as_posix()} is running ({reason}): stop it first; nothing deleted")
    shutil.rmtree(run)


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys to leaf values: {"a": {"b": 1}} -> {"a.b": 1}; lists are leaves."""
    if isinstance(config, dict) and config:
        out: dict[str, Any] = {}
        for k, v in config.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: config} if prefix else {}


@dataclass
class ConfigDiff:
    runs: list[str]
    differ: list[dict[str, Any]]  # {"key", "values": one per run, None where a run lacks the key}
    same: int  # keys every run sets to one value

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def config_diff(runs: dict[str, Path]) -> ConfigDiff:
    """The config keys whose values differ between the runs (`id -> folder`), in key order."""
    flat = {rid: flatten(read_config(p)) for rid, p in runs.items()}
    keys = sorted(set().union(*flat.values())) if flat else []
    differ, same = [], 0
    for key in keys:
        values = [flat[rid].get(key) for rid in runs]
        if all(json.dumps(v, sort_keys=True) == json.dumps(values[0], sort_keys=True) for v in values) \
                and all(key in flat[rid] for rid in runs):
            same += 1
        else:
            differ.append({"key": key, "values": values})
    return ConfigDiff(list(runs), differ, same)
