"""Rule rewards: built-in terms, weights, options, user terms, infra_error handling."""

import asyncio

import pytest

from rlfactory.rewards import (
    FunctionReward,
    RewardScore,
    RuleReward,
    UnscorableTrajectory,
    get_term,
    is_scorable,
    list_terms,
    reward_term,
    score_all,
)
from rlfactory.trajectory import Segment, ToolCallRecord, Trajectory


def make(text, info=None, calls=(), status="ok", turns=1):
    segs = [Segment("prompt", [1], "Q?"), Segment("model", [3], text, logprobs=[0.0])]
    records = [ToolCallRecord(name="search", arguments={"q": "x"}, status=s, latency_s=0.01) for s in calls]
    return Trajectory(id="t", group="g", segments=segs, tool_calls=records, turns=turns, status=status, info=info or {})


def run(coro):
    return asyncio.run(coro)


def test_weighted_sum_with_raw_terms():
    reward = RuleReward({"exact_match": 1.0, "format": 0.2, "f1": 0.5})
    s = run(reward.score(make("<answer>The Paris</answer>", {"answer": ["paris", "Paris, France"]})))
    assert s.terms == {"exact_match": 1.0, "format": 1.0, "f1": 1.0}
    assert s.total == pytest.approx(1.7)
    s = run(reward.score(make("<answer>Paris France area</answer>", {"answer": "Paris, France"})))
    # f1: pred [paris, france, area] vs gold [paris, france]: p 2/3 r 1 -> 0.8
    assert s.terms == {"exact_match": 0.0, "format": 1.0, "f1": pytest.approx(0.8)}
    assert s.total == pytest.approx(0.2 + 0.4)


def test_format_needs_an_answer_and_no_malformed_call():
    reward = RuleReward({"format": 1.0})
    assert run(reward.score(make("Paris"))).total == 0.0
    assert run(reward.score(make("<answer>Paris</answer>"))).total == 1.0
    assert run(reward.score(make("<answer>Paris</answer>", calls=["ok", "malformed"]))).total == 0.0
    assert run(reward.score(make("<answer>Paris</answer>", status="malformed"))).total == 0.0
    assert run(reward.score(make("<answer>Paris</answer>", calls=["ok", "timeout"]))).total == 1.0


def test_numeric_and_efficiency_terms_with_options():
    reward = RuleReward(
        {"numeric": 1.0, "extra_calls": 0.1, "extra_turns": 0.05, "tool_errors": 0.2},
        options={"extra_calls": {"budget": 2}, "extra_turns": {"budget": 2}, "numeric": {"rel_tol": 0.01}},
    )
    t = make("<answer>$1,234.00</answer>", {"answer": "1234"}, calls=["ok", "error", "ok", "timeout", "ok"], turns=4)
    s = run(reward.score(t))
    assert s.terms == {"numeric": 1.0, "extra_calls": -3.0, "extra_turns": -2.0, "tool_errors": -2.0}
    assert s.total == pytest.approx(1.0 - 0.3 - 0.1 - 0.4)
    assert run(reward.score(make("<answer>1240</answer>", {"answer": "1234"}))).terms["numeric"] == 1.0  # within 1%
    assert run(RuleReward({"numeric": 1.0}).score(make("<answer>1240</answer>", {"answer": "1234"}))).total == 0.0


def test_custom_terms_sync_async_and_by_module_path():
    @reward_term("test_mentions_paris")
    def mentions(trajectory, answer=None, bonus: float = 1.0):
        return bonus if answer and "paris" in answer.lower() else 0.0

    @reward_term("test_async_len")
    async def length(trajectory):
        await asyncio.sleep(0)
        return len(trajectory.model_text())

    assert "test_mentions_paris" in list_terms()
    reward = RuleReward({"test_mentions_paris": 2.0, "test_async_len": 0.01}, options={"test_mentions_paris": {"bonus": 3.0}})
    s = run(reward.score(make("<answer>paris</answer>")))
    assert s.terms == {"test_mentions_paris": 3.0, "test_async_len": 22.0}
    assert s.total == pytest.approx(6.22)
    assert get_term("rlfactory.rewards.rule:format_term") is get_term("format")
    with pytest.raises(ValueError, match="already registered"):
        reward_term("format")(lambda t: 0.0)


def test_configuration_errors_are_loud():
    with pytest.raises(ValueError, match="unknown reward term 'exact_mach'"):
        RuleReward({"exact_mach": 1.0})
    with pytest.raises(ValueError, match="without a weight"):
        RuleReward({"format": 1.0}, options={"extra_calls": {"budget": 1}})
    with pytest.raises(ValueError, match="takes no option"):
        run(RuleReward({"format": 1.0}, options={"format": {"budget": 1}}).score(make("x")))


def test_infra_error_is_not_scored():
    bad = make("<answer>x</answer>", status="infra_error")
    assert not is_scorable(bad) and is_scorable(make("x"))
    with pytest.raises(UnscorableTrajectory):
        run(RuleReward({"format": 1.0}).score(bad))
    good = make("<answer>x</answer>")
    out = run(score_all(RuleReward({"format": 1.0}), [good, bad, good]))
    assert [s.total if s else None for s in out] == [1.0, None, 1.0]


def test_function_reward():
    r = FunctionReward(lambda t: 0.5, name="half")
    assert run(r.score(make("x"))) == RewardScore(0.5, {"half": 0.5})

    async def scored(t):
        return RewardScore(1.0, {"a": 1.0})

    assert run(FunctionReward(scored).score(make("x"))).terms == {"a": 1.0}
