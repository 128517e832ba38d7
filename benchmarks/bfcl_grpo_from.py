"""Issue 30: the last two phases of `rlfactory experiment examples/smollm2_bfcl.yaml` from a warm start made
before (its SFT is deterministic, so a rerun that changes only GRPO settings can reuse it): GRPO from WARM, then
the held-out evaluation, written as OUT/eval_after_GRPO.json beside the warm start's own evaluations for
benchmarks/bfcl_stages.py OUT.

    .venv/bin/python benchmarks/bfcl_grpo_from.py WARM_MODEL OUT [KEY=VALUE ...]
"""
import asyncio
import json
import sys
import time
from pathlib import Path

from rlfactory.cli.common import load_run_config, train_from
from rlfactory.cli.eval import evaluate_model
from rlfactory.cli.experiment import summarize
from rlfactory.generation.heap import give_back_freed_memory


async def main(warm: str, out: Path, overrides: list[str]) -> None:
    cfg = load_run_config("examples/smollm2_bfcl.yaml", overrides)
    t = time.perf_counter()
    history, trained = await train_from(cfg, warm, out / "grpo")
    give_back_freed_memory()
    print(f"[grpo] {time.perf_counter() - t:.0f}s, {len(history)} steps", file=sys.stderr, flush=True)
    t = time.perf_counter()
    report = await evaluate_model(cfg.model_copy(deep=True), trained, "test", limit=None)
    (out / "eval_after_GRPO.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    s = summarize(report)
    print(f"[experiment] after GRPO: held-out accuracy {s['accuracy']:.3f}, tool-call rate "
          f"{s['tool_call_rate']:.3f} ({time.perf_counter() - t:.0f}s)", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), sys.argv[3:]))
