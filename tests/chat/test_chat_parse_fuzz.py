"""`parse()` on fuzzed and adversarial text: it never raises and never stalls.

The inputs come from `benchmarks/parse_fuzz.py` (the benchmark runs 100,000 per family; this runs a
few thousand), so the benchmark's generator is exercised here too.
"""

from __future__ import annotations

import importlib.util
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from rlfactory.chat import Llama3ToolManager, Qwen3ToolManager, SearchR1ToolManager, TemplateToolManager

FAMILIES = ["qwen3", "llama3", "searchr1", "template", "template-mistral"]


def load_fuzz():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "parse_fuzz.py"
    spec = importlib.util.spec_from_file_location("benchmarks_parse_fuzz", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


fuzz = load_fuzz()


@pytest.fixture(scope="module")
def managers(tiny_tokenizer):
    return {"qwen3": Qwen3ToolManager(tiny_tokenizer), "llama3": Llama3ToolManager(tiny_tokenizer),
            "searchr1": SearchR1ToolManager(tiny_tokenizer), "template": TemplateToolManager(tiny_tokenizer),
            "template-mistral": TemplateToolManager(tiny_tokenizer, call_format="mistral")}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_few_thousand_fuzzed_inputs_raise_nothing(managers, family):
    report = fuzz.fuzz_family(family, managers[family], 3000, seed=1)
    assert report.inputs == 3000
    assert report.exceptions == 0, "\n".join(report.first_exceptions)
    # the fuzz reaches every outcome, so it exercises calls, answers and malformed turns alike
    assert set(report.results) == {"Answer", "ToolCalls", "Malformed"}, report.results


class CpuBudgetExceeded(Exception):
    pass


@contextmanager
def cpu_budget(seconds: float):
    """Raise CpuBudgetExceeded once this process has spent `seconds` of CPU time in the block.
    ITIMER_PROF counts CPU time, not wall time, so other work on a shared machine does not trip it."""
    def stop(signum, frame):
        raise CpuBudgetExceeded(f"more than {seconds} s of CPU time")

    previous = signal.signal(signal.SIGPROF, stop)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


@pytest.mark.parametrize("family", FAMILIES)
def test_adversarial_shapes_do_not_stall_parse(managers, family):
    """A stall guard, not a speed test: every adversarial shape (unclosed tags repeated, nesting,
    runs of quotes) at 128k characters, all within 10 s of CPU. Linear parsing needs about 0.1 s for
    them all; the quadratic parsers this replaced needed minutes (`'<tool_call>' * 8000` alone took
    18.6 s). The per-character figures are in benchmarks/results/parse_fuzz.txt."""
    manager = managers[family]
    with cpu_budget(10):
        for name, make in fuzz.ADVERSARIAL.items():
            assert manager.parse(make(128_000)) is not None, name
