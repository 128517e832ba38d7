"""verl custom reward function for examples/verl (`custom_reward_function.path=examples/verl/calculator_reward.py`).

1.0 when the last number in the response equals the ground truth (the dataset's `answer`), else 0.0.
A trajectory the tool layer could not serve (`rlfactory_status: infra_error`, in `extra_info` for
verl's reward loop) is masked out of the loss by the agent loop whatever it scores here.
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    numbers = NUMBER.findall(solution_str or "")
    if not numbers:
        return 0.0
    try:
        return float(abs(float(numbers[-1]) - float(ground_truth)) < 1e-6)
    except ValueError:
        return 0.0
