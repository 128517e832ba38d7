"""Fixtures for trainer tests: a tiny randomly initialised Qwen3 and hand-built trajectories."""

from __future__ import annotations

import torch

from rlfactory.trajectory import Segment, Trajectory

VOCAB = 64


def tiny_qwen3(seed: int = 0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=256, tie_word_embeddings=False,
    )
    return Qwen3ForCausalLM(cfg).eval()


def make_traj(parts: list[tuple[str, list[int]]], group: str = "g0", tid: str = "t", lp: float = -1.0) -> Trajectory:
    """parts: [(role, token ids)]; model segments get sampler logprob `lp` per token."""
    segs = [Segment(role=r, token_ids=list(ids), logprobs=[lp] * len(ids) if r == "model" else None, policy_version=0 if r == "model" else None) for r, ids in parts]
    return Trajectory(id=tid, group=group, segments=segs)



def low_ids(trajectory) -> float:
    """A reward term with signal even for an untrained model: share of model tokens with id < 500."""
    ids = [t for s in trajectory.segments if s.role == "model" for t in s.token_ids]
    return sum(1 for t in ids if t < 500) / len(ids) if ids else 0.0


def run_config(tmp_path, name: str = "run", **sections) -> str:
    """A small `python` env training config (tiny:1m) written to tmp_path/NAME.yaml."""
    import yaml

    cfg = {
        "model": {"path": "tiny:1m"},
        "env": {"name": "python"},
        "reward": {"terms": {"train_fixtures:low_ids": 1.0, "numeric": 1.0}},
        "rollout": {"max_turns": 2, "max_new_tokens": 12, "max_total_tokens": 640, "mode": "lockstep"},
        "algo": {"group_size": 2},
        "trainer": {"steps": 2, "prompts_per_step": 2, "lr": 1e-3, "run_dir": str(tmp_path / name), "save_every": 1,
                    "progress": False},
    }
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def first_token_even(trajectory) -> float:
    """1.0 when the first model token has an even id."""
    ids = [t for s in trajectory.segments if s.role == "model" for t in s.token_ids]
    return float(bool(ids) and ids[0] % 2 == 0)


def blocks_in_eval(trajectory) -> float:
    """0.0; but in a process with $RLF_TEST_BLOCK_EVAL set, scoring a test-split trajectory (an
    evaluation) touches that file and blocks, so that a test can kill the process right there."""
    import os
    import time
    from pathlib import Path

    marker = os.environ.get("RLF_TEST_BLOCK_EVAL")
    if marker and trajectory.info.get("extra_info", {}).get("split") == "test":
        Path(marker).touch()
        time.sleep(3600)
    return 0.0


def turn_low_ids(trajectory, turn) -> float:
    """A turn term with signal for an untrained model: share of the turn's tokens with id < 500."""
    ids = turn.segment.token_ids
    return sum(1 for t in ids if t < 500) / len(ids) if ids else 0.0


class FixedEngine:
    """Unit-test stand-in for the rollout engine: every step returns the same hand-built trajectories."""

    def __init__(self, trajs: list[Trajectory]) -> None:
        self.trajs, self.sampling = trajs, None

    async def run(self, rows, n, policy_version=0, *, seeds=None, priority=0):
        return self.trajs


def fixed_trainer(tmp_path, engine, reward, rows=({"id": 0}, {"id": 1})):
    """A Trainer on tiny_qwen3 (groups of two, a step of `rows`) whose rollouts come from `engine`:
    a FixedEngine, or any object with the engine's `run`."""
    from types import SimpleNamespace

    from rlfactory.config import RunConfig, load_config
    from rlfactory.train.loop import Trainer

    model = tiny_qwen3()
    session = SimpleNamespace(engine=engine, generator=SimpleNamespace(model=model, pad_id=0), model=model,
                              tokenizer=SimpleNamespace(pad_token_id=0), tool_manager=None, runner=None, env=None)
    cfg = load_config(RunConfig, run_config(tmp_path, algo={"group_size": 2}, trainer={"prompts_per_step": len(rows)}))
    return Trainer(cfg, session, reward, train_rows=list(rows))


def record_updates(trainer) -> list:
    """Wrap the trainer's learner update so that the UpdateData of each call is appended to the
    returned list (the update itself still runs)."""
    seen = []
    real = trainer.learner.update

    class Recording:
        def single_pass(self, n):
            return real.single_pass(n)

        def passes(self, *args):
            return real.passes(*args)

        def __call__(self, data, gen, layout=None):
            seen.append(data)
            return real(data, gen, layout)

    trainer.learner.update = Recording()
    return seen
