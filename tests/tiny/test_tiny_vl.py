"""rlfactory's tiny vision-language model (`tiny-vl:1m`): made offline, deterministic by seed, cached,
loaded through `model.path` by the same code as a real Qwen2.5-VL checkpoint folder."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from PIL import Image as PILImage
from safetensors.torch import load_file
from transformers import AutoImageProcessor, Qwen2_5_VLForConditionalGeneration

from rlfactory.chat.qwen_vl import QwenVLToolManager
from rlfactory.config import ConfigError, ModelConfig
from rlfactory.images import image_from_pil
from rlfactory.generation.model_source import check_model_path, load_model
from rlfactory.tiny import resolve_model
from rlfactory.tiny.vl import VISION_TOKENS, make_tiny_vl_model, parse_tiny_vl_spec

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLFACTORY_CACHE", str(root))
        yield root


def test_model_path_tiny_vl_is_made_once_and_loads_as_qwen2_5_vl(cache):
    model, tok = load_model(ModelConfig(path="tiny-vl:1m"))
    folder = cache / "tiny-vl-1m-seed0"
    assert isinstance(model, Qwen2_5_VLForConditionalGeneration) and not model.training
    assert resolve_model("tiny-vl:1m") == str(folder)
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("tiny-vl:1m") == str(folder) and (folder / "model.safetensors").stat().st_mtime_ns == stamp
    n = sum(p.numel() for p in model.parameters())
    assert 0.5e6 <= n <= 2e6, n
    assert all(len(tok.encode(t, add_special_tokens=False)) == 1 for t in VISION_TOKENS)
    assert model.config.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")
    assert model.config.text_config.vocab_size == len(tok)
    proc = AutoImageProcessor.from_pretrained(folder)
    assert (proc.patch_size, proc.merge_size) == (4, 2)
    pre = json.loads((folder / "preprocessor_config.json").read_text())
    assert pre["image_processor_type"] == "Qwen2VLImageProcessor"
    # Text-only generation runs as for any causal LM.
    ids = torch.tensor([tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")])
    out = model.generate(input_ids=ids, max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] <= ids.shape[1] + 3


def test_the_same_seed_makes_the_same_model_and_another_seed_another(tmp_path):
    a = make_tiny_vl_model(tmp_path / "a", seed=0)
    b = make_tiny_vl_model(tmp_path / "b", seed=0)
    c = make_tiny_vl_model(tmp_path / "c", seed=1)
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    wa, wb, wc = (load_file(p / "model.safetensors") for p in (a, b, c))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(not torch.equal(wa[k], wc[k]) for k in wa)


def test_a_checkpoint_folder_loads_through_the_same_code(cache, tmp_path):
    folder = tmp_path / "my-qwen2.5-vl"
    shutil.copytree(resolve_model("tiny-vl:1m"), folder)
    model, tok = load_model(ModelConfig(path=str(folder)))
    assert isinstance(model, Qwen2_5_VLForConditionalGeneration)
    tm = QwenVLToolManager(tok)  # the image processor comes from the folder
    r = tm.render_prompt_images([{"role": "user", "content": [
        {"type": "image", "image": image_from_pil(PILImage.new("RGB", (24, 24), (9, 9, 9)))}]}], [])
    with torch.no_grad():
        logits = model(**tm.model_inputs(r.ids, r.images)).logits
    assert logits.shape[1] == len(r.ids)


def test_bad_specs_are_one_line():
    assert parse_tiny_vl_spec("tiny-vl:1m:7") == ("1m", 7)
    assert parse_tiny_vl_spec("tiny:1m") is None
    for bad in ("tiny-vl:2m", "tiny-vl:1m:x"):
        with pytest.raises(ConfigError, match="tiny-vl") as e:
            check_model_path(bad)
        assert "\n" not in str(e.value)


def test_make_tiny_model_vl_writes_the_folder(tmp_path, capsys):
    from rlfactory.cli.main import main

    assert main(["make-tiny-model", "--vl", "--out", str(tmp_path / "vl")]) == 0
    assert "tiny vision-language model (1m, seed 0, 1,2" in capsys.readouterr().out
    assert (tmp_path / "vl" / "preprocessor_config.json").is_file()
    assert main(["make-tiny-model", "--vl", "--size", "10m", "--out", str(tmp_path / "no")]) == 2
    assert "no tiny vision-language model of size '10m'" in capsys.readouterr().out


def test_the_studio_finds_a_tiny_vl_runs_tokenizer_without_building_anything(cache, tmp_path):
    from rlfactory.studio.tokens import tokenizer_folder
    from rlfactory.tiny.cache import cached_dir

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model:\n  path: tiny-vl:1m:5\n")
    assert tokenizer_folder(run) is None and cached_dir("tiny-vl:1m:5") is None  # not made: none, nothing built
    assert not (cache / "tiny-vl-1m-seed5").exists()
    resolve_model("tiny-vl:1m")
    (run / "config.yaml").write_text("model:\n  path: tiny-vl:1m\n")
    assert tokenizer_folder(run) == cache / "tiny-vl-1m-seed0" == cached_dir("tiny-vl:1m")
    assert cached_dir("tiny-vl:9m") is None and cached_dir("elsewhere") is None
