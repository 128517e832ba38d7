"""A vision-language model saved by `rlfactory sft` or in a GRPO checkpoint keeps its image
processor (`preprocessor_config.json`) beside its tokenizer, so the saved folder loads as the
warm start or the trained model (issue 31: the visual demo evaluates and trains from them)."""

from __future__ import annotations

import pytest
from transformers import AutoModelForImageTextToText, AutoTokenizer

from rlfactory.chat.qwen_vl import PROCESSOR_FILE, QwenVLToolManager, save_image_processor
from rlfactory.train.checkpoint import CheckpointMeta, latest_checkpoint, save_checkpoint
from rlfactory.train.sft import save_model_atomically
from rlfactory.tiny.vl import make_tiny_vl_model


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    folder = make_tiny_vl_model(tmp_path_factory.mktemp("vl") / "m", "1m", seed=0)
    return AutoModelForImageTextToText.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)


def test_the_sft_model_folder_loads_with_its_image_processor(vl, tmp_path):
    model, tok = vl
    out = save_model_atomically(model, tok, tmp_path / "sft" / "model")
    assert (out / PROCESSOR_FILE).is_file()
    tm = QwenVLToolManager(AutoTokenizer.from_pretrained(out))  # raised a ConfigError before
    assert tm.image_processor.patch_size == 4


def test_a_checkpoint_model_folder_loads_with_its_image_processor(vl, tmp_path):
    model, tok = vl
    save_checkpoint(tmp_path / "run", CheckpointMeta(step=1, policy_version=1, data_position=0, seed=0),
                    model, tok, {}, keep_last=1)
    folder = latest_checkpoint(tmp_path / "run") / "model"
    assert (folder / PROCESSOR_FILE).is_file()
    QwenVLToolManager(AutoTokenizer.from_pretrained(folder))
    # and from there on: a model saved from a checkpoint's tokenizer keeps it too
    again = save_model_atomically(model, AutoTokenizer.from_pretrained(folder), tmp_path / "again")
    assert (again / PROCESSOR_FILE).read_text() == (folder / PROCESSOR_FILE).read_text()


def test_a_text_only_tokenizer_has_nothing_to_copy(tiny, tmp_path):
    _, tok = tiny
    assert save_image_processor(tok, tmp_path) is False
    assert not (tmp_path / PROCESSOR_FILE).exists()
