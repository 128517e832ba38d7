import pytest

from rlfactory.config import ConfigError, RunConfig, apply_overrides, load_config


def write(tmp_path, text, name="run.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_loads_yaml_and_applies_dotted_overrides(tmp_path):
    p = write(tmp_path, "trainer:\n  lr: 0.001\ntools:\n  timeout_s: 3\n")
    cfg = load_config(RunConfig, p, ["trainer.lr=1e-5", "tools.timeout_s=5"])
    assert cfg.trainer.lr == 1e-5
    assert cfg.tools.timeout_s == 5.0


def test_unknown_key_names_key_and_file(tmp_path):
    p = write(tmp_path, "trainer:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError) as e:
        load_config(RunConfig, p)
    assert "trainer.lrr" in str(e.value) and "unknown key" in str(e.value) and str(p) in str(e.value)


def test_wrong_type_names_key(tmp_path):
    p = write(tmp_path, "trainer:\n  steps: many\n")
    with pytest.raises(ConfigError) as e:
        load_config(RunConfig, p)
    assert "trainer.steps" in str(e.value) and str(p) in str(e.value)


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(RunConfig, tmp_path / "nope.yaml")


def test_override_without_equals_is_an_error():
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        apply_overrides({}, ["trainer.lr"])


def test_override_into_scalar_is_an_error():
    with pytest.raises(ConfigError, match="not a section"):
        apply_overrides({"trainer": 3}, ["trainer.lr=1"])
