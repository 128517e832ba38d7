"""Lazy exports for a package's `__init__`: `from pkg import Name` imports the submodule that
defines `Name` only when the name is first asked for, so importing the package stays cheap (a
process that needs `ConfigError` builds no pydantic model; `import rlfactory.tools.base` loads no
mcp). Imports nothing of rlfactory, so any package at any layer can use it.

    __getattr__, __dir__, __all__ = lazy_exports(__name__, {"ToolRunner": "runner"}, globals())
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Iterable, Mapping


def lazy_exports(package: str, where: Mapping[str, str], namespace: dict[str, Any],
                 eager: Iterable[str] = ()) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """The module-level `__getattr__` and `__dir__` of `package`, and its `__all__`.

    `where` maps each lazy name to the submodule (relative to `package`) that defines it; the
    first look-up imports it and stores the value in `namespace` (the package's `globals()`), so
    later look-ups do not come back here. `eager` names what the package imports itself; they
    join `__all__`."""
    names = sorted({*eager, *where})

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return names

    return __getattr__, __dir__, names
