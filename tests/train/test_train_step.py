"""One training step's parts (rlfactory/train/step.py, learner.py) and how the run assembles them:
the learner hands back what it trained on as a dataclass (no value slipped through the metrics),
asynchronous training gets its generation as arguments (the session's engine and generator are
left as they were), and the train modules do not import each other in a circle."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import torch

from rlfactory.config import RunConfig, load_config
from rlfactory.generation.versioned import VersionedGenerator
from rlfactory.train.async_pipeline import LocalWeightSync
from rlfactory.train.learner import Learner
from rlfactory.train.parallel import SingleProcess
from rlfactory.train.loop import Trainer
from rlfactory.train.step import reward_tensors
from train_fixtures import make_traj, run_config, tiny_qwen3

TRAIN = Path(__file__).resolve().parents[2] / "rlfactory" / "train"


def test_the_learner_returns_its_trained_tokens_beside_the_metrics_not_inside_them(tmp_path):
    cfg = load_config(RunConfig, run_config(tmp_path, algo={"group_size": 2, "epochs": 2}))
    learner = Learner(cfg, tiny_qwen3(), pad_id=0, parallel=SingleProcess())
    trajs = [make_traj([("prompt", [1, 2]), ("model", [3, 4, 5])], "g0", "a"),
             make_traj([("prompt", [1, 2]), ("model", [6])], "g0", "b")]
    trajs[0].reward, trajs[1].reward = 1.0, 0.0
    rewards, groups, valid = reward_tensors(trajs)
    learned = learner.learn(1, trajs, torch.zeros(2, dtype=torch.long), rewards, groups, valid, valid.clone())
    assert learned.metrics["batch/tokens"] == 5 + 3  # both rows' tokens
    assert learned.train_tokens == 8 * 2  # over both epochs
    assert not [k for k in learned.metrics if k.startswith("_")]
    assert trajs[0].advantage == -trajs[1].advantage > 0


def test_asynchronous_training_gets_its_generation_as_arguments_and_rewires_nothing(tmp_path):
    from rlfactory.train.session import open_rollout
    from rlfactory.train.run import load_env_data

    cfg = load_config(RunConfig, run_config(tmp_path, trainer={"max_staleness": 1}))

    async def assemble():
        async with open_rollout(cfg, reward_mode="required") as session:
            engine, generator = session.engine, session.generator
            trainer = Trainer(cfg, session, session.reward, load_env_data(session.env, "train"))
            steps, pipeline = trainer.pipelined()
            try:
                # the session's engine and the trainer's synchronous steps are as they were
                assert session.engine is engine and engine.generator is generator
                assert trainer.steps.engine is engine and trainer.steps.weight_sync is None
                # the run's steps generate through a versioned gate on the generator, which now
                # samples from a copy of the policy that the local weight sync loads each version into
                assert steps.engine is not engine and isinstance(steps.engine.generator, VersionedGenerator)
                assert steps.engine.generator.generator is generator and isinstance(steps.weight_sync, LocalWeightSync)
                assert generator.model is steps.weight_sync.copy and generator.model is not trainer.learner.policy
            finally:
                await pipeline.close()

    asyncio.run(assemble())


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlfactory.train."):
            names.add(node.module.rsplit(".", 1)[1])
    return names


def test_no_two_train_modules_import_each_other_and_none_is_over_500_lines():
    graph = {p.stem: _imports(p) for p in TRAIN.glob("*.py")}
    pairs = sorted((a, b) for a, deps in graph.items() for b in deps if a < b and a in graph.get(b, set()))
    assert pairs == []
    for name in ("loop", "step", "learner", "async_pipeline"):
        assert len((TRAIN / f"{name}.py").read_text().splitlines()) < 500, name
    assert "loop" not in graph["async_pipeline"] and "step" not in graph["async_pipeline"]
