"""What `rlfactory serve` and `rlfactory gateway` share: a model loaded in a process of its own and
served over HTTP. The options that say how it loads and samples, the first checks of `run`, and
the `--logits-processor` factory."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable

from rlfactory.server_process import exit_with_parent


def add_model_arguments(p: argparse.ArgumentParser, logits_processor_help: str) -> None:
    """--device, --dtype, --seed, --logits-processor and the hidden --exit-with-parent (a parent
    process that starts the server passes its pid, so the server ends with it)."""
    p.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda[:i]")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights dtype")
    p.add_argument("--seed", type=int, default=None, help="seed of the sampling random generator")
    p.add_argument("--logits-processor", default=None, metavar="MODULE:FACTORY", help=logits_processor_help)
    p.add_argument("--exit-with-parent", type=int, default=None, metavar="PID", help=argparse.SUPPRESS)


def start(args: argparse.Namespace, command: str, **at_least_one: int) -> bool:
    """The first lines of a model server's `run`: False, after one line on stderr, when an option of
    `at_least_one` (its name with `_` for `-`, and its value) is below 1; else True, with this
    process set to end with its parent when `--exit-with-parent` says so."""
    for name, value in at_least_one.items():
        if value < 1:
            print(f"rlfactory {command}: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return False
    if args.exit_with_parent:
        exit_with_parent(args.exit_with_parent)
    return True


def logits_processor_factory(spec: str) -> Callable[..., Any]:
    """The logits-processor factory `spec` names (MODULE:FACTORY; MODULE may live in the current folder)."""
    from rlfactory.imports import import_ref

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return import_ref(spec, "--logits-processor", "function")
