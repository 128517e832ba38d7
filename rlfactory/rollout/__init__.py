"""Multi-turn rollouts: the asynchronous engine and the lock-step baseline, over a `Generator`
(the backends live in `rlfactory.generation`).

    engine = RolloutEngine(generator, tool_manager, runner, env, cfg.rollout, cfg.sampling)
    trajs = await engine.run(rows, n=8)               # n trajectories per row, reward left None

A whole session (model, tokenizer, ToolManager, tools, env, reward) is assembled from a run's
config by `rlfactory.train.session.open_rollout`.

Names are imported lazily, so importing one of them does not load the model code. `Trajectory`
and its parts live in `rlfactory.trajectory`, the `Generator` contract (`GenRequest`, `GenResult`)
in `rlfactory.protocols`: both are shared by every layer.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "RolloutEngine": "engine",
    "rollout_one": "episode",
    "RolloutObserver": "observer",
    "PromptEnv": "prompt_env",
    "ScriptedPolicy": "scripted",
    "TurnPlan": "scripted",
    "summarize": "summary",
    "format_summary": "summary",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"rlfactory.rollout.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'rlfactory.rollout' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
