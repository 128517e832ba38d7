"""Pure algorithm pieces (torch only): advantages, policy/value losses, KL, entropy, masked ops.

Registries: `get_advantage(name)` ("grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline" /
"reinforce++", "gae"; per turn: "turn_grpo", "gigpo", "turn_loo") and `get_policy_loss(name)` ("ppo" / "vanilla" / "ppo_clip", "gspo"). Add
your own with `@register_advantage("name")` / `@register_policy_loss("name")`; a config names
them (`algo.advantage`, `algo.loss`) by that name once their module is imported, or as
`module:function`, which imports it.
"""

from rlfactory.algos.advantages import (
    advantage_kind,
    dr_grpo_advantages,
    dynamic_sampling_filter,
    gae_advantages,
    get_advantage,
    grpo_advantages,
    list_advantages,
    outcome_to_token_rewards,
    register_advantage,
    reinforce_pp_baseline_advantages,
    resolve_advantage,
    rloo_advantages,
)
from rlfactory.algos.losses import (
    entropy_bonus,
    get_policy_loss,
    gspo_loss,
    kl_estimate,
    kl_loss,
    list_policy_losses,
    ppo_clip_loss,
    register_policy_loss,
    resolve_policy_loss,
    truncated_is_weights,
    value_loss,
)
from rlfactory.algos.turns import (
    gigpo_advantages,
    turn_grpo_advantages,
    turn_loo_advantages,
    turn_returns,
    turn_token_advantages,
)
from rlfactory.algos.utils import (
    agg_loss,
    entropy_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    token_logprobs,
)

__all__ = [
    "advantage_kind",
    "agg_loss",
    "dr_grpo_advantages",
    "dynamic_sampling_filter",
    "entropy_bonus",
    "entropy_from_logits",
    "gae_advantages",
    "get_advantage",
    "get_policy_loss",
    "gigpo_advantages",
    "grpo_advantages",
    "gspo_loss",
    "kl_estimate",
    "kl_loss",
    "list_advantages",
    "list_policy_losses",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "outcome_to_token_rewards",
    "ppo_clip_loss",
    "register_advantage",
    "register_policy_loss",
    "reinforce_pp_baseline_advantages",
    "resolve_advantage",
    "resolve_policy_loss",
    "rloo_advantages",
    "token_logprobs",
    "truncated_is_weights",
    "turn_grpo_advantages",
    "turn_loo_advantages",
    "turn_returns",
    "turn_token_advantages",
    "value_loss",
]
