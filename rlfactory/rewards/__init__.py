"""Rewards: `async score(trajectory) -> RewardScore(total, terms)`.

Rule terms (`@reward_term`, `RuleReward`), model judges (`JudgeReward` over `LocalJudge` or
`OpenAIJudge`), tool verification (`VerifyReward`), weighted composition (`ComposedReward`),
process rewards per model turn (`@turn_term`, `TurnRuleReward`, `JudgeTurnReward` beside the
outcome in `WithTurnRewards`), and `build_reward(cfg, default)` from the `reward:` config section.

An `infra_error` trajectory is never scored: rewards raise `UnscorableTrajectory` for one. The
trainer checks `is_scorable` (or calls `score_all`, which returns None for those) and leaves such
trajectories out of the group baseline and the loss.
"""

from rlfactory.rewards.base import (
    Reward,
    RewardScore,
    UnscorableTrajectory,
    is_scorable,
    require_scorable,
    score_all,
    score_many,
)
from rlfactory.rewards.build import build_reward
from rlfactory.rewards.compose import ComposedReward
from rlfactory.rewards.judge import (
    DEFAULT_TEMPLATE,
    Judge,
    JudgeError,
    JudgeReward,
    LocalJudge,
    OpenAIJudge,
    number_score,
    parse_yes_no,
)
from rlfactory.rewards.rule import FunctionReward, RuleReward, get_term, list_terms, reward_term
from rlfactory.rewards.text import (
    answer_extractor,
    boxed_answer,
    code_block,
    exact_match,
    last_turn_answer,
    normalize_answer,
    parse_number,
    question_of,
    references_of,
    substring_match,
    tagged_answer,
    token_f1,
)
from rlfactory.rewards.turns import JudgeTurnReward, Turn, TurnRuleReward, WithTurnRewards, turn_term
from rlfactory.rewards.verify import VerifyReward, artifact_arguments, rows_of, same_output, same_rows

__all__ = [
    "ComposedReward",
    "JudgeTurnReward",
    "DEFAULT_TEMPLATE",
    "FunctionReward",
    "Judge",
    "JudgeError",
    "JudgeReward",
    "LocalJudge",
    "OpenAIJudge",
    "Reward",
    "RewardScore",
    "RuleReward",
    "Turn",
    "TurnRuleReward",
    "UnscorableTrajectory",
    "VerifyReward",
    "WithTurnRewards",
    "answer_extractor",
    "artifact_arguments",
    "boxed_answer",
    "build_reward",
    "code_block",
    "exact_match",
    "get_term",
    "is_scorable",
    "last_turn_answer",
    "list_terms",
    "normalize_answer",
    "number_score",
    "parse_number",
    "parse_yes_no",
    "question_of",
    "references_of",
    "require_scorable",
    "reward_term",
    "rows_of",
    "same_output",
    "same_rows",
    "score_all",
    "score_many",
    "substring_match",
    "tagged_answer",
    "token_f1",
    "turn_term",
]
