"""rlfactory.generation.weights: the one way named weights go into a model (serve's updates, Ray workers)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from rlfactory.generation.weights import WeightsMismatch, load_safetensors_folder, load_weights


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(8, 4)
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 8, bias=False)
        self.head.weight = self.embed.weight  # tied: `head.weight` is an alias, not a parameter of its own


def _new(model: nn.Module, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    return {n: torch.randn(p.shape, dtype=dtype) for n, p in model.named_parameters()}


def test_every_parameter_is_copied_converted_and_a_tied_alias_is_accepted():
    model = Tied()
    new = _new(model)
    assert load_weights(model, {**new, "head.weight": new["embed.weight"]}) == 3
    for n, p in model.named_parameters():
        assert p.dtype == torch.float32 and torch.equal(p, new[n].float())
    assert model.head.weight is model.embed.weight


@pytest.mark.parametrize("edit,words", [
    (lambda t: t.pop("norm.bias"), "1 missing (e.g. ['norm.bias'])"),
    (lambda t: t.update(extra=torch.zeros(2)), "1 unknown (e.g. ['extra'])"),
    (lambda t: t.update({"norm.weight": torch.zeros(3)}),
     "1 with the wrong shape (e.g. ['norm.weight: (3,) != (4,)'])"),
])
def test_a_set_that_does_not_fit_changes_nothing(edit, words):
    model = Tied()
    before = {n: p.clone() for n, p in model.named_parameters()}
    new = _new(model)
    edit(new)
    with pytest.raises(WeightsMismatch) as e:
        load_weights(model, new, "the test model")
    assert str(e.value) == f"the weights do not fit the test model: {words}"
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_a_checkpoint_folder_plain_or_sharded(tmp_path):
    from safetensors.torch import save_file

    model = Tied()
    new = {n: t.float() for n, t in _new(model).items()}
    save_file(new, str(tmp_path / "model.safetensors"))
    assert load_weights(model, load_safetensors_folder(tmp_path)) == 3
    assert torch.equal(model.norm.weight, new["norm.weight"])
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    save_file({"embed.weight": new["embed.weight"]}, str(sharded / "a.safetensors"))
    save_file({k: new[k] for k in ("norm.weight", "norm.bias")}, str(sharded / "b.safetensors"))
    (sharded / "stray.safetensors").write_bytes(b"not read: the index names the shards")
    index = {"weight_map": {"embed.weight": "a.safetensors", "norm.weight": "b.safetensors",
                            "norm.bias": "b.safetensors"}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    assert sorted(load_safetensors_folder(sharded)) == ["embed.weight", "norm.bias", "norm.weight"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no .safetensors files in"):
        load_safetensors_folder(empty)
    with pytest.raises(FileNotFoundError, match="weights folder not found"):
        load_safetensors_folder(tmp_path / "nope")
