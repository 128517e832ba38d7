"""Loss aggregation over branched samples (rlfactory/train/episodes.py): an episode of 3 samples
weighs like one episode: once in its group's baseline, its sampled tokens once each in a
token-mean loss; trajectories without episodes get exactly the estimator's advantages."""

from __future__ import annotations

import asyncio
import math

import torch

from rlfactory.algos.advantages import get_advantage
from rlfactory.protocols import GenResult
from rlfactory.serve.gateway_record import Episode
from rlfactory.train.episodes import episode_advantages, episode_firsts
from rlfactory.train.gateway_agents import EpisodeReward
from rlfactory.trajectory import Trajectory
from train_fixtures import FixedEngine, fixed_trainer, record_updates


def decode(ids):
    return str(ids)


def turn(ids):
    return GenResult(list(ids), [-1.0] * len(ids), "stop", "")


def three_sample_episode() -> list[Trajectory]:
    ep = Episode("e-a", decode)
    for prompt, sampled in (([1, 2], [3, 4]), ([1, 9], [5]), ([7], [6, 8, 10])):  # history rewritten twice
        ep.record(ep.match(prompt), prompt, [turn(sampled)], 0, [[]])
    return ep.trajectories("g", 0, "ok", 1.0)


def one_sample_episode(reward: float, k: int, sampled: list[int]) -> list[Trajectory]:
    ep = Episode(f"e-{k}", decode)
    ep.record(ep.match([1, 2]), [1, 2], [turn(sampled)], 0, [[]])
    return ep.trajectories("g", k, "ok", reward)


def tensors(trajs):
    rewards = torch.tensor([t.reward for t in trajs])
    return rewards, torch.zeros(len(trajs), dtype=torch.long), torch.ones(len(trajs), dtype=torch.bool)


def test_an_episode_of_three_samples_counts_once_in_the_baseline():
    branched = three_sample_episode()
    assert len(branched) == 3 and [t.info["sample"] for t in branched] == [0, 1, 2]
    trajs = branched + one_sample_episode(0.0, 1, [11])
    assert episode_firsts(trajs).tolist() == [0, 0, 0, 3]
    adv = episode_advantages(get_advantage("grpo"), *tensors(trajs), trajs)
    # two episodes, rewards 1 and 0: GRPO gives +-(0.5 / std([1, 0])) = +-1/sqrt(2), exactly as
    # for the same two episodes unbranched
    unbranched = [Trajectory("g-0", "g", reward=1.0), Trajectory("g-1", "g", reward=0.0)]
    plain = get_advantage("grpo")(*tensors(unbranched))
    assert torch.allclose(adv, torch.stack([plain[0]] * 3 + [plain[1]]))
    assert math.isclose(float(adv[0]), 1 / math.sqrt(2), rel_tol=1e-4)
    # counted per sample instead, the branched episode would pull the baseline to 0.75
    naive = get_advantage("grpo")(*tensors(trajs))
    assert not torch.allclose(naive, adv)


def test_its_sampled_tokens_enter_a_token_mean_loss_once_each():
    branched = three_sample_episode()
    tokens = [t for tr in branched for t, m in zip(tr.input_ids, tr.loss_mask) if m]
    # each sampled token once, nothing of the rewritten prompts: with loss_agg token-mean the three
    # samples put exactly the episode's 6 sampled tokens into the mean, as one trajectory would
    assert sorted(tokens) == [3, 4, 5, 6, 8, 10]


def test_trajectories_without_episodes_get_the_estimators_advantages():
    trajs = [Trajectory(f"g-{i}", "g", reward=r) for i, r in enumerate([1.0, 0.0, 0.5])]
    for name in ("grpo", "rloo", "dr_grpo"):
        fn = get_advantage(name)
        assert torch.equal(episode_advantages(fn, *tensors(trajs), trajs), fn(*tensors(trajs)))


def test_the_trainer_counts_a_branched_episode_once_in_its_baseline(tmp_path):
    a = three_sample_episode()  # group g, reward 1
    b = one_sample_episode(0.0, 1, [11])  # group g, reward 0
    c = [Trajectory(f"h-{k}", "h", segments=[s for s in one_sample_episode(r, k, [12 + k])[0].segments], reward=r)
         for k, r in enumerate([1.0, 0.0])]  # plain trajectories, no episode
    trajs = a + b + c
    trainer = fixed_trainer(tmp_path, FixedEngine(trajs), EpisodeReward())
    updates = record_updates(trainer)
    metrics, out = asyncio.run(trainer.step(1))
    assert metrics["batch/kept"] == 6
    adv, half = updates[0].advantages.tolist(), 1 / math.sqrt(2)
    assert all(math.isclose(x, half, rel_tol=1e-4) for x in adv[:3])  # the 3 samples of the episode that won
    assert math.isclose(adv[3], -half, rel_tol=1e-4)  # counted per sample, the baseline would be 0.75
    assert math.isclose(adv[4], half, rel_tol=1e-4) and math.isclose(adv[5], -half, rel_tol=1e-4)


def test_a_rollout_branched_by_its_context_is_scored_once_and_trained_as_its_samples(tmp_path):
    """rollout.context: the engine returns one trajectory per episode with `branches`; the trainer
    scores it whole (the reward sees all 3 turns) and trains its 2 samples, counted once."""
    from rlfactory.rewards.rule import FunctionReward
    from rlfactory.trajectory import Branch, Segment

    def whole(ids, tid, branches=()):
        segs = [Segment("prompt", [1, 2])] + [Segment(r, i, "", [-1.0] * len(i) if r == "model" else None, 0)
                                              for r, i in ids]
        return Trajectory(tid, "g", segs, branches=list(branches))

    # episode a: 3 turns, the window slid before turn 3; episode b: 1 turn
    a = whole([("model", [3]), ("observation", [4]), ("model", [5]), ("observation", [6]), ("model", [7])], "g-0",
              [Branch(5, [1, 2, 5, 6], "", 2, "sliding_window: turn 1 left out")])
    b = whole([("model", [9])], "g-1")
    scored = []

    def turns(t):  # 1 for the 3-turn episode: scored as a whole, not per sample
        scored.append(t.id)
        return float(len(t.turn_segments()) == 3)

    trainer = fixed_trainer(tmp_path, FixedEngine([a, b]), FunctionReward(turns), rows=({"id": 0},))
    updates = record_updates(trainer)
    metrics, out = asyncio.run(trainer.step(1))
    assert sorted(scored) == ["g-0", "g-1"]
    assert [t.id for t in out] == ["g-0", "g-0.1", "g-1"] and [t.reward for t in out] == [1.0, 1.0, 0.0]
    assert [t.input_ids for t in out] == [[1, 2, 3, 4, 5], [1, 2, 5, 6, 7], [1, 2, 9]]
    assert metrics["batch/kept"] == 3 and metrics["traj/samples"] == 1.5  # samples per episode
    adv = updates[0].advantages.tolist()
    half = 1 / math.sqrt(2)  # two episodes, rewards 1 and 0, as unbranched
    assert all(math.isclose(x, half, rel_tol=1e-4) for x in adv[:2]) and math.isclose(adv[2], -half, rel_tol=1e-4)
