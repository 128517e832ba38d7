"""Config section `env:` (read by the environments). Built with `rlfactory.envs.env_from_config`."""

from __future__ import annotations

from typing import Any

from rlfactory.config.base import ExistingFile, Section


class EnvConfig(Section):
    """The environment: which env, its data and its options."""

    name: str = "search"
    """A registered env name (search, code, sql, or one registered with `@register_env` in
    `env.module`) or `module:Class` (a module next to the config, or an installed one)."""
    module: str | list[str] | None = None
    """Module(s) imported before `name` is looked up, so that their `@register_env` and
    `@reward_term` names can be used here: `wiki` for a wiki.py next to the config, or an
    installed package's module."""
    train_data: ExistingFile | None = None
    """Training rows (parquet in Search-R1's layout, or what the env reads); unset = the env's own
    (generated) data. Relative paths are taken from the config file's folder."""
    test_data: ExistingFile | None = None
    """Evaluation rows, like `train_data`."""
    options: dict[str, Any] = {}
    """Env-specific options, passed to the env's constructor as keyword arguments (see each env's
    docstring); an env class without a constructor of its own finds them in `self.options`.
    `max_turns` here is the env's turn limit for every env. `family` defaults to `model.family`.
    Paths here are taken from the working directory."""
