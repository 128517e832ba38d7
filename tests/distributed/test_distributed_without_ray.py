"""Without the `ray` package: rlfactory imports and validates configs; a Ray run says in one line
what to install, and starts nothing."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import sys
sys.modules["ray"] = None  # as if ray were not installed: `import ray` raises ImportError
import rlfactory, rlfactory.distributed, rlfactory.distributed.session
from rlfactory.cli.main import main
from rlfactory.config import RunConfig
cfg = RunConfig.model_validate({"trainer": {"backend": "ray"}, "ray": {"rollout_workers": 3}})
assert cfg.ray.rollout_workers == 3 and cfg.ray.tool_pools == 1
try:
    rlfactory.distributed.require_ray()
except ImportError as e:
    print("ERROR:", e)
print("EXIT:", main(["train", sys.argv[1]]))
"""


def test_without_ray_rlfactory_imports_and_a_ray_run_names_the_extra(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("trainer: {backend: ray, run_dir: " + str(tmp_path / "run") + "}\n")
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(cfg)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    need = "trainer.backend: ray needs the `ray` package: pip install 'rlfactory[ray]'"
    assert f"ERROR: {need}" in out.stdout and "EXIT: 2" in out.stdout
    assert out.stderr.strip() == f"rlfactory train: {need}"
    assert not (tmp_path / "run").exists()
