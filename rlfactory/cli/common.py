"""What every config-taking command does first: one loader for `train`, `eval`, `rollout`, `sft`
and `tools`, so that what works under one command works under all."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlfactory.imports import make_config_folder_importable

if TYPE_CHECKING:
    from rlfactory.config import RunConfig


def load_run_config(path: str, overrides: list[str] | None) -> Any:
    """Validate `path` plus dotted overrides into a RunConfig, and make the config's folder importable."""
    from rlfactory.config import load_config
    from rlfactory.config import RunConfig

    cfg = load_config(RunConfig, path, overrides)
    make_config_folder_importable(path)
    return cfg


def allow_overrides_after_options(parser: argparse.ArgumentParser) -> None:
    """Let positionals (KEY=VALUE overrides) follow the options: `CONFIG --n 4 --out f a.b=c`.

    The parent parser hands a subcommand's arguments to `parse_known_args`; route that through
    argparse's intermixed parsing (which itself calls `parse_known_args`, hence the guard)."""
    plain = parser.parse_known_args
    busy: list[bool] = []

    def parse_known_args(args=None, namespace=None):
        if busy:
            return plain(args, namespace)
        busy.append(True)
        try:
            return parser.parse_known_intermixed_args(args, namespace)
        finally:
            busy.pop()

    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]


async def train_from(cfg: RunConfig, model_path: str, run_dir: Path) -> tuple[list[dict[str, float]], str]:
    """`rlfactory train` of `cfg` starting from `model_path`, into `run_dir`: (the steps' metrics,
    the last checkpoint's model folder). The experiment and the demo train their warm start so."""
    from rlfactory.train.checkpoint import latest_checkpoint
    from rlfactory.train.run import train

    train_cfg = cfg.model_copy(deep=True)
    train_cfg.model.path = model_path
    train_cfg.trainer.run_dir = str(run_dir)
    history = await train(train_cfg)
    return history, str(latest_checkpoint(run_dir) / "model")
