"""PromptEnv turns rows of any common layout into opening messages and reads .jsonl/.json/.parquet."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlfactory.envs.registry import make_env
from rlfactory.rollout.prompt_env import PromptEnv, read_rows
from rlfactory.rollout.summary import format_summary, summarize
from rlfactory.trajectory import Segment, ToolCallRecord, Trajectory


def test_reset_accepts_messages_searchr1_prompt_and_question():
    env = PromptEnv(system="be brief")
    msgs = [{"role": "user", "content": "hi"}]
    assert env.reset({"messages": msgs}) == [{"role": "system", "content": "be brief"}, *msgs]
    assert env.reset({"prompt": msgs})[1] == msgs[0]
    assert env.reset({"question": "2+2?"})[-1] == {"role": "user", "content": "2+2?"}
    own_system = [{"role": "system", "content": "mine"}, *msgs]
    assert env.reset({"messages": own_system}) == own_system
    with pytest.raises(ValueError, match="question"):
        env.reset({"text": "nothing usable"})


def test_reads_jsonl_json_and_parquet_splits(tmp_path):
    rows = [{"question": "a", "answer": "1"}, {"question": "b", "answer": "2"}]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "r.json").write_text(json.dumps(rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "r.parquet")
    for name in ("r.jsonl", "r.json", "r.parquet"):
        assert read_rows(tmp_path / name) == rows
    env = make_env("rlfactory.rollout.prompt_env:PromptEnv", test_data=str(tmp_path / "r.jsonl"), max_turns=2)
    assert env.load_split("test") == rows and env.max_turns == 2
    with pytest.raises(ValueError, match="train_data"):
        env.load_split("train")


def test_summary_counts():
    t = Trajectory("a", "g", [Segment("prompt", [1, 2]), Segment("model", [3, 4, 5], "", [0.0] * 3, 0)],
                   [ToolCallRecord("f", {}, "ok", 0.5), ToolCallRecord("f", {}, "timeout", 2.0)], turns=2,
                   metrics={"tool_s": 2.5})
    s = summarize([t, Trajectory("b", "g", status="truncated", turns=1)], wall_s=2.0)
    assert s["status"] == {"ok": 1, "truncated": 1} and s["tool_calls"] == 2 and s["gen_tokens"] == 3
    assert s["gen_tokens_per_s"] == 1.5 and s["tool_time_total_s"] == 2.5 and s["turns"] == {1: 1, 2: 1}
    assert "timeout=1" in format_summary(s)


def test_rows_with_text_that_is_not_unicode_are_read_with_replacement_characters(tmp_path, caplog):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"question": "caf\xc3\xa9 \xff ok"}\n'  # a byte that is not UTF-8
                     b'{"question": "half \\ud83d emoji", "tags": ["\\udc80"], "nul": "a\\u0000b"}\n'  # lone surrogates
                     b'{"question": "fine \\ud83d\\ude00"}\n')  # a pair: one character
    with caplog.at_level("WARNING", logger="rlfactory.rollout"):
        rows = read_rows(path)
    assert rows == [{"question": "caf\u00e9 \ufffd ok"}, {"question": "half \ufffd emoji", "tags": ["\ufffd"], "nul": "a\x00b"},
                    {"question": "fine \U0001F600"}]
    (record,) = caplog.records
    assert record.getMessage() == (f"{path}: 3 character(s) that are not valid text (1 bytes that are not UTF-8, "
                                   "2 lone surrogates) read as U+FFFD")
    path.write_text('{"question": "a"}\n{"question": oops}\n')
    with pytest.raises(ValueError, match=r"r.jsonl:2: not valid JSON: Expecting value"):
        read_rows(path)
    path.write_text('{"question": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(ValueError, match=r"r.jsonl:1: not valid JSON: maximum recursion depth"):
        read_rows(path)
