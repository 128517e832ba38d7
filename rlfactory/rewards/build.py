"""Build a `Reward` from the `reward:` config section."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from rlfactory.config import ConfigError, JudgeConfig, RewardConfig, VerifyConfig
from rlfactory.imports import import_ref
from rlfactory.rewards.base import Reward
from rlfactory.rewards.compose import ComposedReward
from rlfactory.rewards.judge import DEFAULT_TEMPLATE, JudgeReward, LocalJudge, OpenAIJudge, number_score, parse_yes_no
from rlfactory.rewards.rule import RuleReward
from rlfactory.rewards.text import answer_extractor
from rlfactory.rewards.turns import DEFAULT_TURN_TEMPLATE, JudgeTurnReward, TurnRuleReward, WithTurnRewards
from rlfactory.rewards.verify import VerifyReward, artifact_arguments, same_output, same_rows
from rlfactory.tools.base import Tool


def build_reward(cfg: RewardConfig, default: Reward | None = None, *, tools: Mapping[str, Tool] | None = None) -> Reward:
    """The configured reward: the outcome reward (`build_outcome_reward`), with the process
    rewards of `reward.turn_terms` / `reward.turn_judge` beside it (`WithTurnRewards`) when set."""
    outcome = build_outcome_reward(cfg, default, tools=tools)
    scorers: list[Any] = []
    try:
        if cfg.turn_terms:
            scorers.append(TurnRuleReward(cfg.turn_terms, cfg.turn_options))
        elif cfg.turn_options:
            raise ValueError("reward.turn_options is set but reward.turn_terms is empty")
        if cfg.turn_judge is not None:
            judge = build_judge_reward(cfg.turn_judge)
            scorers.append(JudgeTurnReward(judge, judge_template(cfg.turn_judge) or DEFAULT_TURN_TEMPLATE,
                                           cfg.turn_judge.weight, cfg.turn_judge.fallback))
    except (ValueError, ImportError, AttributeError, OSError) as e:
        raise ConfigError(f"reward: {e}") from e
    return WithTurnRewards(outcome, scorers) if scorers else outcome


def build_outcome_reward(cfg: RewardConfig, default: Reward | None = None, *,
                         tools: Mapping[str, Tool] | None = None) -> Reward:
    """The configured reward.

    - nothing configured: `default` (the env's reward); a ConfigError when there is none.
    - one part (rule terms, judge or verify) with weight 1 and no default_weight: that reward.
    - otherwise a `ComposedReward` with parts "rule" (weight 1), "judge", "verify" and, when
      `default_weight` is set, "default".
    `tools` are the env's tools by name, for `reward.verify.tool`.
    """
    parts: dict[str, tuple[Reward, float]] = {}
    try:
        if cfg.terms:
            options = {k: v for k, v in cfg.options.items()}
            for name, opts in options.items():
                if not isinstance(opts, Mapping):
                    raise ValueError(f"reward.options.{name} must be a mapping of keyword options")
            parts["rule"] = (RuleReward(cfg.terms, answer_extractor(cfg.answer), options=options), 1.0)
        elif cfg.options:
            raise ValueError("reward.options is set but reward.terms is empty")
        if cfg.judge is not None:
            parts["judge"] = (build_judge_reward(cfg.judge), cfg.judge.weight)
        if cfg.verify is not None:
            parts["verify"] = (build_verify_reward(cfg.verify, tools or {}), cfg.verify.weight)
    except (ValueError, ImportError, AttributeError, OSError) as e:
        raise ConfigError(f"reward: {e}") from e
    if not parts:
        if default is None:
            raise ConfigError("reward: nothing configured (reward.terms / judge / verify) and the env has no default reward")
        return default
    if cfg.default_weight is not None:
        if default is None:
            raise ConfigError("reward.default_weight is set but the env has no default reward")
        parts["default"] = (default, cfg.default_weight)
    if len(parts) == 1:
        (reward, weight), = parts.values()
        if weight == 1.0:
            return reward
    return ComposedReward(parts)


def judge_template(cfg: JudgeConfig) -> str | None:
    """The configured template text (from template_file or template), None when unset."""
    return Path(cfg.template_file).read_text(encoding="utf-8") if cfg.template_file else cfg.template


def build_judge_reward(cfg: JudgeConfig) -> JudgeReward:
    template = judge_template(cfg)
    parse = parse_yes_no if cfg.score == "yes_no" else number_score(cfg.max_score, cfg.score_regex)
    if cfg.backend == "openai":
        judge: Any = OpenAIJudge(
            cfg.base_url,
            cfg.model,
            api_key_env=cfg.api_key_env,
            system=cfg.system,
            temperature=cfg.temperature,
            max_tokens=cfg.max_tokens,
            timeout_s=cfg.timeout_s,
            retries=cfg.retries,
            max_concurrency=cfg.max_concurrency,
        )
    else:
        judge = LocalJudge(*load_local_model(cfg.model), system=cfg.system, max_new_tokens=cfg.max_tokens,
                           batch_size=cfg.batch_size)
    return JudgeReward(
        judge,
        template or DEFAULT_TEMPLATE,
        parse,
        answer_extractor=answer_extractor(cfg.answer, "reward.judge.answer"),
        batch_size=cfg.batch_size,
        fallback=cfg.fallback,
        on_error=cfg.on_error,
    )


def load_local_model(path: str) -> tuple[Any, Any]:
    """(model, tokenizer) from a local checkpoint folder; never downloads."""
    if not Path(path).is_dir():
        raise ValueError(f"reward.judge.model: local judge checkpoint folder not found: {path}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    return model, tokenizer


def build_verify_reward(cfg: VerifyConfig, tools: Mapping[str, Tool]) -> VerifyReward:
    if cfg.tool in tools:
        tool = tools[cfg.tool]
    elif ":" in cfg.tool:
        tool = import_ref(cfg.tool, "reward.verify.tool")
        if not isinstance(tool, Tool):
            from rlfactory.tools.function import function_tool

            tool = function_tool(tool)
    else:
        raise ValueError(f"reward.verify.tool {cfg.tool!r} is not one of the env's tools ({', '.join(sorted(tools)) or 'none'}) "
                         "nor a module:attr")
    make = (import_ref(cfg.arguments, "reward.verify.arguments", "function") if cfg.arguments
            else artifact_arguments(cfg.argument, answer_extractor(cfg.artifact, "reward.verify.artifact")))
    if cfg.compare in ("rows", "ordered_rows"):
        compare = same_rows(cfg.expected_key or "expected_rows", ordered=cfg.compare == "ordered_rows")
    elif cfg.compare == "output":
        compare = same_output(cfg.expected_key or "expected_output")
    elif ":" in cfg.compare:
        compare = import_ref(cfg.compare, "reward.verify.compare", "function")
    else:
        raise ValueError(f"reward.verify.compare {cfg.compare!r}: use rows, ordered_rows, output or module:function")
    return VerifyReward(tool, make, compare)
