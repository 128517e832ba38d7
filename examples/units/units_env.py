"""An env of your own, end to end: unit conversion through a third-party-looking MCP server.

    rlfactory rollout examples/units/units.yaml --n 2 --out runs/units.jsonl

A question such as "How many minutes are in 37 hours?" is answered by calling
`convert(value=37, from_unit="hours", to_unit="minutes")` (units_server.py, started from mcp.json)
and copying the number it returns into `<answer>2220</answer>`. The arguments must be copied from
the question: the held-out split asks about amounts that no training question uses, so they can
only be copied, not memorised. Rows are generated from `seed`, the same every time.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from rlfactory.envs import Env, EnvTools, register_env
from rlfactory.rewards import RuleReward

from unitconv import UNITS, convert_text, convert_value, number_text, plural

HERE = Path(__file__).resolve().parent
SYSTEM = "Use the convert tool, then answer with the number as <answer>number</answer>."
# (larger unit, smaller unit): the questions' pairs, each of whole ratio, so that every answer is an integer
PAIRS = [("minute", "second"), ("hour", "minute"), ("hour", "second"), ("day", "hour"), ("day", "minute"),
         ("week", "day"), ("week", "hour"), ("kilometer", "meter"), ("meter", "centimeter"),
         ("meter", "millimeter"), ("centimeter", "millimeter"), ("foot", "inch"), ("yard", "foot"),
         ("yard", "inch"), ("mile", "yard"), ("mile", "foot"), ("kilogram", "gram"), ("tonne", "kilogram"),
         ("pound", "ounce"), ("liter", "milliliter")]
QUESTIONS = ["Convert {v} {a} to {b}.", "How many {b} are in {v} {a}?", "What is {v} {a} in {b}?",
             "{v} {a} is how many {b}?"]


def make_rows(seed: int, n_train: int, n_test: int) -> dict[str, list[dict[str, Any]]]:
    """The train and test rows. Amounts 2..999 are split once: a test question's amount (or, for a
    question from the smaller unit to the larger, its multiplier) never occurs in a train question."""
    rng = random.Random(seed)
    amounts = list(range(2, 1000))
    rng.shuffle(amounts)
    held_out = amounts[: len(amounts) // 5]
    pools = {"test": held_out, "train": amounts[len(held_out):]}
    splits: dict[str, list[dict[str, Any]]] = {}
    for split, n in (("train", n_train), ("test", n_test)):
        rows = []
        for i in range(n):
            big, small = rng.choice(PAIRS)
            k = rng.choice(pools[split])
            ratio = int(UNITS[big][1] / UNITS[small][1])
            # one question in four goes from the smaller unit up (when its amount stays under 100,000)
            if rng.random() < 0.25 and k * ratio < 100_000:
                value, a, b = k * ratio, small, big
            else:
                value, a, b = k, big, small
            result = number_text(convert_value(value, a, b))
            question = rng.choice(QUESTIONS).format(v=value, a=plural(a), b=plural(b))
            rows.append({"id": f"{split}-{i:04d}", "question": question[0].upper() + question[1:],
                         "value": value, "from_unit": plural(a), "to_unit": plural(b),
                         "answer": [result, f"{result} {plural(b)}"]})
        splits[split] = rows
    return splits


@register_env("units")  # `env: {module: units_env, name: units}` in a config next to this file
class UnitsEnv(Env):
    name = "units"
    max_turns = 2  # one turn to call the tool, one to answer

    def __init__(self, seed: int = 0, n_train: int = 300, n_test: int = 100) -> None:
        self.rows = make_rows(seed, n_train, n_test)

    def load_split(self, split: str) -> list[dict[str, Any]]:
        if split not in self.rows:
            raise ValueError(f"env 'units' has splits train and test, not {split!r}")
        return self.rows[split]

    def reset(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": row["question"]}]

    def tools(self) -> EnvTools:
        return EnvTools(mcp=HERE / "mcp.json")  # the server runs in this folder, wherever the command runs

    def reward(self) -> RuleReward:
        # exact_match compares the <answer> with the row's `answer` list; format pays for a parsed answer
        return RuleReward({"exact_match": 1.0, "format": 0.1})

    def solve(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """A demonstration: the call with the arguments copied from the question, the server's
        own text for it (the same function the server runs), and the number it gave."""
        args = {"value": row["value"], "from_unit": row["from_unit"], "to_unit": row["to_unit"]}
        return [*self.reset(row),
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "convert", "arguments": args}}]},
                {"role": "tool", "content": convert_text(**args)},
                {"role": "assistant", "content": f"<answer>{row['answer'][0]}</answer>"}]
