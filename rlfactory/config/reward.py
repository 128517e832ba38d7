"""Config section `reward:` (read by the rewards). Built into a `Reward` by `build_reward`.

Example:

    reward:
      terms: {exact_match: 1.0, format: 0.2, extra_calls: 0.05}
      options: {extra_calls: {budget: 2}}
      judge: {backend: openai, base_url: http://127.0.0.1:8000/v1, model: judge, weight: 0.5}

An empty section means the env's own reward.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_validator

from rlfactory.config.base import ExistingFile, Section


class JudgeConfig(Section):
    """A model-as-judge reward (`rlfactory.rewards.judge.JudgeReward`)."""

    backend: Literal["openai", "local"] = "openai"
    """openai: an OpenAI-compatible chat-completions endpoint (vLLM, SGLang, OpenAI);
    local: a transformers checkpoint folder loaded in this process."""
    base_url: str = "http://127.0.0.1:8000/v1"
    """openai: the endpoint's base URL (requests go to {base_url}/chat/completions)."""
    model: str = ""
    """openai: the served model name; local: path to a Hugging Face checkpoint folder."""
    api_key_env: str | None = "OPENAI_API_KEY"
    """openai: name of the environment variable holding the API key (keys never go in configs)."""
    template: str | None = None
    """Prompt template with {question}, {answer}, {reference}, {completion}; unset = a yes/no
    correctness prompt (rlfactory.rewards.judge.DEFAULT_TEMPLATE). Double literal braces."""
    template_file: ExistingFile | None = None
    """A file holding the template (instead of `template`)."""
    system: str | None = None
    """Optional system message for the judge."""
    score: Literal["yes_no", "number"] = "yes_no"
    """How the reply becomes a score: yes_no (first yes/no word: 1/0) or number (first number
    matching `score_regex`, divided by `max_score`, clamped to [0, 1])."""
    score_regex: str = r"(-?\d+(?:\.\d+)?)"
    """number: the regex whose group 1 (or whole match) is the number."""
    max_score: float = 10.0
    """number: the judge's top score (the parsed number is divided by it)."""
    fallback: float = 0.0
    """Score given when the reply cannot be parsed (the `parsed` term is then 0)."""
    on_error: Literal["raise", "fallback"] = "raise"
    """When the judge cannot be reached: raise (the trainer treats it as an infra error) or
    give `fallback`."""
    answer: str = "tag:answer"
    """How the model's answer is found for the template (same forms as `reward.answer`)."""
    temperature: float = 0.0
    """Judge sampling temperature (openai backend; the local judge decodes greedily)."""
    max_tokens: int = 64
    """Longest judge reply, in tokens."""
    timeout_s: float = 60.0
    """openai: per-request timeout in seconds."""
    retries: int = 2
    """openai: retries on connection errors, 429 and 5xx."""
    max_concurrency: int = 8
    """openai: requests in flight at once."""
    batch_size: int = 8
    """Prompts per judge call (local: per `generate` batch)."""
    weight: float = 1.0
    """Weight of the judge's score in the total reward."""

    @model_validator(mode="after")
    def _check(self) -> "JudgeConfig":
        if not self.model:
            raise ValueError("reward.judge.model is required (served model name, or a local checkpoint path)")
        if self.template is not None and self.template_file is not None:
            raise ValueError("give reward.judge.template or reward.judge.template_file, not both")
        return self


class VerifyConfig(Section):
    """A tool-verified reward (`rlfactory.rewards.verify.VerifyReward`)."""

    tool: str
    """The verification tool: the name of one of the env's tools, or `module:attr` naming a
    Tool object or a function (turned into a tool with rlfactory.tools.function.function_tool)."""
    argument: str = "query"
    """The tool argument that receives the model's artifact."""
    artifact: str = "tag:answer"
    """How the artifact is found in the model's text: tag:NAME, code, code:LANG (last fenced
    block), boxed, last_turn, or module:function(trajectory) -> str | None."""
    arguments: str | None = None
    """Instead of argument/artifact: `module:function(trajectory) -> dict | None` building the
    tool's arguments."""
    compare: str = "rows"
    """rows (same result set, order-insensitive), ordered_rows, output (same printed output),
    or `module:function(result, trajectory) -> float`."""
    expected_key: str | None = None
    """The dataset-row field holding the expected result; unset = expected_rows for rows
    comparisons and expected_output for output."""
    weight: float = 1.0
    """Weight of the verification score in the total reward."""


class RewardConfig(Section):
    """The reward: rule terms and/or a judge and/or a tool verification, summed by weights."""

    terms: dict[str, float] = {}
    """Weight per rule term: a built-in (format, exact_match, substring_match, f1, numeric,
    extra_calls, extra_turns, tool_errors), one registered with @reward_term, or
    `module:function`. Empty (with no judge and no verify) means the env's default reward."""
    options: dict[str, Any] = {}
    """Per-term keyword options, by term name, e.g. {extra_calls: {budget: 2}}."""
    answer: str = "tag:answer"
    """How the final answer is extracted for the rule terms: tag:NAME (last <NAME>...</NAME>),
    boxed (last \\boxed{}), last_turn (last model turn without <think>), code / code:LANG, or
    module:function(trajectory) -> str | None."""
    judge: JudgeConfig | None = None
    """A model-as-judge part (see its fields)."""
    verify: VerifyConfig | None = None
    """A tool-verification part (see its fields)."""
    default_weight: float | None = None
    """When set and other parts are configured, the env's default reward is added with this weight."""
    turn_terms: dict[str, float] = {}
    """Process rewards: weight per turn term, which scores each model turn (not the outcome): a
    built-in (tool_success, retrieval_hit, code_ran, sql_ran), one registered with
    @rlfactory.rewards.turns.turn_term, or `module:function(trajectory, turn) -> float | None`.
    Recorded on each model segment; only turn-level advantages (algo.advantage: turn_grpo,
    gigpo, turn_loo) train on them. Env step rewards and tool scores (ToolResult.reward) are
    recorded as the term `step` without being listed here."""
    turn_options: dict[str, Any] = {}
    """Per-turn-term keyword options, by term name, e.g. {retrieval_hit: {tool: search}}."""
    turn_judge: JudgeConfig | None = None
    """A model judge that scores each turn in context (the turn term `judge`, times its weight);
    its template fields are {question}, {reference}, {context}, {turn}, {observation}
    (default: rlfactory.rewards.turns.DEFAULT_TURN_TEMPLATE)."""
