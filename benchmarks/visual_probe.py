"""Vision probe (issue 31): can the tiny VL model's vision tower tell the visual demo's digits apart?

For the visual env's pictures (the options of examples/visual_demo.yaml, or a config given), two
views of each picture:
  zoom     what the solver's zoom returns (its window at full resolution: `VisualEnv.window`,
           `solver_zoom` px), the picture the model must read the digit from;
  prompt   the prompt's copy of the whole picture (shrunk to `view` px), which must NOT show it.
Two kinds of features of each view:
  pixels   the image processor's pixel values (what the tower is fed): the ceiling;
  tower    the vision tower's output tokens (`model.visual(...)`, after the patch merger: what the
           language model reads at the image pads), frozen, flattened.
A multinomial logistic regression (torch, full-batch L-BFGS on standardised features, its L2
strength chosen by 3-fold cross-validation on the training pictures) learns the digit from the
training split's pictures and is scored on the env's held-out test split (no test picture shares
its digit, place and colour with a training one). Chance is 10%.

It measures separability, not speed: its output may be committed as a result.

Run:  .venv/bin/python benchmarks/visual_probe.py [--config examples/visual_demo.yaml]
      [--model tiny-vl:1m-compact | a saved model folder] [--n-train 400] [--n-test 200]
      [env.options.size=48 ...]   (dotted overrides of the config, as on rlfactory's commands)
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
L2_GRID = (1e-3, 1e-1, 10.0)


@dataclass
class ProbeResult:
    """Held-out and training accuracy of one (view, features) probe."""

    view: str
    features: str
    dims: int
    l2: float
    train_acc: float
    test_acc: float


def fit_logreg(x: torch.Tensor, y: torch.Tensor, l2: float, iters: int = 100) -> torch.Tensor:
    """Weights [D+1, 10] of a multinomial logistic regression on x [N, D] (standardised), y [N]."""
    xb = torch.cat([x, torch.ones(len(x), 1)], dim=1)
    w = torch.zeros(xb.shape[1], 10, requires_grad=True)
    opt = torch.optim.LBFGS([w], lr=1.0, max_iter=iters, history_size=20, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(xb @ w, y) + l2 * (w[:-1] ** 2).sum() / len(x)
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach()


def accuracy(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
    xb = torch.cat([x, torch.ones(len(x), 1)], dim=1)
    return float(((xb @ w).argmax(1) == y).float().mean())


def standardise(train: torch.Tensor, *others: torch.Tensor) -> list[torch.Tensor]:
    mean, std = train.mean(0), train.std(0).clamp_min(1e-6)
    return [(t - mean) / std for t in (train, *others)]


def probe(xtr: torch.Tensor, ytr: torch.Tensor, xte: torch.Tensor, yte: torch.Tensor) -> tuple[float, float, float]:
    """(l2 chosen by 3-fold CV, train accuracy, held-out accuracy)."""
    folds = torch.arange(len(xtr)) % 3
    best = (-1.0, L2_GRID[0])
    for l2 in L2_GRID:
        accs = []
        for k in range(3):
            a, b = standardise(xtr[folds != k], xtr[folds == k])
            accs.append(accuracy(fit_logreg(a, ytr[folds != k], l2), b, ytr[folds == k]))
        best = max(best, (float(np.mean(accs)), l2))
    l2 = best[1]
    a, b = standardise(xtr, xte)
    w = fit_logreg(a, ytr, l2)
    return l2, accuracy(w, a, ytr), accuracy(w, b, yte)


def views(env, item) -> dict[str, np.ndarray]:
    """The two pictures of an item: what the solver's zoom returns, and the prompt's shrunk copy."""
    from PIL import Image as PILImage

    x, y = env.window(item)
    zoomed = env.zoom(item.picture_id, x, y, env.solver_zoom)
    if isinstance(zoomed, str):
        raise SystemExit("visual_probe: the config's zoom shows no picture (tool_images: false): nothing to probe")
    prompt = np.asarray(PILImage.open(io.BytesIO(env.prompt_png(item))).convert("RGB"))
    return {"zoom": zoomed[1], "prompt": prompt}


@torch.no_grad()
def features(model, processor, pictures: list[np.ndarray]) -> dict[str, torch.Tensor]:
    """Per picture: the processor's pixel values and the vision tower's merged output, flattened."""
    from PIL import Image as PILImage

    px, tower = [], []
    for arr in pictures:
        out = processor(images=[PILImage.fromarray(arr)], return_tensors="pt")
        pv, grid = out["pixel_values"], out["image_grid_thw"]
        px.append(pv.flatten().float())
        visual = model.model.visual if hasattr(model, "model") and hasattr(model.model, "visual") else model.visual
        res = visual(pv.to(visual.dtype), grid_thw=grid)
        emb = res.pooler_output if hasattr(res, "pooler_output") else res
        tower.append(emb.flatten().float())
    return {"pixels": torch.stack(px), "tower": torch.stack(tower)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "visual_demo.yaml"))
    ap.add_argument("--model", default=None, help="tiny-vl spec or saved folder (default: the config's model.path)")
    ap.add_argument("--n-train", type=int, default=400, help="training pictures the probe learns from")
    ap.add_argument("--n-test", type=int, default=200, help="held-out pictures it is scored on")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("overrides", nargs="*", help="dotted config overrides (env.options.size=48)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(ROOT))

    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    from rlfactory.cli.common import load_run_config
    from rlfactory.envs.visual import VisualEnv
    from rlfactory.tiny.cache import resolve_model

    cfg = load_run_config(args.config, args.overrides)
    options = {k: v for k, v in cfg.env.options.items() if k not in ("family",)}
    options.update(n_train=args.n_train, n_test=args.n_test, tool_images=True)
    env = VisualEnv(**options)
    folder = resolve_model(args.model or cfg.model.path)
    processor = AutoImageProcessor.from_pretrained(folder, local_files_only=True)
    model = AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True).eval()

    t0 = time.perf_counter()
    print(f"# benchmarks/visual_probe.py: {args.config} {' '.join(args.overrides)}")
    print(f"# model {args.model or cfg.model.path} ({folder}); {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}")
    print(f"# env: size {env.size}, view {env.view}, ink {env.ink}, solver_zoom {env.solver_zoom}; "
          f"{args.n_train} training pictures, {args.n_test} held-out; chance 10%")
    data: dict[str, dict[str, dict[str, torch.Tensor]]] = {}
    labels: dict[str, torch.Tensor] = {}
    for split, items in env.items().items():
        pics = [views(env, it) for it in items]
        labels[split] = torch.tensor([it.digit for it in items])
        data[split] = {v: features(model, processor, [p[v] for p in pics]) for v in ("zoom", "prompt")}
    shapes = {v: tuple(views(env, env.items()["train"][0])[v].shape[:2]) for v in ("zoom", "prompt")}
    results = []
    for view in ("zoom", "prompt"):
        for kind in ("pixels", "tower"):
            xtr, xte = data["train"][view][kind], data["test"][view][kind]
            l2, tr, te = probe(xtr, labels["train"], xte, labels["test"])
            results.append(ProbeResult(view, kind, xtr.shape[1], l2, tr, te))
    print(f"\n{'view':8s}{'picture':>10s}{'features':>10s}{'dims':>7s}{'L2':>8s}{'train acc':>11s}{'held-out acc':>14s}")
    for r in results:
        h, w = shapes[r.view]
        print(f"{r.view:8s}{f'{w}x{h}':>10s}{r.features:>10s}{r.dims:7d}{r.l2:8.0e}{r.train_acc * 100:10.1f}%"
              f"{r.test_acc * 100:13.1f}%")
    print(f"\n# {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
