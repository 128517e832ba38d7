"""A custom env with a search tool over a corpus of its own (corpus.jsonl next to this file).

    rlfactory rollout examples/wiki/wiki.yaml --n 2 --out runs/wiki.jsonl       # search as a Python tool
    rlfactory rollout examples/wiki/wiki_mcp.yaml --n 2 --out runs/wiki_mcp.jsonl  # the same tool over MCP

The contract, in order: `load_split` gives rows (dicts; `question` and `answer` here, the answer a
string or a list of acceptable strings), `reset` turns a row into the opening messages, `tools`
names the tools, `reward` scores a trajectory, and `solve` writes a demonstration for
`rlfactory sft`. Options from `env.options` arrive in `self.options` (this class keeps Env's
constructor); `max_turns` among them is the env's turn limit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlfactory.envs import Env, EnvTools, register_env
from rlfactory.envs.search.bm25 import BM25Corpus
from rlfactory.rewards import RuleReward

HERE = Path(__file__).resolve().parent
CORPUS = BM25Corpus.from_jsonl(HERE / "corpus.jsonl")
TOPK = 2
SYSTEM = ("Answer the question. You may call the search tool first; then give the answer as "
          "<answer>...</answer>.")


@register_env("wiki")  # `env: {module: wiki, name: wiki}` in a config next to this file
class WikiEnv(Env):
    name = "wiki"
    max_turns = 3

    def load_split(self, split: str) -> list[dict[str, Any]]:
        rows = [json.loads(line) for line in open(HERE / "questions.jsonl", encoding="utf-8")]
        return [row for row in rows if row["split"] == split]

    def reset(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": row["question"]}]

    def tools(self) -> EnvTools:
        # `env.options.python_tool: false` leaves the search to the config's `tools.mcp` (wiki_mcp.yaml).
        if not self.options.get("python_tool", True):
            return EnvTools()
        return EnvTools(python=[CORPUS.as_tool(topk=TOPK)])

    def reward(self) -> RuleReward:
        # exact_match reads the row's `answer` (a string or a list): Trajectory.info holds the row.
        return RuleReward({"exact_match": 1.0, "format": 0.1})

    def solve(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """A demonstration: the opening messages, an assistant turn with a tool call, the tool's
        real result, and the final answer (chat messages, as a chat template takes them)."""
        found = CORPUS.search_text(row["question"], TOPK)
        return [*self.reset(row),
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "search", "arguments": {"query": row["question"]}}}]},
                {"role": "tool", "content": found},
                {"role": "assistant", "content": f"<answer>{row['answer'][0]}</answer>"}]
