"""A vision-language model folder without its image processor (issue 31): `rlfactory serve` and the
VL ToolManager that every loading path builds (serve, rollout, train) end with one config-error
line naming the folder and `preprocessor_config.json` (before: a ValueError traceback)."""

from __future__ import annotations

import shutil

import pytest
from transformers import AutoTokenizer

from rlfactory.chat.qwen_vl import QwenVLToolManager
from rlfactory.cli.main import main
from rlfactory.config import ConfigError
from rlfactory.tiny import resolve_model


@pytest.fixture()
def folder(tmp_path):
    """tiny-vl:1m's folder, copied without preprocessor_config.json."""
    out = tmp_path / "vl model"
    shutil.copytree(resolve_model("tiny-vl:1m"), out)
    (out / "preprocessor_config.json").unlink()
    return out


def test_serve_on_a_vl_folder_without_its_image_processor_is_one_line(folder, capsys):
    assert main(["serve", str(folder), "--port", "0", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    ours = [line for line in err.splitlines() if line.startswith("rlfactory")]
    assert "Traceback" not in err and len(ours) == 1
    assert ours[0].startswith("rlfactory: config error: ")
    assert f"{str(folder)!r} has no preprocessor_config.json" in ours[0]


def test_the_vl_tool_manager_names_the_folder_and_the_missing_or_unreadable_file(folder):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with pytest.raises(ConfigError, match="has no preprocessor_config.json") as missing:
        QwenVLToolManager(tokenizer)
    (folder / "preprocessor_config.json").write_text("{")
    with pytest.raises(ConfigError, match="not a valid JSON file") as broken:
        QwenVLToolManager(tokenizer)
    for e in (missing, broken):
        assert str(folder) in str(e.value) and "\n" not in str(e.value)
