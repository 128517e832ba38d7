"""Run under torchrun by test_distributed_fsdp.py: one training step's learning (`Learner.learn`)
on a hand-built batch, once in this process alone and once by the FSDP2 learner over all ranks
(gloo on CPU; nccl on this rank's GPU when CUDA is available);
rank 0 writes how far apart the two are (weights, metrics, annotations) to the JSON file argv[1].

The batch is uneven on purpose: rank 0 holds two groups, rank 1 one group with an infra_error
trajectory (out of the loss), row lengths differ, so ranks run different numbers of micro-batches
(filler passes keep them in step) and minibatches of the shuffled order split unevenly."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))

from train_fixtures import make_traj, tiny_qwen3  # noqa: E402

from rlfactory.distributed.fsdp import FsdpLearner  # noqa: E402
from rlfactory.train.session import pad_id_of  # noqa: E402
from rlfactory.config import RunConfig  # noqa: E402
from rlfactory.train.learner import Learner  # noqa: E402
from rlfactory.train.parallel import SingleProcess  # noqa: E402
from rlfactory.train.step import reward_tensors  # noqa: E402

CASES = {
    "token-mean, minibatches, micro 1, 2 epochs, kl, entropy": dict(
        loss_agg="token-mean", minibatch_size=3, micro_batch_size=1, epochs=2, kl_coef=0.1, entropy_coef=0.01),
    "seq-mean-token-mean, one pass": dict(loss_agg="seq-mean-token-mean"),
    "seq-mean-token-sum-norm, micro 2": dict(loss_agg="seq-mean-token-sum-norm", micro_batch_size=2),
    "gigpo per-turn advantages, micro 1": dict(advantage="gigpo", micro_batch_size=1, turn_gamma=0.9),
}


def batch():
    """(trajectories, owner rank of each): ranks 0 and 1 of a 2-rank run."""
    t = [
        make_traj([("prompt", [1, 2, 3]), ("model", [10, 11]), ("observation", [30, 31]), ("model", [12, 13, 14])], "g0", "a"),
        make_traj([("prompt", [1, 2, 3]), ("model", [20, 21, 22, 23, 24, 25])], "g0", "b"),
        make_traj([("prompt", [4, 5]), ("model", [40])], "g1", "c"),
        make_traj([("prompt", [4, 5]), ("model", [41, 42, 43]), ("observation", [44])], "g1", "d"),
        make_traj([("prompt", [6, 7, 8, 9]), ("model", [50, 51, 52, 53, 54, 55, 56, 57, 58])], "g2", "e"),
        make_traj([("prompt", [6, 7, 8, 9]), ("model", [59, 60])], "g2", "f"),
        make_traj([("prompt", [6, 7, 8, 9]), ("model", [61, 62, 63])], "g2", "g"),
    ]
    for traj, r in zip(t, [1.0, 0.0, 0.5, 1.5, 2.0, -1.0, None]):
        traj.reward = r  # the last one is unscored (infra_error): out of the baseline and the loss
    t[0].turn_segments()[0].reward = 0.5  # per-turn rewards: only the turn estimators read them
    t[4].turn_segments()[0].reward = -0.25
    return t, [0, 0, 0, 0, 1, 1, 1]


def learn(algo: dict, device: str, parallel=None):
    cfg = RunConfig.model_validate({"algo": {"group_size": 2, **algo}, "trainer": {"lr": 1e-2, "prompts_per_step": 2}})
    model = tiny_qwen3(seed=0).to(device)
    learner = Learner(cfg, model, pad_id_of(None, model), parallel if parallel is not None else SingleProcess())
    trajs, owners = batch()
    owners = [min(o, parallel.world_size - 1) if parallel is not None else 0 for o in owners]
    owners_t = torch.tensor(owners)
    rewards, groups, valid = reward_tensors(trajs)
    keep = valid.clone()
    metrics = learner.learn(1, trajs, owners_t, rewards, groups, valid, keep).metrics
    if parallel is not None:
        parallel.sync_replica(learner.policy, learner.replica)
        trajs = [t for t, o in zip(trajs, owners) if o == parallel.rank]
    weights = {k: v.detach().cpu().clone() for k, v in learner.replica.state_dict().items()}
    notes = {t.id: (t.advantage, [x for s in t.segments if s.role == "model" for x in (s.trainer_logprobs or [])])
             for t in trajs if t.reward is not None}
    return metrics, weights, notes


def main(out: str) -> None:
    parallel = FsdpLearner(RunConfig().fsdp)
    device = "cuda" if parallel.backend == "nccl" else "cpu"  # cuda: this rank's GPU (LOCAL_RANK)
    report = {}
    for name, algo in CASES.items():
        m1, w1, n1 = learn(algo, device)
        m2, w2, n2 = learn(algo, device, parallel)
        notes = {}
        for part in parallel.gather([n2]):
            notes.update(part)
        weight_diff = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
        moved = max(float((w1[k] - tiny_qwen3(seed=0).state_dict()[k]).abs().max()) for k in w1)
        metric_diff = {k: abs(m1[k] - m2[k]) for k in m1}
        note_diff = max(max([abs(a - b) for a, b in zip(n1[k][1], notes[k][1])] + [abs(n1[k][0] - notes[k][0])])
                        for k in n1)
        report[name] = {"world_size": parallel.world_size, "backend": parallel.backend, "weight_diff": weight_diff, "weights_moved": moved, "metric_diff": metric_diff,
                        "missing_metrics": sorted(set(m1) ^ set(m2)), "annotation_diff": note_diff,
                        "loss_single": m1["loss/policy"], "loss_fsdp": m2["loss/policy"]}
    parts = parallel.gather([report])
    if parallel.is_main:
        Path(out).write_text(json.dumps(parts, indent=1))
    parallel.close()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1])
