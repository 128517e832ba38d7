"""Does the visual demo's warm start learn to read? (issue 31) Runs `rlfactory sft`'s training on
the visual env's solver demonstrations and, every `--every` steps, the teacher-forced reading
measure of benchmarks/visual_reading.py on 100 training and 100 held-out pictures: P(zoom), and how
often the model's most likely digit after the solver's zoom is the right one (chance 10%).

It shows why the demo draws a code and not a digit: with every demonstration zooming, a drawn digit
(`ink: checker`) stays at chance, while the code ink is read.
Learning, not speed: the machine's load does not change its figures (one seed each).

Run:  .venv/bin/python benchmarks/visual_reading_curve.py [--config examples/visual_demo.yaml]
      [--every 100] [env.options.ink=checker sft.steps=600 ...]   (dotted overrides)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


async def curve(config: str, overrides: list[str], every: int) -> None:
    from rlfactory.cli.common import load_run_config
    from rlfactory.envs.visual import VisualEnv
    from rlfactory.train.prepare import command_checks
    from rlfactory.train.session import open_rollout, pad_id_of
    from rlfactory.train.sft import sft_train, write_demonstrations
    from visual_reading import read

    cfg = load_run_config(config, overrides)
    checks = command_checks("sft", cfg)
    async with open_rollout(cfg, reward_mode=checks.reward_mode, check_splits=checks.check_splits) as s:
        specs = s.runner.specs()
        demos = write_demonstrations(s.env, s.tool_manager, specs, cfg.sft.demos, cfg.env.name)
        options = {k: v for k, v in cfg.env.options.items() if k != "family"}
        reader = VisualEnv(**{**options, "guess_rate": 0.0})  # every picture's demonstration zooms
        train, test = reader.load_split("train")[:100], reader.load_split("test")[:100]
        o = cfg.env.options
        print(f"# {len(demos)} demonstrations (mean {sum(len(d.input_ids) for d in demos) / len(demos):.0f} tokens); "
              f"ink {o.get('ink')}, solver_zoom {o.get('solver_zoom')}, guess_rate {o.get('guess_rate', 0)}; "
              f"{cfg.sft.steps} steps of {cfg.sft.batch_size} at lr {cfg.sft.lr}")
        print(f"{'step':>6s}{'loss':>8s}{'P(zoom)':>9s}{'reads (train)':>15s}{'reads (held-out)':>18s}{'s':>6s}", flush=True)
        t0 = time.perf_counter()

        def log(row: dict) -> None:
            if row["step"] % every == 0 or row["step"] == cfg.sft.steps:
                s.model.eval()
                p_zoom, _, tr = read(s.model, s.tool_manager, reader, specs, train)
                _, _, te = read(s.model, s.tool_manager, reader, specs, test)
                s.model.train()
                print(f"{row['step']:6d}{row['loss']:8.3f}{p_zoom:9.2f}{tr * 100:14.0f}%{te * 100:17.0f}%"
                      f"{time.perf_counter() - t0:6.0f}", flush=True)

        sft_train(s.model, demos, pad_id_of(s.tokenizer, s.model), cfg.sft, log, pixels=s.tool_manager)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "visual_demo.yaml"))
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    print(f"$ .venv/bin/python benchmarks/visual_reading_curve.py --every {args.every} {' '.join(args.overrides)}")
    asyncio.run(curve(args.config, [*args.overrides, "sft.out=/tmp/visual_reading_curve"], args.every))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
