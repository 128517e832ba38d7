"""Config checks for the New run page: the command line's validation, with each error's key and
the line of the YAML it points at.

`check_config` does what `rlfactory.config.load_config(RunConfig, path, overrides)` does (read the
YAML, apply dotted overrides, validate with relative paths taken from the source config's folder)
and returns structured errors instead of raising.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError

from rlfactory.config import ConfigError, apply_overrides, config_problems, dump_config

if TYPE_CHECKING:
    from rlfactory.config import RunConfig


@dataclass
class ConfigIssue:
    key: str  # dotted key, "(yaml)" for a syntax error, "override N" for a bad override
    message: str
    line: int | None = None  # 1-based line of the YAML text the key is on, when known

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CheckedConfig:
    config: RunConfig | None  # None when it did not validate
    issues: list[ConfigIssue]

    @property
    def ok(self) -> bool:
        return self.config is not None and not self.issues


def key_lines(text: str) -> dict[str, int]:
    """Dotted key -> 1-based line of that key in a YAML mapping document."""
    out: dict[str, int] = {}
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return out

    def walk(n: Any, prefix: str) -> None:
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                key = f"{prefix}{k.value}"
                out[key] = k.start_mark.line + 1
                walk(v, key + ".")

    walk(node, "")
    return out


def _line_of(key: str, lines: dict[str, int]) -> int | None:
    parts = key.split(".")
    while parts:  # the deepest key that is in the text
        hit = lines.get(".".join(parts))
        if hit is not None:
            return hit
        parts.pop()
    return None


def with_lines(issues: list[ConfigIssue], text: str) -> list[ConfigIssue]:
    """`issues` with the line of their key in YAML `text` filled in where it is known."""
    lines = key_lines(text)
    return [ConfigIssue(i.key, i.message, i.line or _line_of(i.key.split("[")[0], lines)) for i in issues]


def check_config(text: str, overrides: list[str], base_dir: str | Path | None) -> CheckedConfig:
    """Validate YAML `text` plus `overrides` into a RunConfig; never raises for a bad config."""
    from rlfactory.config import RunConfig

    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        return CheckedConfig(None, [ConfigIssue("(yaml)", f"not valid YAML: {e}", mark.line + 1 if mark else None)])
    if data is None:
        data = {}
    if not isinstance(data, dict):
        return CheckedConfig(None, [ConfigIssue("(top level)", f"the top level must be a mapping, got {type(data).__name__}", 1)])
    issues = []
    for i, item in enumerate(overrides):
        try:
            apply_overrides(data, [item])
        except ConfigError as e:
            issues.append(ConfigIssue(f"override {i + 1}", str(e)))
    if issues:
        return CheckedConfig(None, issues)
    data = apply_overrides(data, overrides)
    lines = key_lines(text)
    try:
        cfg = RunConfig.model_validate(data, context={"base_dir": str(base_dir) if base_dir else None})
    except ValidationError as err:
        issues += [ConfigIssue(key, msg, _line_of(key, lines)) for key, msg in config_problems(err)]
        return CheckedConfig(None, issues)
    return CheckedConfig(cfg, [])


def resolved_yaml(cfg: RunConfig) -> str:
    """The validated config as YAML with every path absolute (what a launch writes and runs)."""
    return dump_config(cfg)


def with_section(text: str, section: str, value: Any) -> str:
    """YAML `text` with top-level `section` replaced by `value` (other sections kept as they are)."""
    data = yaml.safe_load(text) if text.strip() else {}
    if not isinstance(data, dict):
        raise ConfigError("the config's top level must be a mapping")
    data[section] = value
    return yaml.safe_dump(data, sort_keys=False)


def example_configs(workspace: Path) -> list[Path]:
    """Run configs (YAML with a model/env/trainer section) under workspace/examples."""
    folder = workspace / "examples"
    out = []
    for p in sorted(folder.rglob("*.yaml")) if folder.is_dir() else []:
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict) and {"model", "env", "trainer", "tools"} & set(data) and "mcpServers" not in data:
            out.append(p)
    return out
