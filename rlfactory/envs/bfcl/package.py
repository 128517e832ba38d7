"""The `bfcl-eval` package (BFCL's data, AST checker, prompts and multi-turn backends), imported once.

rlfactory installs `bfcl-eval` with `--no-deps` (scripts/setup.sh): its declared dependencies pull
every API SDK its leaderboard can call (anthropic, mistralai, cohere, google-genai, qwen-agent,
writer-sdk, boto3, sentence-transformers, faiss) and pin numpy 1.26. The modules used here need only
filelock, tenacity and tree-sitter (its Java/JavaScript call parsers), which the `bfcl` extra lists.

Two things of the package are worked around, nothing of its scoring:
- `bfcl_eval.constants.model_config` imports every model handler (and so every SDK) only to tell
  the AST checker whether a model's API turned `.` in function names into `_`
  (`underscore_to_dot`). rlfactory passes function names to the chat template unchanged, so a
  module holding one entry, `rlfactory` -> underscore_to_dot False, stands in for it when the real
  one cannot be imported.
- Its constants create result/score/lock folders at import under `BFCL_PROJECT_ROOT` (by default
  beside site-packages): rlfactory points that at a cache folder of its own unless it is set.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODEL_NAME = "rlfactory"
"""The model name rlfactory passes to BFCL's checkers (their per-model switches: none apply)."""

INSTALL_HINT = ("the bfcl env needs the bfcl-eval package: pip install --no-deps 'bfcl-eval==2026.3.23' "
                "plus rlfactory's `bfcl` extra (pip install -e '.[bfcl]'; scripts/setup.sh does both)")


@dataclass(frozen=True)
class _NameConfig:
    underscore_to_dot: bool = False


def _shim_model_config() -> None:
    name = "bfcl_eval.constants.model_config"
    if name in sys.modules and MODEL_NAME in getattr(sys.modules[name], "MODEL_CONFIG_MAPPING", {}):
        return
    try:
        real = importlib.import_module(name)
        real.MODEL_CONFIG_MAPPING[MODEL_NAME] = _NameConfig()
        return
    except ImportError:  # an SDK the handlers import is missing (the usual --no-deps install)
        sys.modules.pop(name, None)
    shim = types.ModuleType(name)
    shim.__doc__ = "rlfactory's stand-in (rlfactory/envs/bfcl/package.py): the checker's one use of it."
    shim.MODEL_CONFIG_MAPPING = {MODEL_NAME: _NameConfig()}  # type: ignore[attr-defined]
    sys.modules[name] = shim
    sys.modules["bfcl_eval.constants"].model_config = shim  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Bfcl:
    """The parts of bfcl-eval rlfactory calls (modules, so their own functions run)."""

    utils: Any  # bfcl_eval.utils: load_dataset_entry, load_ground_truth_entry, is_* predicates
    categories: Any  # bfcl_eval.constants.category_mapping
    ast: Any  # bfcl_eval.eval_checker.ast_eval.ast_checker
    handler_utils: Any  # bfcl_eval.model_handler.utils: prompts, decoders, convert_to_tool
    enums: Any  # bfcl_eval.constants.enums: Language, ReturnFormat, ModelStyle
    type_mappings: Any  # bfcl_eval.constants.type_mappings: GORILLA_TO_OPENAPI
    summary: Any  # bfcl_eval.eval_checker.eval_runner_helper: calculate_(un)weighted_accuracy
    multi_turn: Any  # bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker
    prompts: Any  # bfcl_eval.constants.default_prompts: MAXIMUM_STEP_LIMIT, the miss-func user prompts


_LOADED: Bfcl | None = None


def bfcl() -> Bfcl:
    """Import bfcl-eval (once); ImportError with one line saying how to install it."""
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rlfactory" / "bfcl"
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(root))
    try:
        importlib.import_module("bfcl_eval.constants")
        _shim_model_config()
        mods = [importlib.import_module(f"bfcl_eval.{m}") for m in (
            "utils", "constants.category_mapping", "eval_checker.ast_eval.ast_checker", "model_handler.utils",
            "constants.enums", "constants.type_mappings", "eval_checker.eval_runner_helper",
            "eval_checker.multi_turn_eval.multi_turn_checker", "constants.default_prompts")]
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({type(e).__name__}: {e})") from e
    _LOADED = Bfcl(*mods)
    return _LOADED
