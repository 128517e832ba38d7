"""`rlfactory` command line. Each subcommand lives in its own module under rlfactory.cli and
exposes `register(subparsers)`, which adds its parser and sets `func(args) -> int`.

A config mistake ends a command with one line (`rlfactory: config error: ...`) and exit code 2;
set RLFACTORY_TRACEBACK=1 to see the traceback behind it as well."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

from rlfactory.config import ConfigError

# Modules that define subcommands, in the order `--help` lists them.
COMMAND_MODULES = ["demo", "experiment", "train", "eval", "rollout", "sft", "tools", "envs", "index", "serve",
                   "gateway", "make_tiny_model", "ui", "bench"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlfactory", description="RL post-training for multi-turn tool use")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(f"rlfactory.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"rlfactory.cli.{name}":
                continue  # not built yet
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        if os.environ.get("RLFACTORY_TRACEBACK"):
            traceback.print_exc()
        print(f"rlfactory: config error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"rlfactory: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rlfactory: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
