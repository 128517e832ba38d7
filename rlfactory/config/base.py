"""Typed configuration: YAML files validated into pydantic models before any work starts.

Every section is a `Section` subclass (unknown keys are errors), in this package beside this module. A run
config is loaded with `load_config(Model, path, overrides)`; dotted overrides such as
`tools.timeout_s=5` are applied before validation, and their values are parsed as YAML scalars.
Any error names the key and the file. Relative paths in a config are resolved against the
config file's folder (see `ExistingFile`). This module imports nothing else of rlfactory.
"""

from __future__ import annotations

import copy
import difflib
import os
import typing
from pathlib import Path
from typing import Annotated, Any, Iterable, NamedTuple, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, ValidationInfo

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config problem, with the key and the file it came from in the message."""


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to `name` (difflib, ratio >= 0.7), or None."""
    close = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.7)
    return close[0] if close else None


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """`"; did you mean 'x'?"` for the closest candidate to `name`, or "" when none is close. The one
    helper behind every suggestion (config keys, env and tool names, reward terms, paths)."""
    close = closest(name, candidates)
    return f"; did you mean {close!r}?" if close else ""


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=(),
                              use_attribute_docstrings=True)


def require_at_least_one(section: BaseModel, key: str, *names: str) -> None:
    """Raise `ValueError("{key}.{name} must be >= 1")` for the first of `names` whose value is below
    1; a None value is unset and passes. The one check behind the sections' counts and sizes."""
    for name in names:
        value = getattr(section, name)
        if value is not None and value < 1:
            raise ValueError(f"{key}.{name} must be >= 1")


def _resolve(value: str | None, info: ValidationInfo, must_exist: bool) -> str | None:
    if value is None or value == "":
        return value
    base = (info.context or {}).get("base_dir") if info.context else None
    p = Path(os.path.expanduser(str(value)))
    if not p.is_absolute() and base is not None:
        candidate = Path(base) / p
        # A path relative to the config file wins; fall back to the working directory.
        p = candidate if candidate.exists() or not p.exists() else p
    if must_exist and not p.exists():
        raise ValueError(f"file not found: {value!s} (looked for {p})")
    return str(p)


def _existing(value: str | None, info: ValidationInfo) -> str | None:
    return _resolve(value, info, must_exist=True)


def _relative(value: str | None, info: ValidationInfo) -> str | None:
    return _resolve(value, info, must_exist=False)


ExistingFile = Annotated[str, AfterValidator(_existing)]
"""A path that must exist; relative paths are taken from the config file's folder."""

ConfigPath = Annotated[str, AfterValidator(_relative)]
"""A path that may not exist yet (an output); relative paths are taken from the config's folder."""


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping, got {type(data).__name__}")
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str] | None) -> dict[str, Any]:
    """Return a copy of `data` with `a.b.c=value` overrides applied (values parsed as YAML)."""
    data = copy.deepcopy(data)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected KEY=VALUE, e.g. trainer.lr=1e-5")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r}: bad key {key!r}")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
            node = nxt
        node[parts[-1]] = value
    return data


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation may hold (through Optional, unions and Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _keys_at(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> list[str]:
    """The keys a config section at `loc` (a path of keys below `model`) accepts; [] when unknown.
    A mapping of sections (`tools.per_tool.NAME`) is stepped through by its value type."""
    models = [model] if model is not None else []
    parts = list(loc)
    while parts and models:
        part = str(parts.pop(0))
        nxt: list[type[BaseModel]] = []
        for m in models:
            field = m.model_fields.get(part) or next(
                (f for f in m.model_fields.values() if f.alias == part), None)
            if field is None:
                continue
            annotation = field.annotation
            if typing.get_origin(annotation) is dict and parts:
                parts.pop(0)  # the mapping's own key (a tool name, say)
                annotation = typing.get_args(annotation)[-1]
            nxt += _models_in(annotation)
        models = nxt
    return [name for m in models for name in m.model_fields]


class ConfigProblem(NamedTuple):
    """One error of a config: its dotted key and a one-line message."""

    key: str
    message: str


def config_problems(err: ValidationError, model: type[BaseModel] | None = None) -> list[ConfigProblem]:
    """The errors of `err`, one per key. With `model` (the validated class), an unknown key gets the
    closest key its section accepts as a suggestion."""
    problems = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            msg = "unknown key" + did_you_mean(str(e["loc"][-1]), _keys_at(model, tuple(e["loc"][:-1])))
        elif e["type"] == "missing":
            msg = "required key is missing"
        else:
            msg = e["msg"]
            if "input" in e and e["type"] not in ("value_error",):
                msg += f" (got {e['input']!r})"
        problems.append(ConfigProblem(key, msg))
    return problems


def format_validation_error(err: ValidationError, source: str, model: type[BaseModel] | None = None) -> str:
    return "\n".join([f"invalid config in {source}:", *(f"  {key}: {msg}" for key, msg in config_problems(err, model))])


def validate(model: type[M], data: dict[str, Any], source: str = "<config>", base_dir: str | None = None) -> M:
    try:
        return model.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source, model)) from None


def load_config(model: type[M], path: str | os.PathLike | None, overrides: list[str] | None = None) -> M:
    """Read `path` (YAML), apply dotted overrides, validate into `model`. Errors name key and file."""
    data = read_yaml(path) if path is not None else {}
    data = apply_overrides(data, overrides)
    source = str(path) if path is not None else "<defaults>"
    if overrides:
        source += f" (with overrides {' '.join(overrides)})"
    base_dir = str(Path(path).resolve().parent) if path is not None else None
    return validate(model, data, source, base_dir)


def dump_config(cfg: BaseModel) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
