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

from rlfactory.lazy import lazy_exports

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

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())
