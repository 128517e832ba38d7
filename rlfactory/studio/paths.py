"""Path checks: nothing the browser names may point outside the folders the studio serves."""

from __future__ import annotations

from pathlib import Path


class BadPath(ValueError):
    """A path from a request that is not allowed (outside the served folders, or missing)."""


def inside(root: Path, relative: str, *, must_exist: bool = True) -> Path:
    """`root / relative`, resolved (symlinks too), refused unless it stays within `root`."""
    if not isinstance(relative, str) or "\x00" in relative:
        raise BadPath("bad path")
    root = root.resolve()
    target = (root / relative.lstrip("/")).resolve()
    if target != root and not target.is_relative_to(root):
        raise BadPath(f"{relative!r} is outside {root}")
    if must_exist and not target.exists():
        raise BadPath(f"{relative!r} does not exist under {root}")
    return target


def within_any(roots: list[Path], path: str, *, must_exist: bool = True) -> Path:
    """An absolute path, or one relative to the first root, that lies inside one of `roots`."""
    if not isinstance(path, str) or not path.strip() or "\x00" in path:
        raise BadPath("no path given")
    p = Path(path).expanduser()
    target = (p if p.is_absolute() else roots[0] / p).resolve()
    if not any(target == r.resolve() or target.is_relative_to(r.resolve()) for r in roots):
        raise BadPath(f"{path!r} is outside the folders the studio serves ({', '.join(str(r) for r in roots)})")
    if must_exist and not target.exists():
        raise BadPath(f"{path!r} not found")
    return target


def safe_name(name: str, what: str = "name") -> str:
    """A plain file/folder name: letters, digits, `-`, `_`, `.`; no leading dot, no separators."""
    name = (name or "").strip()
    ok = name and len(name) <= 100 and not name.startswith(".") and all(c.isalnum() or c in "-_." for c in name)
    if not ok:
        raise BadPath(f"{what} {name!r}: use letters, digits, '-', '_' or '.' (not starting with '.')")
    return name
