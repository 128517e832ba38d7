"""SFT steps in passes of similar length (sft.group_by_length, the default) against one padded pass.

Workload: the demo's warm start (`examples/demo.yaml`: tiny:1m, the search env's solver
demonstrations, batches of 32; a guess is ~60 tokens, a two-search demonstration ~180). Modes,
alternated in each repeat, each from the same initial weights and on the same batches:

- `by_length`: each step's 32 demonstrations in passes of similar length (rlfactory/passes.py
  `plan_micro_batches`), gradients summed;
- `one_pass`: the step before it: all 32 padded to the longest.

    .venv/bin/python benchmarks/sft_passes.py [--demos 1024] [--steps 40] [--repeats 3]

Prints per mode the median seconds per step over the repeats with their range, the padded token
positions per step, both for full-text steps (the demo's first 600: every token is learned) and
model-token steps, the ratio one_pass / by_length of the medians, and the losses of the last step
of both modes (they must agree: the two make the same update). The gain comes from padded
positions not computed: it grows with the spread of lengths in a batch (a guess beside a
multi-search demonstration) and with the forward's cost per token; each extra pass costs its
fixed overhead (PASS_OVERHEAD_TOKENS in the plan), so batches of one length gain nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch


async def demos_of(cfg, n: int):
    from rlfactory.train.session import open_rollout
    from rlfactory.train.sft import write_demonstrations

    async with open_rollout(cfg, reward_mode="off") as session:
        demos = write_demonstrations(session.env, session.tool_manager, session.runner.specs(), n, cfg.env.name)
        from rlfactory.train.session import pad_id_of

        return demos, pad_id_of(session.tokenizer, session.model), cfg.model.path


def run_mode(path: str, demos, pad_id: int, steps: int, full_text: bool, by_length: bool) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    from rlfactory.config import SftConfig
    from rlfactory.tiny import resolve_model
    from rlfactory.train.batch import collate
    from rlfactory.train.sft import full_text_view, sft_passes, sft_train

    model = AutoModelForCausalLM.from_pretrained(resolve_model(path))
    cfg = SftConfig(steps=steps, batch_size=32, lr=3e-3, full_text_steps=steps if full_text else 0,
                    seed=0, group_by_length=by_length)
    # the padded positions the steps compute, from the same batches sft_train draws
    from rlfactory.train.data import step_generator

    positions = 0
    for step in range(steps):
        idx = torch.randint(len(demos), (32,), generator=step_generator(0, step, "sft")).tolist()
        batch = collate([full_text_view(demos[i]) if full_text else demos[i] for i in idx], pad_id)
        positions += sum(p.completion_ids.numel() + p.prompt_ids.numel() for p in sft_passes(batch, cfg))
    t = time.perf_counter()
    history = sft_train(model, demos, pad_id, cfg)
    wall = time.perf_counter() - t
    return {"s_per_step": wall / steps, "positions": positions / steps, "last_loss": history[-1]["loss"]}


def main() -> None:
    from rlfactory.config import RunConfig
    from rlfactory.config.base import load_config

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--demos", type=int, default=1024)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    cfg = load_config(RunConfig, "examples/demo.yaml", [])
    demos, pad_id, path = asyncio.run(demos_of(cfg, args.demos))
    lengths = sorted(len(d.input_ids) for d in demos)
    print(f"settings: torch threads {torch.get_num_threads()}, model {path} fp32 (CPU), {len(demos)} demonstrations "
          f"(tokens: min {lengths[0]}, median {lengths[len(lengths) // 2]}, max {lengths[-1]}), batch 32, "
          f"{args.steps} steps a run, repeats {args.repeats}")
    for full_text in (True, False):
        runs: dict[str, list[dict[str, float]]] = {"by_length": [], "one_pass": []}
        for _ in range(args.repeats):
            for mode in runs:
                runs[mode].append(run_mode(path, demos, pad_id, args.steps, full_text, mode == "by_length"))
        kind = "full-text steps" if full_text else "model-token steps"
        med = {}
        for mode, rs in runs.items():
            s = [r["s_per_step"] for r in rs]
            med[mode] = statistics.median(s)
            print(f"  {kind:18s} {mode:10s} {med[mode]:.3f} s/step (range {min(s):.3f}-{max(s):.3f}), "
                  f"{rs[0]['positions']:,.0f} padded positions a step, last loss {rs[0]['last_loss']:.4f}")
        print(f"  {kind}: one_pass / by_length = {med['one_pass'] / med['by_length']:.2f}x "
              f"(positions {runs['one_pass'][0]['positions'] / runs['by_length'][0]['positions']:.2f}x)")


if __name__ == "__main__":
    main()
