"""A GRPO step's rollout with each group's prompt prefilled once against the batch's common prefix only.

Workload: `examples/smollm2_bfcl.yaml` (SmolLM2-135M-Instruct, the offline GGUF), 4 BFCL training
prompts (rows 100-103 of the train split, 524-564 tokens: each lists its own functions) x 8 samples,
as one GRPO step of that config rolls them out (the local generator, temperature 1, one turn). Modes,
alternated in each repeat on the same loaded model:

- `groups`: today's prefill (generation/prefill.py `_share_groups`): the batch's common prefix once,
  then each group's own prompt once on top of it.
- `common`: the prefill before it: only the prefix common to all 32 rows is shared (55 tokens of
  the system prompt), so every sample prefills its prompt's remaining ~470-510 tokens.

    .venv/bin/python benchmarks/group_prefill.py [--repeats 3] [--new-tokens 16,64]

Prints, per mode and --new-tokens, the median wall time of the rollout over the repeats with its
range, the prefilled and shared token counts, generated tokens, and the ratio common / groups of the
medians. The gain comes from prefill compute (a CPU forward costs its tokens): it is largest when
prompts are long and answers short, and shrinks as decode grows (--new-tokens), with fewer samples per
prompt, or on an accelerator where a prefill forward costs its launches more than its tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch

from rlfactory.config import RunConfig
from rlfactory.config.base import load_config
from rlfactory.generation.prefill import Prefill
from rlfactory.train.session import open_rollout


async def rollout_once(session, rows, group_size: int) -> dict[str, float]:
    stats = session.generator.stats
    for k in stats:
        stats[k] = 0
    t = time.perf_counter()
    trajs = await session.engine.run(rows, group_size)
    wall = time.perf_counter() - t
    generated = sum(len(s.token_ids) for tr in trajs for s in tr.segments if s.role == "model")
    prompts = sorted({len(s.token_ids) for tr in trajs for s in tr.segments if s.role == "prompt"})
    return {"wall": wall, "prefill": stats["prefill_tokens"], "shared": stats["shared_prefix_tokens"],
            "generated": generated, "prompts": prompts}


async def main(args: argparse.Namespace) -> None:
    grouped = Prefill._share_groups
    modes = {"groups": grouped, "common": lambda *a: None}
    print(f"settings: torch threads {torch.get_num_threads()}, model smollm2:135m fp32 (CPU), "
          f"{args.prompts} prompts x {args.group} samples, temperature 1, repeats {args.repeats}")
    for new in args.new_tokens:
        cfg = load_config(RunConfig, "examples/smollm2_bfcl.yaml", [f"rollout.max_new_tokens={new}"])
        async with open_rollout(cfg, reward_mode="off") as session:
            rows = session.env.load_split("train")[100:100 + args.prompts]
            await rollout_once(session, rows[:1], 2)  # warm-up: first forwards, allocator
            runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
            for _ in range(args.repeats):
                for mode, fn in modes.items():
                    Prefill._share_groups = fn
                    runs[mode].append(await rollout_once(session, rows, args.group))
            Prefill._share_groups = grouped
        print(f"\nmax_new_tokens {new}, prompt tokens {runs['groups'][0]['prompts']}")
        print(f"{'mode':8s} {'median s':>9s} {'range s':>15s} {'prefilled':>10s} {'shared':>8s} {'generated':>10s}")
        med = {}
        for mode, rs in runs.items():
            walls = [r["wall"] for r in rs]
            med[mode] = statistics.median(walls)
            print(f"{mode:8s} {med[mode]:9.2f} {min(walls):7.2f}-{max(walls):<7.2f} "
                  f"{statistics.median(r['prefill'] for r in rs):10.0f} {statistics.median(r['shared'] for r in rs):8.0f} "
                  f"{statistics.median(r['generated'] for r in rs):10.0f}")
        print(f"rollout wall time, common / groups (medians): {med['common'] / med['groups']:.2f}x")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--new-tokens", type=lambda s: [int(x) for x in s.split(",")], default=[16, 64])
    asyncio.run(main(p.parse_args()))
