"""Golden numbers (torchtune's habit): a few metrics of two training steps of tiny:1m, pinned, so
that a change meant to move code (not maths) provably changes no loss, advantage or logprob.

The values were printed by this same test's `_golden` on the commit that added it (44890a0 plus
this file), on the pinned torch (2.13.0) and the CI machine's CPU. A change that moves them on
purpose (a new default, a fixed bug in the maths) updates them in the same commit and says why.
"""

from __future__ import annotations

import pytest

from rlfactory.cli.main import main
from rlfactory.train.runlog import read_metrics
from train_fixtures import run_config

KEYS = ("reward/mean", "reward/std", "adv/mean", "adv/std", "loss/total", "policy/entropy",
        "optim/grad_norm", "mismatch/abs_diff")
VARIANTS = {
    "grpo_ppo": {},
    "rloo_gspo_kl": {"algo": {"advantage": "rloo", "loss": "gspo", "kl_coef": 0.1, "clip_low": 3e-4,
                              "clip_high": 4e-4, "loss_agg": "seq-mean-token-mean"}},
    "gae_epochs": {"algo": {"advantage": "gae", "epochs": 2, "minibatch_size": 2, "micro_batch_size": 1}},
    "drgrpo_entropy_norm": {"algo": {"advantage": "dr_grpo", "entropy_coef": 0.01,
                                     "loss_agg": "seq-mean-token-sum-norm"}},
}
GOLDEN: dict[str, list[dict[str, float]]] = {
    "drgrpo_entropy_norm": [
        {"reward/mean": 0.229166667, "reward/std": 0.104858812, "adv/mean": -9.31322575e-09, "adv/std": 0.0760725811, "loss/total": -0.00142469886, "policy/entropy": 0.142469913, "optim/grad_norm": 0.00678401114, "mismatch/abs_diff": 1.98682145e-07},
        {"reward/mean": 0.270833333, "reward/std": 0.157747454, "adv/mean": -7.4505806e-09, "adv/std": 0.140270904, "loss/total": -0.00142467092, "policy/entropy": 0.142467111, "optim/grad_norm": 0.00562374759, "mismatch/abs_diff": 2.18550369e-07},
    ],
    "gae_epochs": [
        {"reward/mean": 0.229166667, "reward/std": 0.104858812, "adv/mean": -1.53978661e-07, "adv/std": 0.99999994, "loss/total": -0.0522486381, "policy/entropy": 7.59872812, "optim/grad_norm": 3.27384372, "mismatch/abs_diff": 1.68879822e-07},
        {"reward/mean": 0.270833333, "reward/std": 0.157747454, "adv/mean": 5.96046448e-08, "adv/std": 0.999999881, "loss/total": -0.0588455368, "policy/entropy": 7.59560323, "optim/grad_norm": 2.03181249, "mismatch/abs_diff": 2.58286804e-07},
    ],
    "grpo_ppo": [
        {"reward/mean": 0.229166667, "reward/std": 0.104858812, "adv/mean": -1.34110451e-07, "adv/std": 0.81648618, "loss/total": 1.390775e-07, "policy/entropy": 7.59839582, "optim/grad_norm": 3.82054687, "mismatch/abs_diff": 1.98682145e-07},
        {"reward/mean": 0.270833333, "reward/std": 0.157747454, "adv/mean": -7.4505806e-08, "adv/std": 0.816487908, "loss/total": 5.96046448e-08, "policy/entropy": 7.59828043, "optim/grad_norm": 1.78283167, "mismatch/abs_diff": 1.58945724e-07},
    ],
    "rloo_gspo_kl": [
        {"reward/mean": 0.229166667, "reward/std": 0.104858812, "adv/mean": -1.49011612e-08, "adv/std": 0.152145147, "loss/total": 1.49011612e-08, "policy/entropy": 7.5983963, "optim/grad_norm": 0.723809302, "mismatch/abs_diff": 1.98682145e-07},
        {"reward/mean": 0.270833333, "reward/std": 0.157747454, "adv/mean": -3.7252903e-09, "adv/std": 0.280541778, "loss/total": 0.00367518142, "policy/entropy": 7.59807062, "optim/grad_norm": 0.641391516, "mismatch/abs_diff": 2.18550369e-07},
    ],
}


def _golden(tmp_path, variant: str) -> list[dict[str, float]]:
    cfg_path = run_config(tmp_path, **VARIANTS[variant])
    assert main(["train", cfg_path]) == 0
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    return [{k: r[k] for k in KEYS if k in r} for r in records]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_two_steps_reproduce_the_pinned_numbers(tmp_path, variant):
    got = _golden(tmp_path, variant)
    print(variant, got)  # with -s: the values to paste when a change moves them on purpose
    want = GOLDEN[variant]
    assert [sorted(r) for r in got] == [sorted(r) for r in want]
    for step, (g, w) in enumerate(zip(got, want), 1):
        for key in w:
            assert g[key] == pytest.approx(w[key], rel=1e-4, abs=1e-6), (variant, step, key)
