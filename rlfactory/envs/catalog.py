"""What `rlfactory envs list` shows: every env a config can name (built-in, installed by a package's
`rlfactory.envs` entry point, registered in code), where it comes from, and the options it takes."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

from rlfactory.config import ConfigError
from rlfactory.envs.registry import _REGISTRY, builtin_envs, env_class, installed_envs, load_entry_point


@dataclass
class EnvOption:
    name: str
    default: str  # repr of the default; "" when the option is required
    annotation: str = ""


@dataclass
class EnvEntry:
    name: str
    source: str  # "built-in", "installed (<package>)" or "registered"
    target: str  # module:Class
    summary: str = ""  # the first line of the class docstring
    options: list[EnvOption] = field(default_factory=list)
    error: str | None = None  # why the class could not be imported (the others are still listed)


def env_options(cls: type) -> list[EnvOption]:
    """The keyword options of an env class's constructor (env.options in a config)."""
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return []
    out = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name == "self":
            continue
        default = "" if p.default is p.empty else repr(p.default)
        annotation = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
        out.append(EnvOption(p.name, default, "" if annotation is p.empty or annotation == "_empty" else str(annotation)))
    return out


def _summary(cls: type) -> str:
    """The first line of the class docstring, or of its module's when the class's lists options."""
    for doc in (inspect.getdoc(cls), inspect.getdoc(inspect.getmodule(cls))):
        line = (doc or "").strip().split("\n", 1)[0]
        if line and not line.lower().startswith("options"):
            return line
    return ""


def _entry(name: str, source: str, target: str, load) -> EnvEntry:
    entry = EnvEntry(name, source, target)
    try:
        cls = load()
    except (ConfigError, ImportError) as e:
        entry.error = str(e).splitlines()[0] if str(e) else type(e).__name__
        return entry
    entry.summary = _summary(cls)
    if getattr(cls, "__init__", None) is not object.__init__:
        entry.options = env_options(cls)
    return entry


def env_catalog() -> list[EnvEntry]:
    """Every env by name: built-in first, then installed, then registered in code (sorted within)."""
    builtin, installed = builtin_envs(), installed_envs()
    entries = [_entry(n, "built-in", t, lambda n=n: env_class(n)) for n, t in sorted(builtin.items())]
    for name, ep in sorted(installed.items()):
        if name in builtin:
            continue  # the built-in one is what env.name finds
        package = f" ({ep.dist.name})" if ep.dist is not None else ""
        entries.append(_entry(name, "installed" + package, ep.value, lambda ep=ep: load_entry_point(ep)))
    for name, cls in sorted(_REGISTRY.items()):
        if name not in builtin and name not in installed:
            entries.append(_entry(name, "registered", f"{cls.__module__}:{cls.__qualname__}", lambda cls=cls: cls))
    return entries
