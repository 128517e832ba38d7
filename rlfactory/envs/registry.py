"""Env registry: `@register_env("name")` on a class, `make_env("name" | "module:Class", **options)`.

Built-in envs are registered lazily (their modules import only when asked for), so that
`import rlfactory.envs` stays cheap and a broken optional env never breaks the others.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, TypeVar

from rlfactory.envs.base import Env, missing_members

E = TypeVar("E", bound=type)

_REGISTRY: dict[str, type] = {}

# name -> "module:Class" of the built-in envs, imported on first use.
_BUILTIN: dict[str, str] = {
    "search": "rlfactory.envs.search.env:SearchEnv",
    "code": "rlfactory.envs.code:CodeEnv",
    "python": "rlfactory.envs.code:CodeEnv",
    "sql": "rlfactory.envs.sql:SqlEnv",
    "calculator": "rlfactory.envs.calculator:CalculatorEnv",
}


def register_env(name: str) -> Callable[[E], E]:
    """Class decorator: make an env class available to `make_env(name)` and `env.name` in configs."""

    def deco(cls: E) -> E:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"env name {name!r} is already registered to {_REGISTRY[name].__qualname__}")
        _REGISTRY[name] = cls
        return cls

    return deco


def _import_class(spec: str) -> type:
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"env {spec!r}: expected a registered name or `module:Class`")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise ValueError(f"env {spec!r}: cannot import module {module!r} ({e})") from e
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"env {spec!r}: module {module!r} has no {attr!r}")
        obj = getattr(obj, part)
    return obj  # type: ignore[return-value]


def env_class(name_or_spec: str | type) -> type:
    """The env class for a registered name, a `module:Class` string, or a class."""
    if isinstance(name_or_spec, type):
        return name_or_spec
    if name_or_spec in _REGISTRY:
        return _REGISTRY[name_or_spec]
    if name_or_spec in _BUILTIN:
        _import_class(_BUILTIN[name_or_spec])  # importing the module registers it
        if name_or_spec in _REGISTRY:
            return _REGISTRY[name_or_spec]
        return _import_class(_BUILTIN[name_or_spec])
    if ":" in name_or_spec:
        return _import_class(name_or_spec)
    known = sorted(set(_REGISTRY) | set(_BUILTIN))
    raise ValueError(f"unknown env {name_or_spec!r}; registered: {', '.join(known)} (or give `module:Class`)")


def registered_envs() -> list[str]:
    return sorted(set(_REGISTRY) | set(_BUILTIN))


def make_env(name_or_spec: str | type, **options: Any) -> Env:
    """Build an env from a registered name, `module:Class` or a class; `options` go to its constructor."""
    cls = env_class(name_or_spec)
    try:
        env = cls(**options)
    except TypeError as e:
        if not options:
            raise
        raise TypeError(f"env {name_or_spec!r} ({cls.__qualname__}) cannot be built with option(s) "
                        f"{', '.join(sorted(options))}: {e}") from e
    missing = missing_members(env)
    if missing:
        hint = "" if Env in cls.__mro__ else " (subclass rlfactory.envs.Env to inherit the defaults)"
        raise TypeError(f"env {name_or_spec!r} ({cls.__qualname__}) does not implement {', '.join(missing)}{hint}")
    return env


def env_from_config(cfg: Any, **extra: Any) -> Env:
    """Build the env of an `EnvConfig` (`env:` section). `extra` (e.g. `family=` from `model.family`)
    fills options the config leaves unset; `train_data` / `test_data` are passed when set."""
    options = dict(cfg.options)
    for key in ("train_data", "test_data"):
        value = getattr(cfg, key, None)
        if value:
            options[key] = value
    cls = env_class(cfg.name)
    for key, value in extra.items():
        if value is not None and _accepts(cls, key):
            options.setdefault(key, value)
    return make_env(cls, **options)


def _accepts(cls: type, key: str) -> bool:
    """Whether `cls(**{key: ...})` is allowed (a named parameter or **kwargs). A class without an
    `__init__` of its own (an Env subclass that only overrides methods) takes no options."""
    init = next((b.__dict__["__init__"] for b in cls.__mro__
                 if "__init__" in b.__dict__ and b.__dict__["__init__"] is not _PROTOCOL_INIT), object.__init__)
    if init is object.__init__:
        return False
    try:
        params = inspect.signature(init).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind == p.VAR_KEYWORD or p.name == key for p in params)


_PROTOCOL_INIT = Env.__dict__.get("__init__")  # what typing puts on a Protocol: not an __init__ of the env's
