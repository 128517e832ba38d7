"""The FSDP2 learner on CPU: 2 real ranks under torchrun with gloo (tiny models)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fsdp_launch  # noqa: E402
from train_fixtures import run_config  # noqa: E402

from rlfactory.cli.main import main  # noqa: E402
from rlfactory.rollout.engine import group_names  # noqa: E402
from rlfactory.train.step import rename_groups  # noqa: E402
from rlfactory.train.parallel import RowLayout  # noqa: E402
from rlfactory.trajectory import Trajectory  # noqa: E402


@pytest.mark.slow
def test_fsdp_step_on_two_ranks_equals_the_one_process_step(tmp_path):
    # Four cases (token-mean with minibatches, micro-batches of 1, 2 epochs, KL and entropy;
    # seq-mean-token-mean; seq-mean-token-sum-norm with micro-batches of 2; gigpo, per turn) on an uneven batch.
    fsdp_launch.check_update_report(fsdp_launch.update_report(2, tmp_path / "report.json"), world_size=2)


EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "fsdp.yaml")
SMALL = ["trainer.steps=2", "trainer.save_every=1", "trainer.prompts_per_step=2", "trainer.lr=1e-3",
         "trainer.progress=false", "algo.group_size=2", "rollout.mode=lockstep", "rollout.max_new_tokens=12"]


@pytest.mark.slow
def test_fsdp_training_logs_once_checkpoints_sharded_and_resumes_exactly(tmp_path):
    # README: .venv/bin/rlfactory train examples/fsdp.yaml --nproc 2 (on a tiny budget)
    proc = fsdp_launch.train(EXAMPLE, *SMALL, f"trainer.run_dir={tmp_path / 'whole'}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "FSDP2 learner on 2 rank(s), backend gloo, 1 CPU thread(s) per rank" in proc.stderr
    run_dir = tmp_path / "whole"
    records = fsdp_launch.metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2]  # rank 0 alone writes the log
    trajs = [json.loads(line) for line in (run_dir / "trajectories" / "step_000002.jsonl").read_text().splitlines()]
    assert len(trajs) == 4 and len({t["id"] for t in trajs}) == 4  # both ranks' trajectories, ids as in one process
    assert len({t["group"] for t in trajs}) == 2
    ckpt = run_dir / "checkpoints" / "step_000002"
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["world_size"] == 2 and meta["sharded"] is True
    assert (ckpt / "model" / "model.safetensors").is_file() and (ckpt / "model" / "config.json").is_file()
    assert sorted(p.name for p in (ckpt / "optimizer").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert (ckpt / "rng_rank0.pt").is_file() and (ckpt / "rng_rank1.pt").is_file()
    assert "optimizer" not in torch.load(ckpt / "trainer_state.pt", weights_only=False)

    split = [*SMALL, f"trainer.run_dir={tmp_path / 'split'}"]
    assert fsdp_launch.train(EXAMPLE, *split, "trainer.steps=1").returncode == 0
    proc = fsdp_launch.train(EXAMPLE, *split, "--resume")
    assert proc.returncode == 0, proc.stderr[-4000:]
    resumed = fsdp_launch.metrics(tmp_path / "split")
    assert [fsdp_launch.comparable(r) for r in resumed] == [fsdp_launch.comparable(r) for r in records]
    assert records[1]["optim/updates"] == 1.0 and records[1]["mismatch/abs_diff"] < 1e-5  # the replica got the update

    # One process on the same config logs the same step: each row's draws are seeded by its place
    # in the step, so the ranks' shares sample what one process samples; the update agrees to float rounding.
    assert main(["train", EXAMPLE, *SMALL, "trainer.steps=1", f"trainer.run_dir={tmp_path / 'single'}"]) == 0
    (single,) = fsdp_launch.metrics(tmp_path / "single")
    assert fsdp_launch.comparable(records[0]) == pytest.approx(fsdp_launch.comparable(single), rel=1e-4, abs=1e-6)

    # A sharded checkpoint cannot be continued by one process: one line saying how to resume it.
    with pytest.raises(ValueError, match=r"written by the FSDP learner; resume it under torchrun"):
        main(["train", EXAMPLE, *split, "trainer.steps=3", "--resume"])


def test_unsupported_fsdp_settings_are_one_line_config_errors(tmp_path, capsys):
    lora = run_config(tmp_path, "lora", trainer={"lora": {"r": 4}})
    assert main(["train", lora, "--nproc", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "trainer.lora" in err and "FSDP" in err
    uneven = run_config(tmp_path, "uneven", trainer={"prompts_per_step": 3})
    assert main(["train", uneven, "--nproc", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "trainer.prompts_per_step=3" in err


def test_row_layout_forms_the_same_minibatches_on_every_rank():
    layout = RowLayout(torch.tensor([0, 0, 1, 0, 1]), torch.tensor([3.0, 0.0, 5.0, 2.0, 1.0]), rank=1, world_size=2)
    mb = torch.tensor([4, 0, 2])
    assert layout.rows_of(mb).tolist() == [1, 0]  # rank 1's rows 2 and 4 are its local rows 0 and 1
    assert layout.rows_of(mb, rank=0).tolist() == [0]
    assert layout.passes(mb, 1) == 2 and layout.passes(mb, None) == 1 and layout.passes(torch.tensor([1]), 1) == 1


def test_ranks_name_groups_as_one_process_would():
    rows = [{"id": "a"}, {}, {"id": "a"}, {}]
    names = group_names(rows)
    assert names == ["a", "1", "a#2", "3"]
    trajs = [Trajectory(id=f"x-{k}", group="0") for k in range(4)]  # rank 1's engine names its rows 0, 1
    rename_groups(trajs, names[2:], group_size=2)
    assert [(t.group, t.id) for t in trajs] == [("a#2", "a#2-0"), ("a#2", "a#2-1"), ("3", "3-0"), ("3", "3-1")]
