"""A virtualenv with verl, beside rlfactory's own, for the real-verl test.

verl 0.9.1's declared dependencies pin transformers<5.11 and pull vLLM/SGLang extras that pin
another torch; rlfactory runs torch 2.13 and transformers 5.x. What verl's agent-loop module needs
at import time installs beside them, so the venv is: rlfactory's site-packages (through a .pth
file: torch, transformers, rlfactory itself), plus `verl` without its dependencies, plus the few
packages its agent-loop import graph really needs (REQUIREMENTS). Built once under
`.cache/verl-venv-<version>` (about a minute), reused while its requirements are unchanged.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VERL = "verl==0.9.1"
REQUIREMENTS = ["ray==2.60.0", "hydra-core==1.3.8", "tensordict==0.10.0", "codetiming==1.4.0", "cachetools==8.0.1",
                "fastapi==0.165.0"]
"""What `import verl.experimental.agent_loop` needs beyond rlfactory's environment (found by
importing it in a bare venv until it stopped failing)."""


def verl_python() -> Path:
    """The python of the verl venv, built when missing. Raises RuntimeError with pip's output when
    the packages cannot be installed."""
    venv = ROOT / ".cache" / f"verl-venv-{VERL.split('==')[1]}"
    python = venv / "bin" / "python"
    ready = venv / "rlfactory-ready"
    wanted = " ".join([VERL, *REQUIREMENTS, sysconfig.get_paths()["purelib"]])
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / "verl-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.is_file() and ready.read_text() == wanted and python.is_file():
            return python
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   check=True, capture_output=True, text=True).stdout.strip())
        # addsitedir, not a bare path: rlfactory's own editable install is a .pth file there too.
        base = sysconfig.get_paths()["purelib"]
        (site / "rlfactory_base.pth").write_text(f"import site; site.addsitedir({base!r})\n")
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        for args in ([*pip, "--no-deps", VERL], [*pip, *REQUIREMENTS]):
            done = subprocess.run(args, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(args[3:])} failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
        ready.write_text(wanted)
    return python
