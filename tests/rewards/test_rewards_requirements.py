"""What a reward reads from the rows, checked before the first step (rlfactory/rewards/requirements.py)."""

from __future__ import annotations

from rlfactory.rewards import ComposedReward, JudgeReward, RuleReward
from rlfactory.rewards.judge import DEFAULT_TEMPLATE
from rlfactory.rewards.requirements import check_rows, row_needs


def test_terms_that_compare_against_the_answer_need_one_in_every_row():
    reward = RuleReward({"exact_match": 1.0, "format": 0.1, "f1": 0.5})
    assert row_needs(reward).reads_references == ["exact_match", "f1"]
    good = [{"question": "q", "answer": "a"}, {"question": "q", "answer": ["a", "b"]},
            {"question": "q", "golden_answers": ["x"]}, {"reward_model": {"ground_truth": {"target": ["y"]}}}]
    assert check_rows(reward, good, "env 'w': train row") is None
    bad = [*good, {"id": "q7", "question": "q", "label": "a"}, {"question": "q", "answer": ""}]
    problem = check_rows(reward, bad, "env 'w': train row")
    assert problem.startswith("env 'w': train row 4 (id 'q7') has no reference answer, which exact_match, f1 "
                              "compare(s) against: give it one of the fields ground_truth, answer, answers,")
    assert problem.endswith("the row has: id, label, question (2 of 6 rows)")


def test_rewards_that_read_no_answer_need_nothing():
    assert check_rows(RuleReward({"format": 1.0, "extra_calls": 0.1}), [{"question": "q"}], "row") is None


def test_composed_and_judge_rewards_are_looked_into():
    class NoJudge:
        async def judge(self, prompts):
            return ["yes"] * len(prompts)

    composed = ComposedReward({"rule": (RuleReward({"format": 1.0}), 1.0),
                               "judge": (JudgeReward(NoJudge(), DEFAULT_TEMPLATE), 0.5)})
    assert row_needs(composed).reads_references == ["judge"]  # the default template shows {reference}
    assert "has no reference answer, which judge compare(s)" in check_rows(composed, [{"question": "q"}], "row")
    no_reference = ComposedReward({"judge": (JudgeReward(NoJudge(), "Is {answer} right for {question}?"), 1.0)})
    assert check_rows(no_reference, [{"question": "q"}], "row") is None
