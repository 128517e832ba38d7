"""The `trainer.kernels` section: defaults that change nothing on the CPU, and one-line errors."""

from __future__ import annotations

import pytest

from rlfactory.config import ConfigError, RunConfig, load_config


def _write(tmp_path, text: str):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_defaults_are_auto_and_overrides_reach_the_section(tmp_path):
    cfg = load_config(RunConfig, _write(tmp_path, "trainer: {steps: 1}\n"),
                      ["trainer.kernels.fused_head=on", "trainer.kernels.head_chunk_tokens=64"])
    k = cfg.trainer.kernels
    assert (k.fused_head, k.head_chunk_tokens, k.liger, k.packed, k.compile) == ("on", 64, "auto", "auto", False)


@pytest.mark.parametrize("text, needle", [
    ("trainer: {kernels: {head_chunk_tokens: 0}}\n", "head_chunk_tokens must be >= 1"),
    ("trainer: {kernels: {liger: yes_please}}\n", "liger"),
    ("trainer: {kernels: {fused_hed: on}}\n", "fused_head"),  # did you mean
    ("trainer: {kernels: {compile: maybe}}\n", "compile"),
])
def test_bad_values_name_the_key(tmp_path, text, needle):
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, _write(tmp_path, text))
    assert needle in str(err.value)


def test_yaml_on_and_off_are_the_switch_values_not_booleans(tmp_path):
    # PyYAML reads bare on/off as true/false; the section takes them as the words.
    cfg = load_config(RunConfig, _write(tmp_path, "trainer: {kernels: {liger: off, fused_head: on, packed: false}}\n"))
    assert (cfg.trainer.kernels.liger, cfg.trainer.kernels.fused_head, cfg.trainer.kernels.packed) == ("off", "on", "off")
