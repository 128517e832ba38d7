"""Env registry: `@register_env("name")` on a class, `make_env("name" | "module:Class", **options)`.

A config names an env by `env.name`: a registered name or `module:Class`. A name registered in
your own module becomes reachable once the module is imported: `env.module: wiki` (a wiki.py next
to the config, or an installed package) is imported before `env.name` is looked up.

Built-in envs are registered lazily (their modules import only when asked for), so that
`import rlfactory.envs` stays cheap and a broken optional env never breaks the others.

An installed package registers envs under the entry-point group `rlfactory.envs`
(`[project.entry-points."rlfactory.envs"] wiki = "my_pkg.env:WikiEnv"`): `env.name: wiki` then
works with no `env.module`. A built-in name wins over an installed one of the same name.
"""

from __future__ import annotations

import inspect
import types
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeVar

from rlfactory.config import ConfigError
from rlfactory.envs.base import Env, missing_members
from rlfactory.imports import did_you_mean, import_module_named
from rlfactory.registry import Registry

if TYPE_CHECKING:
    from rlfactory.config import EnvConfig

E = TypeVar("E", bound=type)

# name -> "module:Class" of the built-in envs, imported on first use.
_BUILTIN: dict[str, str] = {
    "search": "rlfactory.envs.search.env:SearchEnv",
    "code": "rlfactory.envs.code:CodeEnv",
    "python": "rlfactory.envs.code:CodeEnv",
    "sql": "rlfactory.envs.sql:SqlEnv",
    "calculator": "rlfactory.envs.calculator:CalculatorEnv",
    "visual": "rlfactory.envs.visual:VisualEnv",
    "bfcl": "rlfactory.envs.bfcl:BfclEnv",
    "bfcl_multi_turn": "rlfactory.envs.bfcl.multi_turn_env:BfclMultiTurnEnv",
    "verifiers": "rlfactory.envs.adapters.verifiers_env:VerifiersEnv",
    "openenv": "rlfactory.envs.adapters.openenv_env:OpenEnvEnv",
    "agent": "rlfactory.train.gateway_agents:AgentEnv",  # a user's agent through the recording gateway
}

ENTRY_POINT_GROUP = "rlfactory.envs"

# Envs by name: registered with @register_env, and the built-ins (imported on first use). A
# `module:Class` is imported on each lookup and never listed (the catalog shows names only).
_REGISTRY: Registry[type] = Registry("env", "env.name", "class", lazy=_BUILTIN, remember_refs=False)
_UNKNOWN_HINT = "; an env registered with @register_env in your own module needs `env.module: <module>` to import it"


def builtin_envs() -> dict[str, str]:
    """name -> "module:Class" of the envs that ship with rlfactory."""
    return dict(_BUILTIN)


def installed_envs() -> dict[str, EntryPoint]:
    """name -> entry point of the envs that installed packages register (group `rlfactory.envs`)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load_entry_point(ep: EntryPoint) -> type:
    """The env class an entry point names; a one-line ConfigError when it cannot be imported."""
    where = f"{ep.value}" + (f" (package {ep.dist.name})" if ep.dist is not None else "")
    try:
        cls = ep.load()
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"env.name: the installed env {ep.name!r} -> {where} cannot be imported: "
                          f"{type(e).__name__}: {e}") from None
    if not isinstance(cls, type):
        raise ConfigError(f"env.name: the installed env {ep.name!r} -> {where} is a {type(cls).__name__}, not a class")
    return cls


def register_env(name: str) -> Callable[[E], E]:
    """Class decorator: make an env class available to `make_env(name)` and `env.name` in configs."""
    return _REGISTRY.register(name)


def env_class(name_or_spec: str | type) -> type:
    """The env class for a registered name, a `module:Class` string, or a class.

    An unknown name is a `ConfigError` (a ValueError) naming `env.name`, with the closest
    registered name when one is close, and a reminder that a name registered with `@register_env`
    in your own module needs `env.module`."""
    if isinstance(name_or_spec, type):
        return name_or_spec
    if name_or_spec in _REGISTRY or name_or_spec in _BUILTIN or ":" in name_or_spec:
        return _REGISTRY.lookup(name_or_spec)
    installed = installed_envs()
    if name_or_spec in installed:
        return load_entry_point(installed[name_or_spec])
    raise _REGISTRY.unknown(name_or_spec, registered_envs(), _UNKNOWN_HINT)


def registered_envs() -> list[str]:
    """Every env name a config can use: built-in, installed (entry points) and registered in code."""
    return sorted(set(_REGISTRY.names()) | set(installed_envs()))


def _has_own_init(cls: type) -> bool:
    """Whether `cls` defines a constructor below `Env` (one that may take options itself)."""
    for klass in cls.__mro__:
        if klass is Env or klass is object:
            return False
        init = vars(klass).get("__init__")
        # typing puts its own __init__ on a Protocol's subclasses and swaps in object.__init__ on
        # the first instance: neither is the env's constructor
        if init is not None and init is not _PROTOCOL_INIT and init is not object.__init__:
            return True
    return False


def _codes(obj: Any) -> Iterator[types.CodeType]:
    """The code objects of a class member (function, static/class method, property), nested ones too."""
    for fn in (getattr(obj, "__func__", obj), getattr(obj, "fget", None)):
        code = getattr(fn, "__code__", None)
        todo = [code] if code is not None else []
        while todo:
            c = todo.pop()
            yield c
            todo += [k for k in c.co_consts if isinstance(k, types.CodeType)]


def _reads_options(cls: type) -> bool:
    """Whether a method of `cls` (below `Env`) reads an attribute named `options` (`self.options`)."""
    for klass in cls.__mro__:
        if klass is Env or klass is object:
            return False
        if any("options" in code.co_names for member in vars(klass).values() for code in _codes(member)):
            return True
    return False


def _construct(cls: type, options: dict[str, Any]) -> Any:
    """`cls(**options)`; a class that keeps `Env`'s constructor gets the options in `self.options`
    (options it never reads there are refused: they would be ignored without a word)."""
    if not _has_own_init(cls):
        unread = [k for k in options if k != "max_turns"]
        if unread and not _reads_options(cls):
            key = {"train_data": "env.train_data", "test_data": "env.test_data"}.get(unread[0], f"env.options.{unread[0]}")
            raise ConfigError(f"{key}: {cls.__qualname__} takes no options (it has no constructor of its own and "
                              f"never reads self.options), so {', '.join(map(repr, unread))} would be ignored; "
                              "remove it, or read it in the env as self.options[...]")
        env = cls()
        env.options = dict(options)
        return env
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):
        return cls(**options)
    try:
        signature.bind(**options)
    except TypeError as e:
        params = signature.parameters
        variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        takes = [p for p in params if params[p].kind not in variadic]
        bad = [k for k in options if k not in params]
        if not bad:
            raise ConfigError(f"env.options: {cls.__qualname__}: {e}") from None
        raise ConfigError(f"env.options: {cls.__qualname__} takes no option {bad[0]!r}{did_you_mean(bad[0], takes)} "
                          f"(it takes: {', '.join(takes) or 'none'})") from None
    return cls(**options)


def make_env(name_or_spec: str | type, **options: Any) -> Env:
    """Build an env from a registered name, `module:Class` or a class; `options` go to its constructor
    (or, for a class that keeps `Env`'s constructor, to `self.options`).

    `max_turns` among the options sets the env's `max_turns` whatever the constructor does with it,
    so `env.options.max_turns` is the env's turn limit for every env (`rollout.max_turns`, when set,
    must agree with it)."""
    cls = env_class(name_or_spec)
    env = _construct(cls, options)
    missing = missing_members(env)
    if missing:
        hint = "" if Env in cls.__mro__ else " (subclass rlfactory.envs.Env to inherit the defaults)"
        raise TypeError(f"env {name_or_spec!r} ({cls.__qualname__}) does not implement {', '.join(missing)}{hint}")
    if "max_turns" in options:
        turns = options["max_turns"]
        if not isinstance(turns, int) or isinstance(turns, bool) or turns < 1:
            raise ConfigError(f"env.options.max_turns: expected a whole number >= 1, got {turns!r}")
        env.max_turns = turns
    return env


def env_from_config(cfg: EnvConfig, **extra: Any) -> Env:
    """Build the env of an `EnvConfig` (`env:` section). `env.module` is imported first (so its
    `@register_env` and `@reward_term` names exist); `extra` (e.g. `family=` from `model.family`)
    fills options the config leaves unset; `train_data` / `test_data` are passed when set."""
    for module in _modules(cfg.module):
        import_module_named(module, "env.module")
    options = dict(cfg.options)
    for key, value in (("train_data", cfg.train_data), ("test_data", cfg.test_data)):
        if value:
            options[key] = value
    cls = env_class(cfg.name)
    for key, value in extra.items():
        if value is not None and _accepts(cls, key):
            options.setdefault(key, value)
    return make_env(cls, **options)


def _modules(value: str | list[str] | None) -> list[str]:
    if not value:
        return []
    return [value] if isinstance(value, str) else list(value)


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
