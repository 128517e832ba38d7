"""Import what a config names (`module`, `module:attr`), with one-line errors.

Every error is a `ConfigError` that names the config key, says what was not found and, when a
close name exists, suggests it ("did you mean 'WikiEnv'?", from difflib). A module that exists
but fails while importing is reported with its own error and the file and line where it failed,
not as a missing module. Like `rlfactory.config`, this module imports nothing else of rlfactory.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from rlfactory.config import ConfigError, did_you_mean

__all__ = ["did_you_mean", "import_module_named", "import_ref", "make_config_folder_importable", "where"]


def make_config_folder_importable(path: str | Path) -> None:
    """Put the folder of the config file `path` first on sys.path: `tools.python: [module:function]`,
    `env.name: module:Class`, `env.module` and reward terms named `module:function` may live in
    files next to the config."""
    folder = str(Path(path).resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)


_OWN = str(Path(__file__).resolve().parent)


def where(exc: BaseException) -> str:
    """`file:line` where `exc` arose in the user's code: the innermost frame outside rlfactory and
    Python's import machinery (else the innermost frame; a SyntaxError's own location)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"
    theirs = [f for f in frames if not f.filename.startswith(_OWN) and not f.filename.startswith("<frozen")]
    frame = (theirs or frames)[-1]
    return f"{frame.filename}:{frame.lineno}"


def _module_names(parent: str) -> list[str]:
    """Importable module names beside where `parent.x` would be (top level when `parent` is "")."""
    if not parent:
        return [m.name for m in pkgutil.iter_modules()] + list(sys.builtin_module_names)
    try:
        path = getattr(importlib.import_module(parent), "__path__", None)
    except Exception:
        return []
    return [m.name for m in pkgutil.iter_modules(path)] if path else []


def import_module_named(module: str, key: str) -> ModuleType:
    """Import `module` for config key `key`; a ConfigError (one line) when it is missing or broken."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = e.name or module
        if module == missing or module.startswith(missing + "."):
            parent, _, last = missing.rpartition(".")
            hint = did_you_mean(last, _module_names(parent))
            raise ConfigError(
                f"{key}: no module named {missing!r}{hint} (a {last}.py in the config's folder, or an installed package)"
            ) from None
        raise ConfigError(f"{key}: importing {module!r} failed: {type(e).__name__}: {e} ({where(e)})") from None
    except Exception as e:  # the user's module itself raised: name it and where
        raise ConfigError(f"{key}: importing {module!r} failed: {type(e).__name__}: {e} ({where(e)})") from None


def import_ref(spec: str, key: str, what: str = "attribute") -> Any:
    """The object that `module:attr` (attr may be dotted: `module:Class.method`) names, for config
    key `key`; `what` names the kind of object in errors ("class", "function")."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(f"{key}: {spec!r}: expected `module:{what}`")
    obj: Any = import_module_named(module, key)
    where = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            source = getattr(obj, "__file__", None)
            raise ConfigError(f"{key}: {where!r} has no {what} {part!r}{did_you_mean(part, names)}"
                              + (f" ({source})" if source else ""))
        obj = getattr(obj, part)
        where = f"{where}:{part}" if where == module else f"{where}.{part}"
    return obj
