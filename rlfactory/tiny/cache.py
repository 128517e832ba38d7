"""`resolve_model`: turn `tiny:1m` / `tiny:10m` (their copy-pretrained `tiny:1m-copy` / `tiny:10m-copy`,
rlfactory/tiny/pretrain.py, and `tiny-vl:1m`) into a cached directory, made on first use.

Cache: `$RLFACTORY_CACHE/tiny-<size>-seed<seed>` when RLFACTORY_CACHE is set, else
`~/.cache/rlfactory/tiny-<size>-seed<seed>`. Concurrent callers (threads, processes) are safe: one
holds an exclusive file lock while it builds into a temporary directory, which is renamed into
place only when complete; the others wait on the lock and then find the finished directory.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Callable

from rlfactory.tiny.model import MARKER, RECIPE_VERSION, SIZES, make_tiny_model
from rlfactory.tiny.pretrain import COPY_SUFFIX, CopyRecipe, is_current_copy, make_copy_model
from rlfactory.tiny.vl import is_current_vl, make_tiny_vl_model, parse_tiny_vl_spec

_thread_lock = threading.Lock()  # flock is per open file, so also serialise threads of one process


def cache_root() -> Path:
    env = os.environ.get("RLFACTORY_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rlfactory"


TINY_NAMES = sorted(SIZES) + sorted(s + COPY_SUFFIX for s in SIZES)
"""What may follow `tiny:`: a size (random weights) or a size with `-copy` (pretrained to copy)."""


def parse_tiny_spec(spec: str) -> tuple[str, int] | None:
    """`tiny:1m` -> ("1m", 0); `tiny:10m:3` -> ("10m", 3); `tiny:1m-copy` -> ("1m-copy", 0);
    anything not starting `tiny:` -> None."""
    if not spec.startswith("tiny:"):
        return None
    parts = spec.split(":")
    if len(parts) not in (2, 3) or parts[1] not in TINY_NAMES:
        raise ValueError(f"bad tiny model spec {spec!r}: use tiny:<size>[:<seed>], size one of {TINY_NAMES}")
    try:
        seed = int(parts[2]) if len(parts) == 3 else 0
    except ValueError:
        raise ValueError(f"bad tiny model spec {spec!r}: the seed must be an integer") from None
    return parts[1], seed


def tiny_dir(size: str, seed: int = 0) -> Path:
    return cache_root() / f"tiny-{size}-seed{seed}"


def _is_current(path: Path) -> bool:
    try:
        return json.loads((path / MARKER).read_text()).get("recipe_version") == RECIPE_VERSION
    except (OSError, ValueError):
        return False


def ensure_tiny(size: str, seed: int = 0, copy_recipe: CopyRecipe | None = None) -> Path:
    """The cached tiny model directory for (size, seed), built if missing or from an older recipe;
    a `-copy` size is the plain size's model (built first when missing) after the copy pretraining
    (`copy_recipe`, default CopyRecipe(); a smaller one for tests)."""
    if size.endswith(COPY_SUFFIX):
        plain = size[: -len(COPY_SUFFIX)]
        base = ensure_tiny(plain, seed)  # first, outside the copy's lock (the thread lock is not re-entrant)
        recipe = copy_recipe or CopyRecipe()
        return build_once(tiny_dir(size, seed), lambda out: make_copy_model(out, base, plain, seed, recipe),
                          is_current_copy)
    return build_once(tiny_dir(size, seed), lambda out: make_tiny_model(out, size=size, seed=seed), _is_current)


def tiny_vl_dir(size: str, seed: int = 0) -> Path:
    return cache_root() / f"tiny-vl-{size}-seed{seed}"


def ensure_tiny_vl(size: str, seed: int = 0) -> Path:
    """The cached tiny vision-language model folder (`tiny-vl:<size>[:<seed>]`, rlfactory/tiny/vl.py)."""
    return build_once(tiny_vl_dir(size, seed),
                      lambda out: make_tiny_vl_model(out, size=size, seed=seed), is_current_vl)


def cached_dir(spec: str) -> Path | None:
    """The cache folder of a `tiny:` or `tiny-vl:` spec when it is already built (nothing is made);
    None for any other string, a bad spec, or a model not made yet."""
    try:
        vl = parse_tiny_vl_spec(spec)
        tiny = None if vl is not None else parse_tiny_spec(spec)
    except ValueError:
        return None
    folder = tiny_vl_dir(*vl) if vl is not None else tiny_dir(*tiny) if tiny is not None else None
    return folder if folder is not None and folder.is_dir() else None


def build_once(final: Path, build: Callable[[Path], object], is_current: Callable[[Path], bool] | None = None) -> Path:
    """`final`, built by `build(tmp_dir)` unless it exists (and `is_current(final)`, when given).

    Safe for concurrent threads and processes: one builds into a temporary sibling under an
    exclusive file lock and renames it into place when complete; the others wait and reuse it."""
    current = is_current or (lambda p: p.is_dir())
    if current(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _thread_lock, open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if current(final):  # someone else built it while we waited
                return final
            tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary model directory
            try:
                build(tmp)
                if final.exists():  # an older recipe: move it aside, then drop it
                    old = final.with_name(f".{final.name}.old-{os.getpid()}")
                    os.rename(final, old)
                    shutil.rmtree(old, ignore_errors=True)
                os.rename(tmp, final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return final


def resolve_model(path_or_spec: str) -> str:
    """A loadable model directory: `tiny:<size>[:<seed>]` and `tiny-vl:<size>[:<seed>]` resolve to the
    cache; other strings pass through."""
    vl = parse_tiny_vl_spec(path_or_spec)
    if vl is not None:
        return str(ensure_tiny_vl(*vl))
    parsed = parse_tiny_spec(path_or_spec)
    if parsed is None:
        return path_or_spec
    return str(ensure_tiny(*parsed))
