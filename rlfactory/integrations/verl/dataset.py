"""An rlfactory env's rows as a verl dataset (parquet), for the rlfactory agent loop.

    python -m rlfactory.integrations.verl.dataset examples/verl/calculator.yaml --split train \\
        --out data/calculator_train.parquet

Each env row becomes one verl row with the columns verl's RLHFDataset and reward functions read:
  prompt         the env's opening messages (env.reset; verl filters prompts by their length and
                 logs them; the agent loop renders its own prompt, with the tools, from the row)
  agent_name     which agent loop runs the row (default `rlfactory`)
  data_source    `rlfactory/<env name>`
  reward_model   {"style": "rule", "ground_truth": the row's answer column, as text}
  extra_info     {"index": i, "split": split, "id": the row's id}
  rlfactory_row  the env's row itself, as JSON (the agent loop hands it to env.reset unchanged)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rlfactory.envs.registry import env_from_config
from rlfactory.integrations.verl.config import VerlAgentConfig, load_verl_agent_config
from rlfactory.integrations.verl.rollout import ROW_COLUMN, plain


def verl_rows(cfg: VerlAgentConfig, split: str, *, agent_name: str = "rlfactory", answer_key: str = "answer",
              limit: int | None = None) -> list[dict[str, Any]]:
    """The rows of the env's `split` in verl's dataset layout (see the module doc)."""
    env = env_from_config(cfg.env, family=cfg.family)
    try:
        rows = env.load_split(split)[:limit]
        out = []
        for i, row in enumerate(rows):
            row = plain(dict(row))
            messages = [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in env.reset(row)]
            out.append({
                "data_source": f"rlfactory/{getattr(env, 'name', cfg.env.name)}",
                "prompt": messages,
                "agent_name": agent_name,
                "reward_model": {"style": "rule", "ground_truth": str(row.get(answer_key, ""))},
                "extra_info": {"index": i, "split": split, "id": str(row.get("id", i))},
                ROW_COLUMN: json.dumps(row, ensure_ascii=False),
            })
        return out
    finally:
        env.close()


def write_parquet(rows: list[dict[str, Any]], path: str | Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), str(path))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlfactory.integrations.verl.dataset",
                                description="Write an rlfactory env's rows as a verl parquet dataset.")
    p.add_argument("config", help="the agent loop's rlfactory YAML (VerlAgentConfig)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. env.options.system=...")
    p.add_argument("--split", default="train")
    p.add_argument("--out", required=True, help="the parquet file to write")
    p.add_argument("--agent-name", default="rlfactory", help="the agent_name column (the agent loop YAML's name)")
    p.add_argument("--answer-key", default="answer", help="the row column copied to reward_model.ground_truth")
    p.add_argument("--limit", type=int, default=None)
    args = p.parse_args(argv)
    try:
        cfg = load_verl_agent_config(args.config, args.overrides)
        rows = verl_rows(cfg, args.split, agent_name=args.agent_name, answer_key=args.answer_key, limit=args.limit)
    except (ValueError, FileNotFoundError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_parquet(rows, args.out)
    print(f"wrote {len(rows)} rows of split {args.split!r} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
