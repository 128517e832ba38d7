"""System metrics for each logged step: the training process's CPU and memory, and the GPU's.

`SystemMetrics.sample()` returns, for the time since the previous call:
- `system/cpu_percent`: this process's CPU time over wall time, in percent of one core (so a
  process busy on two cores reads 200, as `top` and psutil say);
- `system/rss_mb`: its resident memory now;
- `system/host_mem_percent`: the host's memory in use (MemTotal - MemAvailable), in percent;
- where this process uses a CUDA device (the current one): `system/gpu_mem_mb` (memory in use on the device, by every
  process, as nvidia-smi counts it), `system/gpu_mem_reserved_mb` (what this process's allocator
  holds) and `system/gpu_util` (percent of the last sample period the device was busy; only where
  the NVML bindings, the `nvidia-ml-py` package, are installed: torch reads it through them).

Read from /proc (psutil is not a dependency); on a system without /proc the CPU and memory keys
are left out, and the reason is said once on stderr.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

_PROC_SELF = Path("/proc/self")
_MEMINFO = Path("/proc/meminfo")


class SystemMetrics:
    """Samples this process's and the machine's resource use; one instance per training run."""

    def __init__(self) -> None:
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._said: set[str] = set()
        self._last = (time.monotonic(), self._cpu_seconds())

    def sample(self) -> dict[str, float]:
        """The metrics named in the module docstring, for the time since the last sample."""
        out: dict[str, float] = {}
        now, cpu = time.monotonic(), self._cpu_seconds()
        then, cpu_then = self._last
        self._last = (now, cpu)
        if cpu is not None and cpu_then is not None and now > then:
            out["system/cpu_percent"] = round(100.0 * (cpu - cpu_then) / (now - then), 2)
        rss = self._rss_mb()
        if rss is not None:
            out["system/rss_mb"] = round(rss, 1)
        host = _host_mem_percent()
        if host is not None:
            out["system/host_mem_percent"] = round(host, 2)
        else:
            self._say_once("host", f"system metrics: {_MEMINFO} unreadable; system/host_mem_percent is not logged")
        out.update(self._gpu())
        return out

    def _cpu_seconds(self) -> float | None:
        try:
            # fields after the command name (which may hold spaces and parentheses): utime is the
            # 14th field of the whole line, stime the 15th
            rest = (_PROC_SELF / "stat").read_text().rsplit(")", 1)[1].split()
            return (int(rest[11]) + int(rest[12])) / self._tick
        except (OSError, IndexError, ValueError) as e:
            self._say_once("cpu", f"system metrics: no CPU time ({e}); system/cpu_percent is not logged")
            return None

    def _rss_mb(self) -> float | None:
        try:
            resident = int((_PROC_SELF / "statm").read_text().split()[1])
        except (OSError, IndexError, ValueError) as e:
            self._say_once("rss", f"system metrics: no resident memory ({e}); system/rss_mb is not logged")
            return None
        return resident * self._page / 2**20

    def _gpu(self) -> dict[str, float]:
        device = self._cuda_device()
        if device is None:
            return {}
        import torch

        out: dict[str, float] = {}
        free, total = torch.cuda.mem_get_info(device)
        out["system/gpu_mem_mb"] = round((total - free) / 2**20, 1)
        out["system/gpu_mem_reserved_mb"] = round(torch.cuda.memory_reserved(device) / 2**20, 1)
        try:
            out["system/gpu_util"] = float(torch.cuda.utilization(device))
        except (ModuleNotFoundError, RuntimeError) as e:  # no NVML bindings: leave it out, say so once
            self._say_once("gpu_util", f"system metrics: system/gpu_util is not logged ({e}; pip install nvidia-ml-py)")
        return out

    @staticmethod
    def _cuda_device() -> Any:
        """The current CUDA device when this process has started CUDA (a run on the CPU of a GPU
        machine has not: nothing to report), else None."""
        if "torch" not in sys.modules:
            return None
        import torch

        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return None
        return torch.device("cuda", torch.cuda.current_device())

    def _say_once(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            print(message, file=sys.stderr)


def _host_mem_percent() -> float | None:
    try:
        fields = {}
        for line in _MEMINFO.read_text().splitlines():
            name, _, value = line.partition(":")
            fields[name] = int(value.split()[0])
        return 100.0 * (fields["MemTotal"] - fields["MemAvailable"]) / fields["MemTotal"]
    except (OSError, KeyError, ValueError, IndexError, ZeroDivisionError):
        return None
