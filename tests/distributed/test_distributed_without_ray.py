"""Without the `ray` package: rlfactory imports and trains in process; a Ray run says what to install."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import sys
sys.modules["ray"] = None  # as if ray were not installed: `import ray` raises ImportError
import rlfactory, rlfactory.distributed, rlfactory.distributed.session, rlfactory.cli.main
from rlfactory.train.config import RunConfig
cfg = RunConfig.model_validate({"trainer": {"backend": "ray"}, "ray": {"rollout_workers": 3}})
assert cfg.ray.rollout_workers == 3 and cfg.ray.tool_pools == 1
try:
    rlfactory.distributed.require_ray()
except ImportError as e:
    print("ERROR:", e)
"""


def test_rlfactory_imports_without_ray_and_a_ray_run_names_the_extra():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ERROR: trainer.backend: ray needs the `ray` package: pip install 'rlfactory[ray]'" in out.stdout


def test_rlfactory_train_with_the_ray_backend_and_no_ray_fails_in_one_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("trainer: {backend: ray, run_dir: " + str(tmp_path / "run") + "}\n")
    script = ("import sys; sys.modules['ray'] = None\nfrom rlfactory.cli.main import main\n"
              f"sys.exit(main(['train', {str(cfg)!r}]))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip() == "rlfactory train: trainer.backend: ray needs the `ray` package: pip install 'rlfactory[ray]'"
    assert not (tmp_path / "run").exists()
