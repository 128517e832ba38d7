"""What a visual-demo model does with held-out pictures, teacher-forced (issue 31): does it zoom,
and can it read the digit once zoomed?

For each held-out picture of the visual env (the config's options), one forward each of:
  the prompt            P(zoom) = the probability of the solver's zoom turn's first token
                        (`<tool_call>`) against answering at once; greedy decoding zooms only
                        where it is above one half;
  the solver's zoom     the prompt, zoom(...) and the tool message with the zoomed picture, then
  demonstration         `<answer>`: the model's distribution over the ten digit tokens there; its
                        argmax against the digit is the model's reading accuracy (chance 10%).
The same for training pictures (what SFT saw), so memorising shows as a gap.

Run:  .venv/bin/python benchmarks/visual_reading.py MODEL_FOLDER [--config examples/visual_demo.yaml]
      [--n 100] [env.options.size=32 ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


@torch.no_grad()
def read(model, tm, env, specs, rows) -> tuple[float, float, float]:
    """(mean P(zoom), share of rows whose P(zoom) > 0.5, reading accuracy) over `rows`."""
    from rlfactory.train.image_logprobs import rope_positions
    from rlfactory.train.sft import demo_to_trajectory

    digit_ids = [tm.tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    if any(i is None or i == tm.tokenizer.unk_token_id for i in digit_ids):
        raise SystemExit("visual_reading: the tokenizer has no single token for each digit")
    p_zoom, right = [], 0
    for row in rows:
        demo = demo_to_trajectory(env.solve(row), tm, specs, demo_id=str(row.get("id")))
        prompt, first = demo.segments[0], demo.segments[1]
        ids = demo.input_ids
        inputs = tm.model_inputs(ids, demo.images())
        logp = torch.log_softmax(model(**inputs, position_ids=rope_positions(model, inputs)).logits[0].float(), -1)
        p_zoom.append(float(logp[len(prompt.token_ids) - 1, first.token_ids[0]].exp()))
        # the last model turn is "<answer>D</answer>...": D's column follows the <answer> tokens
        last = demo.segments[-1]
        start = len(ids) - len(last.token_ids)
        at = next(k for k, t in enumerate(last.token_ids) if t in digit_ids)
        guess = int(logp[start + at - 1, digit_ids].argmax())
        right += guess == int(row["golden_answers"][0])
    n = max(1, len(rows))
    return sum(p_zoom) / n, sum(p > 0.5 for p in p_zoom) / n, right / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a saved VL model folder (e.g. a demo's sft/model) or a tiny-vl spec")
    ap.add_argument("--config", default=str(ROOT / "examples" / "visual_demo.yaml"))
    ap.add_argument("--n", type=int, default=100, help="pictures of each split")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT))
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from rlfactory.cli.common import load_run_config
    from rlfactory.envs.visual import VisualEnv
    from rlfactory.tiny.cache import resolve_model
    from rlfactory.tools.base import spec_of
    from rlfactory.tools.function import function_tool
    from rlfactory.train.session import tool_manager_for

    cfg = load_run_config(args.config, args.overrides)
    options = {**cfg.env.options, "guess_rate": 0.0}  # every row's solver demonstration zooms
    options.pop("family", None)
    env = VisualEnv(**options)
    folder = resolve_model(args.model)
    model = AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True).eval()
    tm = tool_manager_for(cfg.model, AutoTokenizer.from_pretrained(folder), model)  # as rlfactory sft / eval make it
    specs = [spec_of(function_tool(env.episode_zoom() if env.episode_picture else env.zoom))]
    print(f"# benchmarks/visual_reading.py {args.model} {' '.join(args.overrides)}")
    print(f"{'split':8s}{'pictures':>9s}{'P(zoom)':>9s}{'greedy zooms':>14s}{'reads the digit':>17s}")
    for split in ("train", "test"):
        rows = env.load_split(split)[: args.n]
        pz, greedy, acc = read(model, tm, env, specs, rows)
        print(f"{split:8s}{len(rows):9d}{pz:9.2f}{greedy * 100:13.0f}%{acc * 100:16.0f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
