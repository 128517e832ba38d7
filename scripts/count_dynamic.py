"""Count the places where rlfactory's code says less than its types could: `Any` in annotations,
`getattr(x, name, default)` (a capability probe where a Protocol could declare the method) and
`hasattr`, per package. Issue 27 asks for these counts before and after moving types to the bottom.

    python scripts/count_dynamic.py            # a table per package under rlfactory/
    python scripts/count_dynamic.py --files    # per file, most first
    python scripts/count_dynamic.py --rev 89c21c2   # at a commit (read from git, not the work tree)
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "rlfactory"


@dataclass
class Counts:
    any_annotations: int = 0
    """Annotation slots (a parameter, a return, an annotated name) that mention `Any` anywhere
    (`dict[str, Any]` for JSON included)."""
    bare_any: int = 0
    """Of those, the ones that are `Any` itself (or `Any | None`): the value's type is not said at all."""
    getattr_default: int = 0
    """Calls `getattr(x, name, default)`."""
    hasattr: int = 0
    """Calls `hasattr(x, name)`."""

    def add(self, other: "Counts") -> None:
        self.any_annotations += other.any_annotations
        self.bare_any += other.bare_any
        self.getattr_default += other.getattr_default
        self.hasattr += other.hasattr


def _mentions_any(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name) and node.id == "Any":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "Any":
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and re.search(r"\bAny\b", node.value):
            return True  # a quoted annotation such as "dict[str, Any]"
    return False


def _is_bare_any(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return annotation.value.replace(" ", "") in ("Any", "Any|None", "None|Any", "Optional[Any]")
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        sides = (annotation.left, annotation.right)
        return any(_is_bare_any(s) for s in sides) and all(
            _is_bare_any(s) or (isinstance(s, ast.Constant) and s.value is None) for s in sides)
    return (isinstance(annotation, ast.Name) and annotation.id == "Any") or (
        isinstance(annotation, ast.Attribute) and annotation.attr == "Any")


def _annotation(c: "Counts", annotation: ast.expr | None) -> None:
    c.any_annotations += _mentions_any(annotation)
    c.bare_any += _is_bare_any(annotation)


def count_source(source: str) -> Counts:
    """The three counts for one module's source."""
    tree = ast.parse(source)
    c = Counts()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []),
                      *([a.kwarg] if a.kwarg else [])]
            for p in params:
                _annotation(c, p.annotation)
            _annotation(c, node.returns)
        elif isinstance(node, ast.AnnAssign):
            _annotation(c, node.annotation)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "getattr" and len(node.args) == 3:
                c.getattr_default += 1
            elif node.func.id == "hasattr":
                c.hasattr += 1
    return c


def package_of(rel: str) -> str:
    """`rlfactory/<package>/...` -> the package; a module directly under rlfactory/ -> (top level)."""
    parts = rel.split("/")
    return parts[1] if len(parts) > 2 else "(top level)"


def sources(rev: str | None) -> dict[str, str]:
    """Every module under rlfactory/ by its path from the repository root, in the work tree or at `rev`."""
    if rev is None:
        return {str(p.relative_to(ROOT.parent)): p.read_text(encoding="utf-8") for p in sorted(ROOT.rglob("*.py"))}
    git = ["git", "-C", str(ROOT.parent)]
    names = subprocess.run([*git, "ls-tree", "-r", "--name-only", rev, "rlfactory"], check=True,
                           capture_output=True, text=True).stdout.split()
    return {n: subprocess.run([*git, "show", f"{rev}:{n}"], check=True, capture_output=True, text=True).stdout
            for n in names if n.endswith(".py")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", action="store_true", help="per file instead of per package")
    parser.add_argument("--rev", help="count at this git revision instead of the work tree")
    args = parser.parse_args()
    per: dict[str, Counts] = {}
    for rel, text in sources(args.rev).items():
        key = rel if args.files else package_of(rel)
        per.setdefault(key, Counts()).add(count_source(text))
    total = Counts()
    for c in per.values():
        total.add(c)
    rows = sorted(per.items(), key=lambda kv: (-(kv[1].bare_any + kv[1].getattr_default + kv[1].hasattr), kv[0]))
    width = max(len(k) for k in per) + 2
    print(f"{'':<{width}}{'Any':>6}{'bare Any':>10}{'getattr3':>10}{'hasattr':>9}")
    for key, c in rows:
        if c.any_annotations or c.getattr_default or c.hasattr or not args.files:
            print(f"{key:<{width}}{c.any_annotations:>6}{c.bare_any:>10}{c.getattr_default:>10}{c.hasattr:>9}")
    print(f"{'total':<{width}}{total.any_annotations:>6}{total.bare_any:>10}{total.getattr_default:>10}"
          f"{total.hasattr:>9}")


if __name__ == "__main__":
    main()
