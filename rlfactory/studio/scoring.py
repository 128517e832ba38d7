"""The Rewards page: compose rule terms with weights, score a trajectory, see every term.

The reward is built from a `reward:` section exactly as training builds it (RewardConfig, then
rlfactory.rewards.build_reward), so what the page shows is what a run with that section would log.
"""

from __future__ import annotations

import inspect
from typing import Any

import yaml
from pydantic import ValidationError

from rlfactory.config import ConfigError, format_validation_error


def term_catalog() -> list[dict[str, str]]:
    """Every registered rule term with the first paragraph of its docstring."""
    from rlfactory.rewards.rule import get_term, list_terms

    out = []
    for name in list_terms():
        doc = inspect.getdoc(get_term(name)) or ""
        out.append({"name": name, "doc": doc.split("\n\n")[0].replace("\n", " ")})
    return out


def reward_section(terms: dict[str, Any], options: dict[str, Any] | None, answer: str | None) -> dict[str, Any]:
    """The `reward:` section for these choices (weights as floats; empty parts left out)."""
    section: dict[str, Any] = {"terms": {str(k): float(v) for k, v in terms.items()}}
    if options:
        section["options"] = options
    if answer and answer != "tag:answer":
        section["answer"] = answer
    return section


async def score(section: dict[str, Any], trajectory: dict[str, Any]) -> dict[str, Any]:
    """Score one trajectory (its JSON record) with the reward of `section`.

    Returns total, terms (raw values), weights, weighted contributions, the extracted answer and
    the references. ConfigError (naming the key) for a bad section or trajectory.
    """
    from rlfactory.rewards import build_reward
    from rlfactory.config import RewardConfig
    from rlfactory.rewards.text import answer_extractor, references_of
    from rlfactory.trajectory import Trajectory

    try:
        cfg = RewardConfig.model_validate(section)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, "reward").replace("\n  ", "\n  reward.")) from None
    if not cfg.terms:
        raise ConfigError("reward.terms: add at least one term with a weight")
    try:
        traj = Trajectory.from_dict(trajectory)
    except (TypeError, KeyError, ValueError) as e:
        raise ConfigError(f"trajectory: not a trajectory record ({e})") from None
    reward = build_reward(cfg)
    if traj.status == "infra_error":
        raise ConfigError("trajectory: status infra_error is never scored (it is left out of the loss)")
    try:
        result = await reward.score(traj)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"reward: {e}") from None
    weights = dict(cfg.terms)
    return {
        "total": result.total,
        "terms": result.terms,
        "weights": weights,
        "contributions": {k: weights.get(k, 1.0) * v for k, v in result.terms.items()},
        "answer": answer_extractor(cfg.answer)(traj),
        "references": references_of(traj),
        "logged": {"reward": trajectory.get("reward"), "reward_terms": trajectory.get("reward_terms")},
        "yaml": yaml.safe_dump({"reward": reward_section(cfg.terms, cfg.options, cfg.answer)}, sort_keys=False),
    }
