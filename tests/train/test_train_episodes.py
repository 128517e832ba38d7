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
    from rlfactory.serve.gateway_agents import EpisodeReward

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
