"""metrics.py: a long metrics.jsonl opens from an even sample; live updates read only what was
appended; the last record is read from the end."""

from __future__ import annotations

import json

from rlfactory.studio.metrics import JsonlTail, last_record, overview, window


def _write(path, steps, extra=""):
    with open(path, "a") as f:
        for s in steps:
            f.write(json.dumps({"step": s, "reward/mean": s / 10, "accuracy": 0.5}) + "\n")
        f.write(extra)


def test_a_short_file_is_read_whole_and_a_torn_last_line_waits(tmp_path):
    p = tmp_path / "metrics.jsonl"
    _write(p, range(1, 6), extra='{"step": 6, "rew')
    s = overview(p)
    assert s.steps == [1, 2, 3, 4, 5] and not s.sampled
    assert s.values["reward/mean"] == [0.1, 0.2, 0.3, 0.4, 0.5]
    assert s.end_offset == p.read_bytes().rfind(b"\n") + 1
    assert last_record(p)["step"] == 5


def test_a_long_file_is_an_even_sample_with_its_first_and_last_steps(tmp_path):
    p = tmp_path / "metrics.jsonl"
    _write(p, range(1, 20001))
    s = overview(p, points=500)
    assert s.sampled and 400 <= len(s.steps) <= 502
    assert s.steps[0] == 1 and s.steps[-1] == 20000 and s.steps == sorted(s.steps)
    gaps = [b - a for a, b in zip(s.steps, s.steps[1:])]
    assert max(gaps) < 3 * (20000 / 500)
    w = window(p, 1000, 1100, points=500)
    assert w.steps == list(range(1000, 1101)) and not w.sampled


def test_the_tail_reads_only_what_was_appended_and_notices_a_rewrite(tmp_path):
    p = tmp_path / "metrics.jsonl"
    _write(p, range(1, 1001))
    size = p.stat().st_size
    tail = JsonlTail(p, offset=size)
    assert tail.read_new() == ([], False) and tail.bytes_read == 0
    before = p.stat().st_size
    _write(p, [1001, 1002], extra='{"step": 1003')
    records, reset = tail.read_new()
    assert [r["step"] for r in records] == [1001, 1002] and not reset
    assert tail.bytes_read == p.stat().st_size - before  # the appended bytes, nothing else
    with open(p, "a") as f:
        f.write(', "reward/mean": 1.0}\n')
    assert [r["step"] for r in tail.read_new()[0]] == [1003]
    p.write_text(json.dumps({"step": 1}) + "\n")  # a resumed run rewrites its log
    records, reset = tail.read_new()
    assert reset
