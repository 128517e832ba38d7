"""ComposedReward and build_reward from a YAML config."""

import asyncio

import pytest

from rlfactory.config import ConfigError, RewardConfig, load_config, validate
from rlfactory.rewards import ComposedReward, FunctionReward, RuleReward, UnscorableTrajectory, build_reward, score_all
from rlfactory.trajectory import Segment, ToolCallRecord, Trajectory


def make(text, answer="Paris", calls=0, status="ok"):
    segs = [Segment("prompt", [1], "p"), Segment("model", [2], text, logprobs=[0.0])]
    records = [ToolCallRecord(name="s", arguments={}, status="ok", latency_s=0.0) for _ in range(calls)]
    return Trajectory(id=text, group="g", segments=segs, tool_calls=records, status=status, info={"answer": answer})


def test_composed_reward_reports_every_term_and_weights_totals():
    rule = RuleReward({"exact_match": 1.0, "extra_calls": 0.5}, options={"extra_calls": {"budget": 1}})
    length = FunctionReward(lambda t: len(t.model_text()) / 100, name="len")
    reward = ComposedReward({"rule": (rule, 2.0), "brevity": (length, -1.0)})
    t = make("<answer>paris</answer>", calls=3)
    s = asyncio.run(reward.score(t))
    assert s.terms == {"rule": 0.0, "rule/exact_match": 1.0, "rule/extra_calls": -2.0, "brevity": 0.22, "brevity/len": 0.22}
    assert s.total == pytest.approx(2.0 * 0.0 - 0.22)
    many = asyncio.run(reward.score_many([t, make("<answer>Rome</answer>")]))
    assert many[0] == s and many[1].terms["rule/exact_match"] == 0.0
    with pytest.raises(UnscorableTrajectory):
        asyncio.run(reward.score(make("x", status="infra_error")))
    out = asyncio.run(score_all(reward, [make("x", status="infra_error"), t]))
    assert out[0] is None and out[1] == s
    with pytest.raises(ValueError):
        ComposedReward({"a/b": (rule, 1.0)})
    with pytest.raises(ValueError):
        ComposedReward({"a": rule})
    with pytest.raises(ValueError, match="part 'a' must be \\(reward, weight\\)"):
        ComposedReward({"a": (lambda t: 1.0, 1.0)})  # a function, not a Reward (no score)


def test_build_reward_from_yaml_with_overrides(tmp_path):
    path = tmp_path / "reward.yaml"
    path.write_text(
        "terms: {exact_match: 1.0, format: 0.1, extra_calls: 0.05}\n"
        "options: {extra_calls: {budget: 2}}\n"
        "answer: boxed\n",
        encoding="utf-8",
    )
    cfg = load_config(RewardConfig, path, ["options.extra_calls.budget=0"])
    reward = build_reward(cfg)
    assert isinstance(reward, RuleReward)  # a single part with weight 1 is returned as is
    s = asyncio.run(reward.score(make("so \\boxed{Paris}", calls=2)))
    assert s.terms == {"exact_match": 1.0, "format": 1.0, "extra_calls": -2.0}
    assert s.total == pytest.approx(1.0 + 0.1 - 0.1)


def test_default_reward_and_errors():
    default = FunctionReward(lambda t: 1.0, name="env")
    assert build_reward(RewardConfig(), default) is default
    with pytest.raises(ConfigError, match="nothing configured"):
        build_reward(RewardConfig())
    both = build_reward(validate(RewardConfig, {"terms": {"format": 1.0}, "default_weight": 0.5}), default)
    s = asyncio.run(both.score(make("<answer>x</answer>")))
    assert s.terms == {"rule": 1.0, "rule/format": 1.0, "default": 1.0, "default/env": 1.0} and s.total == 1.5
    with pytest.raises(ConfigError, match="no default reward"):
        build_reward(validate(RewardConfig, {"terms": {"format": 1.0}, "default_weight": 0.5}))
    with pytest.raises(ConfigError, match="unknown reward term 'exact'"):
        build_reward(validate(RewardConfig, {"terms": {"exact": 1.0}}))
    with pytest.raises(ConfigError, match="terms is empty"):
        build_reward(validate(RewardConfig, {"options": {"format": {}}}))
    with pytest.raises(ConfigError, match="judge.model"):
        validate(RewardConfig, {"judge": {"backend": "openai"}})
    with pytest.raises(ConfigError, match="unknown key"):
        validate(RewardConfig, {"judge": {"model": "m", "temprature": 0.1}})
    with pytest.raises(ConfigError, match="not one of the env's tools"):
        build_reward(validate(RewardConfig, {"verify": {"tool": "sql"}}))


class CountingBatches:
    """A reward with score_many (ScoresMany): counts its batches and single scores."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.singles = 0

    async def score(self, trajectory):
        from rlfactory.rewards import RewardScore

        self.singles += 1
        return RewardScore(1.0)

    async def score_many(self, trajectories):
        from rlfactory.rewards import RewardScore

        self.batches.append(len(trajectories))
        return [RewardScore(2.0) for _ in trajectories]


def test_score_all_hands_a_batching_reward_the_scorable_trajectories_at_once():
    from rlfactory.rewards.base import ScoresMany

    batching = CountingBatches()
    out = asyncio.run(score_all(batching, [make("a"), make("x", status="infra_error"), make("b")]))
    assert isinstance(batching, ScoresMany)
    assert batching.batches == [2] and batching.singles == 0
    assert [s.total if s else None for s in out] == [2.0, None, 2.0]
    plain = FunctionReward(lambda t: 3.0, name="three")
    assert not isinstance(plain, ScoresMany)
    assert [s.total for s in asyncio.run(score_all(plain, [make("a"), make("b")]))] == [3.0, 3.0]
