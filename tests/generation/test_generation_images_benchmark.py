"""benchmarks/images.py (issue 31: image vs text-only trajectories of tiny-vl) runs its whole code
path on a tiny workload: both modes have the same token counts, the ratios are printed, and the
vision encoder covers each image once (its exit status says so)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_images_benchmark_runs_and_encodes_each_image_once():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "images.py"), "--trajectories", "2",
                          "--new-tokens", "3", "--repeats", "1", "--micro-batch", "1"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert re.search(r"image / text: rollout tokens/s \d+\.\d\dx \(generated tokens/s \d+\.\d\dx\), training tokens/s "
                     r"\d+\.\d\dx", out.stdout), out.stdout
    assert "6 images" in out.stdout and "-> 1.00 encodings per image" in out.stdout, out.stdout
    assert re.search(r"the training batch holds \d+\.\d\d MiB of pixel values", out.stdout)
