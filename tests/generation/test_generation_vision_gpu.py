"""On a CUDA device (skipped without one; issue 31): a Qwen2.5-VL checkpoint folder (rlfactory's
tiny-vl:1m, written as a real checkpoint's files) loads through `model.path` with the loading code
every command uses, and the local generator's multi-turn image trajectories there (vision prefill,
3-D M-RoPE, kept caches) sample tokens whose logprobs equal the trainer's batched forward on the
same GPU with the same pixels."""

from __future__ import annotations

import pytest
import torch

from rlfactory.chat.qwen_vl import QwenVLToolManager
from rlfactory.config import ModelConfig
from rlfactory.generation.model_source import load_model
from rlfactory.train.batch import collate
from rlfactory.train.logprobs import batched_logprobs
from test_generation_vision import rollouts
from vl_parts import tiny_vl

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_a_vl_checkpoint_folder_samples_on_the_gpu_with_the_trainers_logprobs(tmp_path):
    _, _, folder = tiny_vl(tmp_path / "m")
    model, tokenizer = load_model(ModelConfig(path=str(folder)), "cuda")
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration" and model.device.type == "cuda"
    tm = QwenVLToolManager(tokenizer, enable_thinking=False)
    trajs, grids, _ = rollouts(model, tm, session=True, device="cuda")
    assert grids  # the vision tower ran, on the GPU
    sampled = [torch.tensor([x for s in t.segments if s.role == "model" for x in s.logprobs]) for t in trajs]
    with torch.no_grad():
        batch = collate(trajs, pad_id=0, pixels=tm).to("cuda")
        batched = batched_logprobs(model, batch, None).float().cpu()
    mask = batch.loss_mask.bool().cpu()
    for b, got in enumerate(sampled):
        torch.testing.assert_close(got, batched[b][mask[b]], atol=1e-3, rtol=1e-3)
