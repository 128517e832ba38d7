"""System metrics per logged step: this process's CPU and memory read from /proc, checked against
what the process really did (a busy loop, a large allocation), and written into metrics.jsonl."""

from __future__ import annotations

import json
import resource
import time

import pytest

from rlfactory.train import system_metrics
from rlfactory.train.runlog import RunLog
from rlfactory.train.system_metrics import SystemMetrics


def _busy(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_cpu_percent_is_the_process_cpu_time_over_wall_time():
    """Checked against the process's own clocks over the same period, so a loaded machine (where
    a busy loop gets less than a core) does not change the verdict."""
    wall0, cpu0 = time.monotonic(), time.process_time()
    sm = SystemMetrics()
    _busy(0.4)
    busy = sm.sample()["system/cpu_percent"]
    wall1, cpu1 = time.monotonic(), time.process_time()
    time.sleep(0.4)
    idle = sm.sample()["system/cpu_percent"]
    wall2, cpu2 = time.monotonic(), time.process_time()
    assert busy == pytest.approx(100 * (cpu1 - cpu0) / (wall1 - wall0), abs=8)
    assert idle == pytest.approx(100 * (cpu2 - cpu1) / (wall2 - wall1), abs=8)
    assert busy > idle


def test_rss_matches_the_kernel_and_grows_with_an_allocation():
    sm = SystemMetrics()
    before = sm.sample()["system/rss_mb"]
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert 10 < before <= peak_kb / 1024 + 1
    block = bytearray(200 << 20)  # 200 MiB, touched: resident
    for i in range(0, len(block), 4096):
        block[i] = 1
    after = sm.sample()["system/rss_mb"]
    assert after - before > 150, (before, after)
    del block
    host = sm.sample()["system/host_mem_percent"]
    assert 0 < host < 100


def test_without_proc_the_keys_are_left_out_and_said_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(system_metrics, "_PROC_SELF", tmp_path / "no-proc")
    monkeypatch.setattr(system_metrics, "_MEMINFO", tmp_path / "no-meminfo")
    sm = SystemMetrics()
    assert sm.sample() == {} and sm.sample() == {}
    err = capsys.readouterr().err
    assert err.count("system/cpu_percent is not logged") == 1
    assert err.count("system/rss_mb is not logged") == 1
    assert err.count("system/host_mem_percent is not logged") == 1


def test_no_gpu_keys_in_a_process_that_has_not_started_cuda():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        pytest.skip("CUDA already started in this process")
    assert not any(k.startswith("system/gpu") for k in SystemMetrics().sample())


def test_runlog_writes_system_metrics_and_wall_time_into_each_train_record(tmp_path):
    log = RunLog(tmp_path, tensorboard=False)
    t0 = time.time()
    log.log(1, {"reward/mean": 0.5})
    log.log(1, {"accuracy": 1.0}, kind="eval")
    log.close()
    train = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert train["step"] == 1 and train["reward/mean"] == 0.5
    assert {"system/cpu_percent", "system/rss_mb", "system/host_mem_percent"} <= set(train)
    assert t0 - 1 < train["wall_time"] < time.time() + 1
    evaluation = json.loads((tmp_path / "eval.jsonl").read_text())
    assert not any(k.startswith("system/") for k in evaluation) and "wall_time" in evaluation


@pytest.mark.gpu
def test_gpu_memory_follows_an_allocation_on_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    torch.cuda.init()
    sm = SystemMetrics()
    before = sm.sample()
    block = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    after = sm.sample()
    assert after["system/gpu_mem_reserved_mb"] - before["system/gpu_mem_reserved_mb"] >= 511
    assert after["system/gpu_mem_mb"] - before["system/gpu_mem_mb"] >= 500
    if "system/gpu_util" in after:
        assert 0 <= after["system/gpu_util"] <= 100
    del block
