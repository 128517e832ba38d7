"""scripts/count_dynamic.py: the counts issue 27 reports before and after (Any, getattr with a
default, hasattr)."""

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "count_dynamic", Path(__file__).resolve().parents[1] / "scripts" / "count_dynamic.py")
count_dynamic = importlib.util.module_from_spec(_spec)
sys.modules["count_dynamic"] = count_dynamic  # dataclasses look their module up there
_spec.loader.exec_module(count_dynamic)

SOURCE = '''
from typing import Any, Optional
import typing

def f(cfg: Any, rows: list[dict[str, Any]], n: int, *rest: Any, opt: "Any | None" = None) -> Any:
    x: typing.Any = getattr(cfg, "a", None)
    y: Optional[int] = getattr(cfg, "b")
    return hasattr(x, "c") and hasattr(y, "d")

async def g(v: Any | None, w: "dict[str, Any]") -> int:
    return getattr(v, "z", 0)
'''


def test_counts_on_a_known_snippet():
    c = count_dynamic.count_source(SOURCE)
    # f: cfg, rows, rest, opt, return, x  ->  6 mention Any (rows is not bare); g: v, w -> 2
    assert c.any_annotations == 8
    assert c.bare_any == 6  # cfg, rest, opt, return, x, v
    assert c.getattr_default == 2  # the two-argument getattr is not a probe with a default
    assert c.hasattr == 2


def test_package_of_names_the_folder_under_rlfactory():
    assert count_dynamic.package_of("rlfactory/rollout/engine.py") == "rollout"
    assert count_dynamic.package_of("rlfactory/envs/search/bm25.py") == "envs"
    assert count_dynamic.package_of("rlfactory/config.py") == "(top level)"
