"""The trainer: roll out, score, compute advantages, update the policy, log, checkpoint.

`train(cfg, resume)` runs `rlfactory train`; `evaluate(engine, reward, rows)` runs a split;
`Trainer` runs one run's steps (rlfactory/train/loop.py); one step reads top to bottom in step.py.
"""

__all__ = ["Trainer", "train", "evaluate"]


def __getattr__(name: str):
    # The loop imports torch and the rollout engine; keep `import rlfactory.train` light.
    if name in ("Trainer", "train"):
        from rlfactory.train import loop

        return getattr(loop, name)
    if name == "evaluate":
        from rlfactory.train.evaluate import evaluate

        return evaluate
    raise AttributeError(name)
