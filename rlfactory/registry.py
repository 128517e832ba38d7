"""One registry for what a config names: a registered name, a built-in imported on first use, or
`module:attr`, with the same one-line `ConfigError` everywhere.

    ESTIMATORS = Registry("advantage estimator")
    @ESTIMATORS.register("grpo")
    def grpo(...): ...
    ESTIMATORS.lookup("grpo")            # the registered entry
    ESTIMATORS.lookup("my_mod:my_fn")    # imports my_mod (which may register names), then the entry
    ESTIMATORS.lookup("grpoo")           # ConfigError: unknown advantage estimator 'grpoo'; did you
                                         #   mean 'grpo'? (known: ...; or module:function)

Every registry of rlfactory (advantage estimators, policy losses, reward and turn terms, envs,
ToolManager families) is one of these; a registry is a read-only mapping of its registered names.
Like `rlfactory.imports`, this module sits at the bottom and imports nothing above the config types.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from rlfactory.config import ConfigError, did_you_mean
from rlfactory.imports import import_module_named, import_ref

T = TypeVar("T")
F = TypeVar("F")

__all__ = ["Registry"]


def _origin(obj: Any) -> str:
    return getattr(obj, "__module__", None) or type(obj).__name__


class Registry(Mapping[str, T], Generic[T]):
    """Names -> entries. `what` names the kind of thing in errors ("policy loss"); `key` is the
    config key errors start with ("" when a config validator adds it); `kind` is "function" or
    "class": what a `module:attr` must name. `adopt(obj, name)` turns a registered or imported
    object into the stored entry (default: the object itself). `lazy` maps built-in names to the
    `module:attr` imported on first use (the module may register the name itself). `remember_refs`:
    a `module:attr` is registered under that spec once resolved (so `resolve` returns a name the
    registry holds); else it is imported on every lookup and never listed."""

    def __init__(self, what: str, key: str = "", kind: str = "function", *,
                 adopt: Callable[[Any, str], T] | None = None, lazy: Mapping[str, str] | None = None,
                 remember_refs: bool = True) -> None:
        if kind not in ("function", "class"):
            raise ValueError(f"kind must be 'function' or 'class', got {kind!r}")
        self.what, self.key, self.kind = what, key, kind
        self._adopt = adopt
        self._lazy = dict(lazy or {})
        self._remember = remember_refs
        self._entries: dict[str, T] = {}
        self._objects: dict[str, Any] = {}

    # -- the mapping of registered names ----------------------------------------------------------
    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    # -- registering ------------------------------------------------------------------------------
    def add(self, name: str, obj: Any, entry: T | None = None) -> None:
        """Register `obj` as `name` (its entry: `entry`, else `adopt(obj, name)`, else `obj`). A name
        already registered to another object is a ValueError (two modules fighting over a name)."""
        old = self._objects.get(name)
        if old is not None and old is not obj:
            raise ValueError(f"{self.what} {name!r} is already registered (by {_origin(old)})")
        self._objects[name] = obj
        if entry is None:
            entry = self._adopt(obj, name) if self._adopt is not None else obj
        self._entries[name] = entry

    def register(self, name: str, *aliases: str) -> Callable[[F], F]:
        """Decorator: register the decorated function or class as `name` (and `aliases`)."""

        def deco(obj: F) -> F:
            for n in (name, *aliases):
                self.add(n, obj)
            return obj

        return deco

    # -- looking up -------------------------------------------------------------------------------
    def names(self) -> list[str]:
        """Every name a config can use without `module:attr`: registered and built-in."""
        return sorted(set(self._entries) | set(self._lazy))

    def resolve(self, name: str) -> str:
        """The registered name for `name`: a registered name as it is; a built-in once its module is
        imported; for `module:attr` the module is imported first (it may register names), then
        `attr` when it is now registered, else the spec itself, whose imported object is then
        registered under it (unless `remember_refs` is off). An unknown name is a ConfigError."""
        return self._find(name)[0]

    def lookup(self, name: str) -> T:
        """The entry for `name` (see `resolve`)."""
        return self._find(name)[1]

    def _find(self, name: str) -> tuple[str, T]:
        if name in self._entries:
            return name, self._entries[name]
        if name in self._lazy:
            ref = self._lazy[name]
            import_module_named(ref.partition(":")[0], self._key_for(name))  # it may register `name`
            if name not in self._entries:
                self.add(name, self._import(ref, name))
            return name, self._entries[name]
        if ":" in name:
            module, _, attr = name.partition(":")
            if module:
                import_module_named(module, self._key_for(name))  # it may register `attr`
            if attr in self._entries:
                return attr, self._entries[attr]
            obj = self._import(name, name)
            if not self._remember:
                return name, (self._adopt(obj, name) if self._adopt is not None else obj)
            self.add(name, obj)
            return name, self._entries[name]
        raise self.unknown(name)

    def unknown(self, name: str, known: Iterable[str] | None = None, hint: str = "") -> ConfigError:
        """The one-line error for a name nobody registered: the closest known name, the known names,
        and `hint` (what else the user may have meant to do)."""
        names = sorted(known) if known is not None else self.names()
        prefix = f"{self.key}: " if self.key else ""
        return ConfigError(f"{prefix}unknown {self.what} {name!r}{did_you_mean(name, names)} "
                           f"(known: {', '.join(names) or 'none'}; or module:{self.kind}){hint}")

    # -- helpers ----------------------------------------------------------------------------------
    def _key_for(self, name: str) -> str:
        """The key import errors start with: the config key, else what is being imported."""
        return self.key or f"{self.what} {name!r}"

    def _import(self, ref: str, name: str) -> Any:
        obj = import_ref(ref, self._key_for(name), self.kind)
        if self.kind == "class" and not isinstance(obj, type):
            raise ConfigError(f"{self._key_for(name)}: {ref!r} is not a class (it is of type {type(obj).__name__})")
        if self.kind == "function" and not callable(obj):
            raise ConfigError(f"{self._key_for(name)}: {ref!r} is not a function (it is of type {type(obj).__name__})")
        return obj
