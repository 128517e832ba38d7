"""A whole env in one small file: a typed Python tool, a dataset, a reward.

    rlfactory rollout examples/custom_env/capitals.yaml --n 2 --out runs/capitals.jsonl
    rlfactory train examples/custom_env/capitals.yaml

The model is asked for a country's capital and may look it up with the `lookup_capital` tool.
"""

from __future__ import annotations

from typing import Any

from rlfactory.envs import Env, EnvTools, register_env
from rlfactory.rewards import RuleReward, reward_term
from rlfactory.trajectory import Trajectory

CAPITALS = {"Norway": "Oslo", "Peru": "Lima", "Kenya": "Nairobi", "Japan": "Tokyo", "Chile": "Santiago",
            "Egypt": "Cairo", "Canada": "Ottawa", "Nepal": "Kathmandu"}


async def lookup_capital(country: str) -> str:
    """Look up the capital city of a country.

    Args:
        country: The country's name in English, e.g. "France".
    """
    capital = CAPITALS.get(country.strip().title())
    if capital is None:
        raise ValueError(f"unknown country: {country!r}")  # becomes an error observation, not a crash
    return capital


@reward_term("capitals/short_answer")
def short_answer(trajectory: Trajectory, answer: str | None = None) -> float:
    """1.0 when the answer is a single word (a rule term of our own, next to the built-in ones)."""
    return float(answer is not None and len(answer.split()) == 1)


@register_env("capitals")
class CapitalsEnv(Env):
    name = "capitals"
    max_turns = 3

    def load_split(self, split: str) -> list[dict[str, Any]]:
        countries = sorted(CAPITALS)
        chosen = countries[:6] if split == "train" else countries[6:]
        return [{"id": c, "question": f"What is the capital of {c}?", "answer": CAPITALS[c]} for c in chosen]

    def reset(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "system", "content": "Use lookup_capital, then answer as <answer>city</answer>."},
                {"role": "user", "content": row["question"]}]

    def tools(self) -> EnvTools:
        return EnvTools(python=[lookup_capital])

    def reward(self) -> RuleReward:
        return RuleReward({"exact_match": 1.0, "format": 0.1, "capitals/short_answer": 0.1})

    def solve(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """A demonstration for `rlfactory sft`."""
        capital = CAPITALS[row["id"]]
        return [*self.reset(row),
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "lookup_capital", "arguments": {"country": row["id"]}}}]},
                {"role": "tool", "content": capital},
                {"role": "assistant", "content": f"<answer>{capital}</answer>"}]
