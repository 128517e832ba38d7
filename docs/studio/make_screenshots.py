"""Screenshots of the studio for the README, taken in headless Chromium on real runs.

    .venv/bin/python docs/studio/make_screenshots.py [--run RUN_DIR]     # writes docs/studio/*.png

Two short tiny-model runs (different learning rates) are trained for the runs page; `--run` names
a finished run of your own (the README's come from the SmolLM2 calculator experiment's GRPO run,
runs/smollm2_calculator/grpo) for the metrics and trajectory pages; without it those pages show
the first tiny run.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent
TOKEN = "screenshot-token-0123456789"
CALC = ["examples/rollout_calculator.yaml", "reward.terms={numeric: 1.0, format: 0.1}", "algo.group_size=4",
        "trainer.prompts_per_step=2", "rollout.max_new_tokens=24", "rollout.max_total_tokens=1024", "trainer.progress=false",
        "trainer.save_every=0", "trainer.lr=1e-3", "trainer.eval_every=4", "trainer.eval_limit=4"]


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--run", default=None, help="a finished run folder for the metrics and trajectory pages")
    args = ap.parse_args()
    runs = Path(tempfile.mkdtemp(prefix="studio-shots-")) / "runs"
    shown, step = "calculator-lr1e-3", 12
    env = dict(os.environ, PYTHONPATH=str(ROOT / "examples"))
    for name, steps in (("calculator-lr1e-3", 12), ("calculator-lr1e-4", 8)):
        extra = ["trainer.lr=1e-4"] if name.endswith("1e-4") else []
        subprocess.run([sys.executable, "-m", "rlfactory.cli.main", "train", *CALC, *extra, f"trainer.steps={steps}",
                        f"trainer.run_dir={runs / name}"], cwd=ROOT, env=env, check=True, capture_output=True)
    if args.run:
        shown = "smollm2-calculator-grpo"
        shutil.copytree(Path(args.run), runs / shown, ignore=shutil.ignore_patterns("checkpoints"))
        step = max(int(p.stem.split("_")[1]) for p in (runs / shown / "trajectories").glob("step_*.jsonl"))
    proc = subprocess.Popen([sys.executable, "-m", "rlfactory.cli.main", "ui", "--runs", str(runs), "--port", "0", "--token", TOKEN],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    url = next(m.group(1) for line in proc.stdout if (m := re.search(r"open (http://\S+)/\?token=", line)))
    from playwright.sync_api import sync_playwright

    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox", "--disable-gpu"])
            pg = b.new_page(viewport={"width": 1400, "height": 860}, device_scale_factor=1)
            pg.goto(f"{url}/?token={TOKEN}")
            pg.wait_for_selector("#runs-table")
            pg.check("tr[data-run='calculator-lr1e-3'] input")
            pg.check("tr[data-run='calculator-lr1e-4'] input")
            pg.select_option("#compare-key", "policy/entropy")
            pg.click("#compare")
            pg.wait_for_function("Number(document.querySelector('#compare-box .chart').dataset.points) >= 8", timeout=60000)
            time.sleep(0.5)
            pg.screenshot(path=str(OUT / "runs.png"))
            pg.goto(f"{url}/#/run/{shown}")
            pg.wait_for_selector(".chart[data-title='Reward']")
            time.sleep(0.8)
            pg.screenshot(path=str(OUT / "metrics.png"))
            pg.goto(f"{url}/#/run/{shown}?tab=traj&step={step}&i=0")
            pg.wait_for_selector("#segments .seg.model .tok.m")
            pg.select_option("#color-by", "lp")
            pg.hover("#segments .seg.model .tok.m >> nth=6")
            pg.evaluate("window.scrollTo(0, 0)")
            time.sleep(0.3)
            pg.screenshot(path=str(OUT / "trajectory.png"))
            pg.goto(f"{url}/#/new")
            pg.select_option("#source", label="examples/rollout_calculator.yaml")
            pg.wait_for_function("document.querySelector('#yaml').value.includes('rollout_calculator')")
            pg.fill("#overrides", "trainer.steps=20\nalgo.group_size=0\ntrainer.lrr=1e-4")
            pg.wait_for_selector("#config-errors")
            time.sleep(0.3)
            pg.screenshot(path=str(OUT / "new_run.png"))
            pg.goto(f"{url}/#/playground")
            pg.select_option("#pg-config", label="examples/mcp_tools.json")
            pg.fill("#pg-question", "What is 6*7?")
            pg.fill("#pg-answer", "42")
            pg.click("summary:has-text('scripted turns')")
            pg.fill("#pg-script", '<tool_call>\n{"name": "evaluate", "arguments": {"expression": "6*7"}}\n</tool_call>\n---\n<answer>42</answer>')
            pg.click("#pg-run")
            pg.wait_for_selector("#pg-done", timeout=120000)
            time.sleep(0.3)
            pg.screenshot(path=str(OUT / "playground.png"))
            b.close()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
        shutil.rmtree(runs.parent, ignore_errors=True)
    print("wrote", ", ".join(sorted(p.name for p in OUT.glob("*.png"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
