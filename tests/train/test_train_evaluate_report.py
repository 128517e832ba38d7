"""`rlfactory eval`'s report: `answer` is the answer as the reward extracts it, `output` the raw text."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from rlfactory.cli.main import main
from rlfactory.rewards import RuleReward
from rlfactory.rewards.compose import ComposedReward
from rlfactory.trajectory import Segment, Trajectory
from rlfactory.train.evaluate import answer_extractor_of, evaluate

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class _Replay:
    """Stands in for the rollout engine (the real one runs in the test below): replays fixed texts."""

    sampling = None

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    async def run(self, rows, n, policy_version=0):
        return [Trajectory(id=f"q{i}", group=f"q{i}", info=dict(row), turns=1,
                           segments=[Segment("prompt", [1], "Q"), Segment("model", [2, 3], text)])
                for i, (row, text) in enumerate(zip(rows, self.texts))]


def test_the_answer_field_holds_the_extracted_answer_and_output_the_text():
    rows = [{"id": "a", "question": "Capital of Peru?", "answer": "Lima"}, {"id": "b", "question": "?", "answer": "x"}]
    texts = ["Let me think. The tool said Lima.\n<answer>Lima</answer>", "I do not know"]
    report = asyncio.run(evaluate(_Replay(texts), RuleReward({"exact_match": 1.0}), rows))
    first, second = report["questions"]
    assert first["answer"] == "Lima" and first["output"] == texts[0] and first["accuracy"] == 1.0
    assert second["answer"] is None and second["output"] == texts[1]


def test_the_extractor_is_the_rewards_own_also_inside_a_composed_reward():
    def last_word(t):
        return t.model_text().split()[-1]

    rule = RuleReward({"exact_match": 1.0}, answer_extractor=last_word)
    assert answer_extractor_of(rule) is last_word
    assert answer_extractor_of(ComposedReward({"rule": (rule, 1.0)})) is last_word
    assert answer_extractor_of(object())(Trajectory(id="t", group="g", segments=[
        Segment("model", [1], "so <answer>Oslo</answer>")])) == "Oslo"


def test_eval_writes_both_fields(tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert main(["eval", str(EXAMPLES / "custom_env" / "capitals.yaml"), "--model", "tiny:1m", "--limit", "2",
                 "--out", str(out), "rollout.max_new_tokens=8"]) == 0
    questions = json.loads(out.read_text())["questions"]
    assert len(questions) == 2
    for q in questions:
        assert isinstance(q["output"], str) and q["output"]
        assert q["answer"] is None or q["answer"] in q["output"]
