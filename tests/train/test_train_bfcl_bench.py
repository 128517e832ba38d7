"""`rlfactory bench bfcl` end to end on CPU: rlfactory's tiny model steered by ScriptedPolicy to
answer every entry with BFCL's possible answer (all pass) or a wrong one (all fail), in both prompt
styles; scores come from bfcl-eval's own checkers."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("bfcl_eval")

from transformers import AutoTokenizer  # noqa: E402

from rlfactory.cli.main import main  # noqa: E402
from rlfactory.envs.bfcl.data import DEFAULT_CATEGORIES, load_category  # noqa: E402
from rlfactory.envs.bfcl.env import prompting_text  # noqa: E402
from rlfactory.envs.bfcl.score import answer_calls  # noqa: E402
from rlfactory.rollout.scripted import ScriptedPolicy, TurnPlan  # noqa: E402
from rlfactory.tiny import resolve_model  # noqa: E402
from rlfactory.train.bfcl_bench import bfcl_config, run_bfcl  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
PER_CATEGORY = 2
CATEGORIES = list(DEFAULT_CATEGORIES)


def reply(row: dict, right: bool, style: str) -> str:
    """The model's turn: BFCL's possible answer, or a wrong one (a made-up function where a call is
    due; a real call of the row's first function where none is)."""
    if row["ground_truth"]:
        calls = answer_calls(row["ground_truth"]) if right else [{"no_such_function": {"x": 1}}]
    else:
        calls = [] if right else [{row["functions"][0]["name"]: {}}]
    if style == "bfcl":
        return prompting_text(calls) if calls else "None of these functions fits the question."
    if not calls:
        return "None of these functions fits the question."
    return "".join(f'<tool_call>\n{json.dumps({"name": n, "arguments": a})}\n</tool_call>'
                   for c in calls for n, a in c.items())


def scripted(rows: list[dict], right: bool, style: str) -> ScriptedPolicy:
    tok = AutoTokenizer.from_pretrained(resolve_model("tiny:1m"))
    replies = {r["question"]: reply(r, right, style) for r in rows}

    def plan(context: str) -> TurnPlan:
        question = max((q for q in replies if q in context), key=len)
        return TurnPlan(free=0, forced=replies[question])

    return ScriptedPolicy(tok, plan, tok.convert_tokens_to_ids("<|im_end|>"))


@pytest.mark.parametrize("style", ["tools", "bfcl"])
def test_possible_answers_all_pass_and_wrong_ones_all_fail(style):
    rows = [r for c in CATEGORIES for r in load_category(c, style, PER_CATEGORY)]
    cfg = bfcl_config("tiny:1m", "qwen3", style, ["rollout.max_new_tokens=400"])
    for right in (True, False):
        policy = scripted(rows, right, style)
        report = asyncio.run(run_bfcl(cfg, CATEGORIES, limit=PER_CATEGORY, logits_processor=policy))
        assert len(report.entries) == len(rows) == PER_CATEGORY * len(CATEGORIES)
        wrong = [(e.id, e.error, e.output) for e in report.entries if e.valid != right]
        assert not wrong, wrong
        assert all(e.status == "ok" for e in report.entries), [(e.id, e.status) for e in report.entries]
        for c in CATEGORIES:
            assert report.categories[c] == {"accuracy": float(right), "correct": PER_CATEGORY * float(right),
                                            "total": float(PER_CATEGORY)}
        assert set(report.summary) == {"non_live_ast", "live_ast", "irrelevance", "live_irrelevance"}
        assert all(v == float(right) for v in report.summary.values())
        by_id = {e.id: e for e in report.entries}
        for row in rows:  # every call the model made is in the entry's record, as BFCL decoded it
            entry = by_id[row["id"]]
            if right and row["ground_truth"]:
                assert entry.calls == answer_calls(row["ground_truth"])
            assert entry.prompt_style == style and entry.prompt_tokens > 0
        assert report.family == "qwen3"


def test_bench_bfcl_command_writes_entries_and_summary(tmp_path, capsys):
    out = tmp_path / "bfcl.jsonl"
    code = main(["bench", "bfcl", "--model", "tiny:1m", "--categories", "simple,live_irrelevance", "--limit", "1",
                 "--out", str(out), "rollout.max_new_tokens=8"])
    assert code == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["id"] for x in lines] == ["simple_python_0", "live_irrelevance_0-0-0"]
    assert {"calls", "output", "valid", "error", "error_type", "prompt_style"} <= set(lines[0])
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert set(summary["categories"]) == {"simple_python", "live_irrelevance"}
    printed = capsys.readouterr().out
    assert "simple_python" in printed and "summary non_live_ast" in printed


def test_bench_bfcl_unknown_category_is_one_line(capsys):
    assert main(["bench", "bfcl", "--model", "tiny:1m", "--categories", "simple,multi_turn_nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown category 'multi_turn_nope'" in err[0] and "multi_turn_base" in err[0]
    assert main(["bench", "bfcl", "--model", "tiny:1m", "--categories", "multi_turn", "--prompt-style", "bfcl"]) == 2
    assert "multi-turn categories run with --prompt-style tools only" in capsys.readouterr().err


def test_bench_bfcl_multi_turn_entry_is_scored_by_bfcls_checkers(tmp_path, capsys):
    # One entry (its prompt is ~9k tokens of the tiny tokenizer): the tiny model answers every user
    # turn at once, without the calls it needs; BFCL's checker fails it. The ground truth passing
    # through the same env and engine is tests/envs/test_envs_bfcl_multi_turn_env.py's.
    from rlfactory.envs.bfcl.multi_turn import load_multi_turn

    row = load_multi_turn("multi_turn_base", 1)[0]
    tok = AutoTokenizer.from_pretrained(resolve_model("tiny:1m"))
    asked: list[str] = []

    def plan(context: str) -> TurnPlan:
        asked.append(context.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>")[0])
        return TurnPlan(free=0, forced="Done.")

    cfg = bfcl_config("tiny:1m", "qwen3", "tools")
    report = asyncio.run(run_bfcl(cfg, ["multi_turn_base"], limit=1,
                                  logits_processor=ScriptedPolicy(tok, plan, tok.convert_tokens_to_ids("<|im_end|>"))))
    assert asked == [turn[0]["content"] for turn in row["turns"]]  # each user turn, in order
    (entry,) = report.entries
    assert entry.id == row["id"] and entry.status == "ok" and not entry.valid
    assert entry.error_type.startswith("multi_turn:") and entry.turns == [[] for _ in row["turns"]]
    assert report.categories["multi_turn_base"] == {"accuracy": 0.0, "correct": 0.0, "total": 1.0}
    assert report.summary == {"multi_turn": 0.0}
