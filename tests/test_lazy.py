"""rlfactory/lazy.py: a package's names import their submodule on first use, once."""

from __future__ import annotations

import subprocess
import sys

import pytest

import rlfactory.config
import rlfactory.tools


def test_a_name_imports_its_submodule_only_when_asked_for():
    """In a fresh interpreter: importing the packages loads none of the lazy submodules; asking
    for a name loads its own and stores it, so the package's __getattr__ is not asked again."""
    code = (
        "import sys, rlfactory.config, rlfactory.tools\n"
        "assert 'rlfactory.config.run' not in sys.modules and 'rlfactory.tools.runner' not in sys.modules\n"
        "from rlfactory.tools import ToolRunner\n"
        "assert 'rlfactory.tools.runner' in sys.modules and 'rlfactory.config.run' not in sys.modules\n"
        "assert vars(rlfactory.tools)['ToolRunner'] is ToolRunner\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_an_unknown_name_is_an_attribute_error_naming_the_package():
    with pytest.raises(AttributeError, match=r"module 'rlfactory.config' has no attribute 'RunConfg'"):
        rlfactory.config.RunConfg  # noqa: B018
    with pytest.raises(ImportError):
        from rlfactory.tools import NoSuchTool  # noqa: F401


def test_dir_and_all_list_the_eager_and_the_lazy_names():
    assert {"ConfigError", "load_config", "RunConfig", "SamplingConfig"} <= set(rlfactory.config.__all__)
    assert dir(rlfactory.config) == rlfactory.config.__all__ == sorted(rlfactory.config.__all__)
    assert {"Tool", "ToolRunner", "function_tool"} <= set(dir(rlfactory.tools))
