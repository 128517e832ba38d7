"""Naming an algorithm piece from a config: a registered name, or `module:function`."""

from __future__ import annotations

import importlib
from typing import Callable


def import_named(spec: str, registry: dict[str, object], what: str) -> tuple[str | None, Callable | None]:
    """Import the module of `spec` (`module:name`), which registers whatever it decorates. Returns
    (name, None) when `name` is registered now, else (None, the module's attribute `name`).
    ValueError when the module cannot be imported or has no such attribute."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"{what} {spec!r}: expected a registered name or `module:function`")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"{what} {spec!r}: cannot import module {module!r} ({e})") from e
    if attr in registry:
        return attr, None
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise ValueError(f"{what} {spec!r}: module {module!r} has no function or registered name {attr!r}")
    return None, fn
