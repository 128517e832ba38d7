"""The env registry, the env config section and the example configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlfactory.config import ConfigError, EnvConfig, RunConfig, load_config
from rlfactory.envs import Env, EnvTools, env_from_config, make_env, register_env, registered_envs

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@register_env("test-echo")
class EchoEnv(Env):
    name = "test-echo"

    def __init__(self, greeting: str = "hi") -> None:  # no **options: takes no `family`
        super().__init__()
        self.greeting = greeting

    def reset(self, row):
        return [{"role": "user", "content": f"{self.greeting} {row['q']}"}]

    def tools(self):
        return EnvTools()

    def reward(self):
        raise NotImplementedError

    def load_split(self, split):
        return [{"q": split}]


def test_make_env_by_name_module_class_and_class():
    assert isinstance(make_env("test-echo"), EchoEnv)
    assert make_env(f"{__name__}:EchoEnv", greeting="yo").greeting == "yo"
    assert make_env(EchoEnv).reset({"q": "x"}) == [{"role": "user", "content": "hi x"}]
    assert {"search", "code", "sql", "test-echo"} <= set(registered_envs())
    assert type(make_env("code")).__name__ == "CodeEnv"


def test_unknown_env_and_duplicate_names_are_errors():
    with pytest.raises(ValueError, match="unknown env 'nope'.*search"):
        make_env("nope")
    with pytest.raises(ValueError, match="env.name: no module named .no."):
        make_env("no.such.module:Env")
    with pytest.raises(ValueError, match="already registered"):
        register_env("test-echo")(type("Other", (Env,), {}))
    with pytest.raises(TypeError, match="unknown option"):
        make_env("code", bogus=1)


def test_env_from_config_passes_data_and_family_only_where_accepted(tmp_path):
    data = tmp_path / "train.parquet"
    make_env("code", n_train=3, n_test=1).write_data(str(tmp_path))
    cfg = EnvConfig(name="code", train_data=str(data), options={"seed": 4})
    env = env_from_config(cfg, family="qwen3")
    assert env.family == "qwen3" and env.data["train"] == str(data) and env.seed == 4
    assert isinstance(env_from_config(EnvConfig(name="test-echo"), family="qwen3"), EchoEnv)
    # an explicit option wins over the model's family
    env = env_from_config(EnvConfig(name="code", options={"family": "llama3"}), family="qwen3")
    assert env.family == "llama3"


def test_env_config_paths_are_checked_and_relative_to_the_config(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "train.parquet").write_bytes(b"")
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("env:\n  name: search\n  train_data: d/train.parquet\n")
    assert load_config(RunConfig, cfg_file).env.train_data == str(tmp_path / "d" / "train.parquet")
    cfg_file.write_text("env:\n  name: search\n  test_data: d/missing.parquet\n")
    with pytest.raises(ConfigError, match="env.test_data"):
        load_config(RunConfig, cfg_file)


@pytest.mark.parametrize("name", ["search", "code", "sql"])
def test_example_configs_validate_and_build_their_env(name):
    cfg = load_config(RunConfig, EXAMPLES / f"{name}.yaml")
    assert cfg.env.name == name
    opts = dict(cfg.env.options)
    # build the env the config describes (smaller data so that the test stays fast)
    small = {"search": {"n_train_entities": 10, "n_test_entities": 3}, "code": {"n_train": 10, "n_test": 3},
             "sql": {"n_train_people": 6, "n_test_people": 3}}[name]
    cfg.env.options = {**opts, **small}
    with env_from_config(cfg.env, family=cfg.model.family) as env:
        assert env.max_turns == opts["max_turns"]
        rows = env.load_split("train")
        assert rows and env.reset(rows[0])[-1]["role"] == "user"
        assert env.reward() is not None


class PlainEnv(Env):
    """Keeps Env's constructor: its options arrive in self.options."""

    max_turns = 3

    def reset(self, row):
        return [{"role": "user", "content": self.options.get("greeting", "") + str(row)}]


class DeafEnv(Env):
    """Keeps Env's constructor and never reads self.options: it takes no options."""

    def reset(self, row):
        return [{"role": "user", "content": str(row)}]


def test_options_arrive_in_self_options_and_max_turns_is_the_turn_limit_of_every_env():
    env = make_env(PlainEnv, max_turns=2, greeting="hey")
    assert env.options == {"max_turns": 2, "greeting": "hey"} and env.max_turns == 2
    assert make_env(PlainEnv).max_turns == 3
    assert make_env("code", max_turns=5).max_turns == 5  # a built-in takes it itself; same outcome
    with pytest.raises(ConfigError, match=r"env.options.max_turns: expected a whole number >= 1, got 'two'"):
        make_env(PlainEnv, max_turns="two")
    with pytest.raises(ConfigError, match=r"env.options: EchoEnv takes no option 'greting'; did you mean 'greeting'\?"):
        make_env(EchoEnv, greting="yo")


def test_an_env_that_takes_no_options_refuses_them():
    with pytest.raises(ConfigError, match=r"env.options.greeting: DeafEnv takes no options \(it has no constructor of "
                                          r"its own and never reads self.options\), so 'greeting' would be ignored"):
        make_env(DeafEnv, greeting="hey")
    assert make_env(DeafEnv, max_turns=2).max_turns == 2  # the turn limit applies to every env
    assert make_env(PlainEnv, greeting="hey").reset({})[0]["content"] == "hey{}"


def test_one_turn_limit_per_run():
    from rlfactory.train.prepare import resolve_max_turns

    cfg = RunConfig.model_validate({"env": {"name": "code", "options": {"max_turns": 2}}})
    env = env_from_config(cfg.env)
    assert env.max_turns == 2 and resolve_max_turns(cfg, env) == 2
    cfg.rollout.max_turns = 2
    assert resolve_max_turns(cfg, env) == 2
    cfg.rollout.max_turns = 5
    with pytest.raises(ConfigError, match="rollout.max_turns=5 and env.options.max_turns=2 disagree"):
        resolve_max_turns(cfg, env)
    cfg.env.options = {}
    assert resolve_max_turns(cfg, env_from_config(cfg.env)) == 5


def test_env_module_makes_a_registered_name_usable(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "registry_test_notes.py").write_text(
        "from rlfactory.envs import Env, register_env\n"
        "@register_env('registry-test-notes')\n"
        "class NotesEnv(Env):\n"
        "    def reset(self, row): return []\n")
    with pytest.raises(ConfigError, match="unknown env 'registry-test-notes'.*env.module"):
        env_from_config(EnvConfig(name="registry-test-notes"))
    env = env_from_config(EnvConfig(name="registry-test-notes", module="registry_test_notes"))
    assert type(env).__name__ == "NotesEnv"
    with pytest.raises(ConfigError, match="unknown env 'registry-test-note'; did you mean 'registry-test-notes'"):
        env_from_config(EnvConfig(name="registry-test-note"))


class NoInitEnv(Env):
    """Only `reset`: everything else comes from the Env protocol's defaults."""

    def reset(self, row):
        return [{"role": "user", "content": row["q"]}]


def test_an_env_subclass_gets_the_defaults_and_takes_no_options_it_does_not_name():
    env = env_from_config(EnvConfig(name=f"{__name__}:NoInitEnv"), family="qwen3")  # family is not passed
    assert isinstance(env, NoInitEnv) and env.max_turns == 4 and env.reward() is None
    assert env.info({"q": 1}) == {"q": 1} and env.end_episode(None, None) is None and env.tools().python == []
    with pytest.raises(ValueError, match="has no 'train' split"):
        env.load_split("train")
    assert make_env(PlainEnv, colour="red").options == {"colour": "red"}  # Env's constructor: self.options
    with pytest.raises(ConfigError, match="NoInitEnv takes no options"):  # ...which NoInitEnv never reads
        make_env(NoInitEnv, colour="red")


def test_an_env_without_reset_is_refused_by_name():
    class Forgetful(Env):
        def load_split(self, split):
            return []

    with pytest.raises(TypeError, match="does not implement reset"):
        make_env(Forgetful)
