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


@pytest.mark.parametrize("override", [
    "rollout.max_new_tokens=0", "rollout.max_calls_per_turn=0", "rollout.max_turns=0", "rollout.max_concurrent=-1",
    "algo.group_size=0", "algo.epochs=0", "algo.minibatch_size=0", "trainer.keep_last=0",
])
def test_a_count_below_one_names_its_key(tmp_path, override):
    p = write(tmp_path, "{}\n")
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key} must be >= 1") as e:
        load_config(RunConfig, p, [override])
    assert str(p) in str(e.value)


def test_an_unset_optional_count_passes():
    cfg = RunConfig.model_validate({"rollout": {"max_turns": None, "max_concurrent": None},
                                    "algo": {"minibatch_size": None}})
    assert cfg.rollout.max_turns is None and cfg.algo.minibatch_size is None
