"""Every command that takes KEY=VALUE overrides takes them after its options too, as the README's
commands write them (`rlfactory experiment CONFIG --out runs/x sft.steps=10`)."""

from __future__ import annotations

import pytest

from rlfactory.cli.main import build_parser

CASES = [
    ["train", "c.yaml", "--resume", "trainer.steps=3"],
    ["sft", "c.yaml", "trainer.steps=3"],
    ["eval", "c.yaml", "--model", "m", "--split", "test", "trainer.steps=3"],
    ["rollout", "c.yaml", "--out", "o.jsonl", "trainer.steps=3"],
    ["experiment", "c.yaml", "--out", "runs/x", "trainer.steps=3"],
    ["demo", "--out", "runs/d", "trainer.steps=3"],
]


@pytest.mark.parametrize("argv", CASES, ids=[c[0] for c in CASES])
def test_overrides_after_the_options(argv):
    args = build_parser().parse_args(argv)
    assert args.overrides == ["trainer.steps=3"]


@pytest.mark.parametrize("command", ["experiment", "demo"])
def test_overrides_between_options(command):
    head = [command] if command == "demo" else [command, "c.yaml"]
    args = build_parser().parse_args(head + ["a.b=1", "--out", "runs/x", "c.d=2", "--eval-limit", "4"])
    assert args.overrides == ["a.b=1", "c.d=2"] and args.out == "runs/x" and args.eval_limit == 4
