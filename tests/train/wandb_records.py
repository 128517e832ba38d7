"""Read the records of a W&B offline run file (run-<id>.wandb): W&B's LevelDB-style log of
`wandb_internal_pb2.Record` protobufs (a 7-byte file header, then 32 KiB blocks of chunks with a
7-byte header each: crc32, length, type full/first/middle/last)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str | Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1, (ident, magic, version)
    out, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def history(path: str | Path) -> list[dict[str, Any]]:
    """Each history record as {key: value} (values JSON-decoded), with its `_step`."""
    rows = []
    for r in records(path):
        if r.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            if r.history.HasField("step"):
                row.setdefault("_step", r.history.step.num)
            rows.append(row)
    return rows


def run(path: str | Path) -> tuple[str, dict[str, Any]]:
    """(run id, config) from the run record."""
    for r in records(path):
        if r.WhichOneof("record_type") == "run":
            return r.run.run_id, {item.key: json.loads(item.value_json) for item in r.run.config.update}
    raise AssertionError(f"{path}: no run record")
