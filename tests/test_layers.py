"""The layering of ../shared/DESIGN.md ("Packages"), checked on the source: each package imports
only what its row names, and no two files import each other.

Imports are read with `ast` from every file under rlfactory/, wherever they stand (module level,
inside a function, under TYPE_CHECKING): a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "rlfactory"

BOTTOM = {"", "config", "trajectory", "branches", "protocols", "registry", "imports", "lazy", "text", "images"}
"""The bottom of the house: config sections and RunConfig, the Trajectory and its branches, the Protocols, the one
registry and `module:attr` loader, a package's lazy exports, and the small text and image helpers
they share ("" is the package itself, `rlfactory.__version__`)."""

BOTTOM_MAY_NAME = {("rlfactory.config.run", "rlfactory.algos")}
"""The one way out of the bottom: `algo.advantage` and `algo.loss` are checked against algos'
registries when a config is validated (a function-level import; algos is pure functions on torch
and imports only the bottom itself)."""

FORBIDDEN = {
    "rollout": {"rewards", "train", "distributed", "integrations", "studio", "cli"},
    "train": {"distributed", "integrations", "studio", "cli"},
    "serve": {"rollout", "train", "rewards", "envs", "distributed", "integrations", "studio", "cli"},
}
"""Packages a package never imports (besides `cli`, which nothing imports)."""

GENERATION_MAY_IMPORT = BOTTOM | {"generation", "chat", "openmp", "passes", "tiny"}
"""The Generator backends sit just above the bottom: besides it, only chat, the leaf helpers
(OpenMP pool release, micro-batch planning) and the built-in tiny model, never rollout (rollout
imports generation, not the other way round)."""

ONLY_BOTTOM = {"tools", "algos"}
"""Packages that import nothing of rlfactory above the bottom (algos: pure functions on torch,
naming their registries through the bottom's one registry)."""

def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@lru_cache(maxsize=1)
def modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(module: str, node: ast.ImportFrom) -> str | None:
    if node.level == 0:
        return node.module
    base = module.split(".")
    is_package = modules()[module].name == "__init__.py"
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


@lru_cache(maxsize=1)
def imports() -> dict[str, set[str]]:
    """Each rlfactory module -> the rlfactory modules it imports (`from pkg import submodule`
    counts as importing the submodule)."""
    known = modules()
    out: dict[str, set[str]] = {}
    for name, path in known.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(name, node)
                if target is None:
                    continue
                subs = {f"{target}.{a.name}" for a in node.names} & known.keys()
                found |= subs if subs else {target}
        out[name] = {m for m in found if m == "rlfactory" or m.startswith("rlfactory.")} - {name}
    return out


def layer(module: str) -> str:
    """`rlfactory.rollout.engine` -> rollout; `rlfactory.trajectory` -> trajectory."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _violations(rule, allowed: set[tuple[str, str]] = frozenset(),
                graph: dict[str, set[str]] | None = None) -> list[str]:
    graph = imports() if graph is None else graph
    return sorted(f"{m} imports {t}" for m, targets in graph.items() for t in targets
                  if rule(layer(m), layer(t)) and (m, t) not in allowed)


def test_the_bottom_imports_only_the_bottom():
    assert _violations(lambda a, b: a in BOTTOM and b not in BOTTOM, BOTTOM_MAY_NAME) == []


def test_rollout_train_and_serve_do_not_import_upward():
    assert _violations(lambda a, b: b in FORBIDDEN.get(a, ())) == []


def test_generation_imports_only_the_bottom_chat_and_leaf_helpers():
    assert _violations(lambda a, b: a == "generation" and b not in GENERATION_MAY_IMPORT) == []


def test_tools_and_algos_import_only_the_bottom():
    assert _violations(lambda a, b: a in ONLY_BOTTOM and b != a and b not in BOTTOM) == []


def test_nothing_imports_the_cli():
    assert _violations(lambda a, b: b == "cli" and a != "cli") == []


def cycles(graph: dict[str, set[str]] | None = None) -> set[tuple[str, str]]:
    graph = imports() if graph is None else graph
    return {tuple(sorted((a, b))) for a, targets in graph.items() for b in targets if a in graph.get(b, ())}


def test_no_two_files_import_each_other():
    assert sorted(cycles()) == []


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def import_cycles(graph: dict[str, set[str]] | None = None) -> list[tuple[str, ...]]:
    """The groups of modules that reach one another through imports (a cycle of any length, which
    the pairwise check misses: a -> b -> c -> a), leaving out the bottom's one allowed way out
    (BOTTOM_MAY_NAME: algos, checked from config.run, imports the bottom back)."""
    graph = imports() if graph is None else graph
    graph = {m: {t for t in targets if (m, t) not in BOTTOM_MAY_NAME} for m, targets in graph.items()}
    reach = {m: _reachable(graph, m) for m in graph}
    return sorted({tuple(sorted(o for o in reach[m] if m in reach.get(o, ()))) for m in graph if m in reach[m]})


def test_no_import_cycle_of_any_length():
    assert import_cycles() == []


def test_the_cycle_check_sees_a_cycle_through_three_files():
    graph = {"rlfactory.distributed.weights": {"rlfactory.distributed.workers"},
             "rlfactory.distributed.workers": {"rlfactory.distributed.worker"},
             "rlfactory.distributed.worker": {"rlfactory.distributed.weights", "rlfactory.config"},
             "rlfactory.config": set()}
    assert cycles(graph) == set()
    assert import_cycles(graph) == [("rlfactory.distributed.weights", "rlfactory.distributed.worker",
                                     "rlfactory.distributed.workers")]


def test_the_checks_catch_what_they_forbid():
    graph = {"rlfactory.rollout.episode": {"rlfactory.rewards.base", "rlfactory.config"},
             "rlfactory.train.loop": {"rlfactory.train.step"}, "rlfactory.train.step": {"rlfactory.train.loop"},
             "rlfactory.generation.local": {"rlfactory.rollout.engine", "rlfactory.protocols"},
             "rlfactory.serve.gateway": {"rlfactory.train.session", "rlfactory.generation.local",
                                         "rlfactory.rollout.episode"}}
    assert _violations(lambda a, b: b in FORBIDDEN.get(a, ()), graph=graph) == [
        "rlfactory.rollout.episode imports rlfactory.rewards.base", "rlfactory.serve.gateway imports rlfactory.rollout.episode",
        "rlfactory.serve.gateway imports rlfactory.train.session"]
    assert _violations(lambda a, b: a == "generation" and b not in GENERATION_MAY_IMPORT, graph=graph) == [
        "rlfactory.generation.local imports rlfactory.rollout.engine"]
    assert cycles(graph) == {("rlfactory.train.loop", "rlfactory.train.step")}


def test_the_checker_sees_a_lazy_import_and_a_relative_one():
    """The checker itself: imports inside functions and relative imports are found."""
    graph = imports()
    # rlfactory/tools/__init__.py imports its modules lazily by name only; runner imports base
    assert "rlfactory.tools.base" in graph["rlfactory.tools.runner"]
    assert layer("rlfactory.envs.search.bm25") == "envs" and layer("rlfactory.trajectory") == "trajectory"
    tree = ast.parse("def f():\n    from . import base\n")
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    assert _resolve("rlfactory.tools.runner", node) == "rlfactory.tools"


MAX_LINES = 500
"""A file past this is asking to be split along a seam (../shared/STYLE.md)."""


def test_no_file_under_rlfactory_is_over_500_lines():
    sizes = {str(p.relative_to(ROOT.parent)): len(p.read_text(encoding="utf-8").splitlines())
             for p in sorted(ROOT.rglob("*")) if p.suffix in {".py", ".js", ".html", ".css", ".jinja"}}
    assert len(sizes) > 200  # the walk found the package
    assert {f: n for f, n in sizes.items() if n > MAX_LINES} == {}
