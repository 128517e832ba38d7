"""A newcomer's usual mistakes, each ending the command with one clear line before any model loads.

Each test writes a small env module of its own (a uniquely named file next to its config, as a
user would) and runs the real command; `load_model` is replaced by a function that fails the
test, so a command that got as far as loading the model fails loudly.
"""

from __future__ import annotations

import copy
import itertools
import json
import sys
import textwrap
from pathlib import Path

import pytest

from rlfactory.cli.main import main

ENV = '''
from rlfactory.envs import Env, EnvTools, register_env
from rlfactory.rewards import RuleReward


async def lookup(query: str) -> str:
    """Look a word up.

    Args:
        query: The word.
    """
    return "found " + query


@register_env("{registered}")
class NoteEnv(Env):
    max_turns = 3

    def load_split(self, split):
        return [{{"id": "r0", "question": "What is a?", "{answer_key}": "a"}}]

    def reset(self, row):
        return [{{"role": "user", "content": row["question"]}}]

    def tools(self):
        return EnvTools(python=[lookup])

    def reward(self):
        return RuleReward({{"{term}": 1.0}})
'''

_names = itertools.count()


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """Writes an env module and a config into tmp_path; returns a function doing so. Restores
    sys.path and sys.modules afterwards (each test's module has a name of its own)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the mistake was reported")

    monkeypatch.setattr("rlfactory.train.session.load_model", no_model)

    def write(config: str = "", *, answer_key: str = "answer", term: str = "exact_match", env_source: str | None = None):
        module = f"newcomer_env_{next(_names)}"
        source = env_source if env_source is not None else ENV
        (tmp_path / f"{module}.py").write_text(
            source.format(registered=module, answer_key=answer_key, term=term), encoding="utf-8")
        cfg = tmp_path / "run.yaml"
        cfg.write_text(textwrap.dedent(f"""\
            model: {{path: tiny:1m, family: qwen3}}
            env: {{name: "{module}:NoteEnv"}}
            trainer: {{run_dir: {tmp_path / "run"}}}
            """) + textwrap.dedent(config).replace("MODULE", module), encoding="utf-8")
        return str(cfg), module

    yield write
    for name in set(sys.modules) - before:
        if name.startswith("newcomer_env_"):
            del sys.modules[name]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("rlfactory: config error: ")
    return err[0]


def rollout(cfg: str, tmp_path: Path, *overrides: str) -> int:
    return main(["rollout", cfg, "--out", str(tmp_path / "out.jsonl"), *overrides])


def test_env_module_typo_suggests_the_module(scratch, tmp_path, capsys):
    cfg, module = scratch()
    assert rollout(cfg, tmp_path, f"env.name={module[:-1]}x:NoteEnv") == 2
    line = one_line(capsys)
    assert f"env.name: no module named '{module[:-1]}x'; did you mean '{module}'?" in line


def test_env_class_typo_suggests_the_class(scratch, tmp_path, capsys):
    cfg, module = scratch()
    assert rollout(cfg, tmp_path, f"env.name={module}:NoteEnvv") == 2
    line = one_line(capsys)
    assert f"env.name: '{module}' has no class 'NoteEnvv'; did you mean 'NoteEnv'?" in line
    assert str(tmp_path / f"{module}.py") in line


def test_a_registered_name_is_reachable_through_env_module(scratch, tmp_path, capsys):
    cfg, module = scratch()
    assert rollout(cfg, tmp_path, f"env.name={module}") == 2
    assert "env.module" in one_line(capsys)
    # with the module named, the registered name works (the tools command builds the env)
    assert main(["tools", "list", "--config", cfg, f"env.module={module}", f"env.name={module}"]) == 0
    assert "lookup  [python: env]" in capsys.readouterr().out
    assert rollout(cfg, tmp_path, f"env.module={module[:-1]}x", f"env.name={module}") == 2
    assert f"env.module: no module named '{module[:-1]}x'; did you mean '{module}'?" in one_line(capsys)


def test_a_module_that_fails_to_import_is_named_with_file_and_line(scratch, tmp_path, capsys):
    cfg, module = scratch(env_source="import json\nundefined_name\n")
    assert rollout(cfg, tmp_path) == 2
    line = one_line(capsys)
    assert f"importing '{module}' failed: NameError" in line and f"{module}.py:2" in line


def test_an_option_the_env_does_not_take_is_named(scratch, tmp_path, capsys):
    source = ENV.replace("    max_turns = 3\n", "    max_turns = 3\n\n    def __init__(self, topk: int = 2):\n"
                         "        self.topk = topk\n")
    cfg, _ = scratch(env_source=source)
    assert rollout(cfg, tmp_path, "env.options.topkk=3") == 2
    assert "env.options: NoteEnv takes no option 'topkk'; did you mean 'topk'? (it takes: topk)" in one_line(capsys)


def test_python_tool_name_typo_suggests_the_function(scratch, tmp_path, capsys):
    cfg, module = scratch(config="tools: {python: ['MODULE:lookupp']}\n")
    assert rollout(cfg, tmp_path) == 2
    assert f"tools.python[0]: '{module}' has no function 'lookupp'; did you mean 'lookup'?" in one_line(capsys)


def test_mcp_command_that_does_not_exist(scratch, tmp_path, capsys):
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {"notes": {"command": "pythn", "args": ["s.py"]}}}))
    cfg, _ = scratch(config="tools: {mcp: mcp.json}\n")
    assert rollout(cfg, tmp_path) == 2
    line = one_line(capsys)
    assert f"{tmp_path / 'mcp.json'}: mcpServers.notes.command: 'pythn' not found in PATH; did you mean 'python'?" in line
    assert main(["train", cfg]) == 2
    assert "mcpServers.notes.command" in one_line(capsys)
    assert not (tmp_path / "run").exists()  # nothing written to the run directory


def test_mcp_server_that_dies_at_start_up(scratch, tmp_path, capsys):
    servers = {"notes": {"command": "python", "args": ["missing.py"]}}
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": servers}))
    cfg, _ = scratch(config="tools: {mcp: mcp.json}\n")
    assert rollout(cfg, tmp_path) == 2
    line = one_line(capsys)
    assert f"tools.mcp ({tmp_path / 'mcp.json'}): MCP server(s) failed to start: notes:" in line
    assert f"can't open file '{tmp_path / 'missing.py'}'" in line  # args are taken from mcp.json's folder
    assert "next attempt" not in line  # the command ends here: no retry to announce


def test_mcp_command_given_as_an_absolute_path_that_does_not_exist(scratch, tmp_path, capsys):
    real = Path(sys.executable)
    typo = real.parent / (real.name[:-1] + "x" + real.name[-1])  # .../python3 -> .../pythox3-like
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {"notes": {"command": str(typo)}}}))
    cfg, _ = scratch(config="tools: {mcp: mcp.json}\n")
    assert rollout(cfg, tmp_path) == 2
    line = one_line(capsys)
    assert f"mcpServers.notes.command: {str(typo)!r} does not exist; did you mean " in line
    assert "not found in" not in line


def test_mcp_include_naming_a_tool_the_server_lacks(tmp_path, capsys):
    servers = {"calc": {"command": "python", "args": ["-m", "rlfactory.tools.servers.calculator"],
                        "include": ["evaluat", "add"]}}
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": servers}))
    assert main(["tools", "list", "--config", str(tmp_path / "mcp.json")]) == 2
    line = one_line(capsys)
    assert ("mcpServers.calc.include: the server has no tool 'evaluat'; did you mean 'evaluate'? "
            "(it offers: add, multiply, divide, evaluate)") in line
    servers["calc"]["include"] = ["evaluate"]
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": servers}))
    assert main(["tools", "list", "--config", str(tmp_path / "mcp.json")]) == 0
    assert "1 tool(s)" in capsys.readouterr().out


def test_per_tool_options_naming_an_unknown_tool_suggest_the_tool(scratch, tmp_path, caplog):
    cfg, _ = scratch(config="tools: {per_tool: {lookpu: {timeout_s: 3}}}\n")
    with caplog.at_level("WARNING", logger="rlfactory.tools"):
        assert main(["tools", "list", "--config", cfg]) == 0
    assert "tools.per_tool.lookpu: no tool is called 'lookpu'; did you mean 'lookup'? (tools: lookup)" in caplog.text


def test_a_misspelt_config_key_suggests_the_key(scratch, tmp_path, capsys):
    cfg, _ = scratch()
    assert rollout(cfg, tmp_path, "trainer.stpes=3") == 2
    assert "trainer.stpes: unknown key; did you mean 'steps'?" in capsys.readouterr().err
    assert rollout(cfg, tmp_path, "tools.per_tool.lookup.timeot_s=2") == 2
    assert "tools.per_tool.lookup.timeot_s: unknown key; did you mean 'timeout_s'?" in capsys.readouterr().err


def test_options_for_an_env_that_takes_none_are_refused(scratch, tmp_path, capsys):
    cfg, _ = scratch()
    assert rollout(cfg, tmp_path, "env.options.topk=3") == 2
    assert ("env.options.topk: NoteEnv takes no options (it has no constructor of its own and never reads "
            "self.options), so 'topk' would be ignored") in one_line(capsys)


def test_reward_term_typo_inside_the_env_names_the_env_file(scratch, tmp_path, capsys):
    cfg, module = scratch(term="exact_mach")
    assert rollout(cfg, tmp_path) == 2
    line = one_line(capsys)
    assert f"env.name: '{module}:NoteEnv': reward() raised ConfigError: unknown reward term 'exact_mach'; " \
           "did you mean 'exact_match'?" in line
    assert f"{module}.py:" in line


def test_reward_term_typo_in_the_config(scratch, tmp_path, capsys):
    cfg, _ = scratch(config="reward: {terms: {fromat: 0.1}}\n")
    assert main(["eval", cfg, "--model", "tiny:1m"]) == 2
    assert "unknown reward term 'fromat'; did you mean 'format'?" in one_line(capsys)


def test_two_turn_limits_that_disagree(scratch, tmp_path, capsys):
    cfg, _ = scratch(config="env: {options: {max_turns: 2}}\nrollout: {max_turns: 4}\n")
    assert rollout(cfg, tmp_path) == 2
    assert "rollout.max_turns=4 and env.options.max_turns=2 disagree" in one_line(capsys)


def test_sft_and_train_stop_on_the_same_mistakes(scratch, tmp_path, capsys):
    cfg, module = scratch()
    assert main(["sft", cfg, f"env.name={module}:NoteEnvv"]) == 2
    assert "did you mean 'NoteEnv'?" in one_line(capsys)
    assert main(["train", cfg, f"env.name={module}:NoteEnvv"]) == 2
    assert "did you mean 'NoteEnv'?" in one_line(capsys)
    assert not (tmp_path / "run").exists()  # config.yaml is written only once the run is valid


def test_rows_without_the_answer_the_reward_reads(scratch, tmp_path, capsys):
    cfg, module = scratch(answer_key="label")
    assert rollout(cfg, tmp_path) == 2
    line = one_line(capsys)
    assert (f"env '{module}:NoteEnv': test row 0 (id 'r0') has no reference answer, which exact_match compare(s) "
            "against: give it one of the fields ground_truth, answer,") in line
    assert "the row has: id, label, question (1 of 1 rows)" in line
    assert not (tmp_path / "out.jsonl").exists()
    assert main(["train", cfg, "trainer.steps=1"]) == 2
    assert "train row 0 (id 'r0') has no reference answer" in one_line(capsys)
    assert not (tmp_path / "run").exists()


def test_rlfactory_traceback_shows_what_is_behind_the_line(scratch, tmp_path, capsys, monkeypatch):
    cfg, module = scratch(term="exact_mach")
    monkeypatch.setenv("RLFACTORY_TRACEBACK", "1")
    assert rollout(cfg, tmp_path) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and f"{module}.py" in err
    assert err.strip().splitlines()[-1].startswith("rlfactory: config error: env.name:")


def test_a_relative_model_folder_that_does_not_exist_is_named_at_once(scratch, tmp_path, capsys, monkeypatch):
    import time

    cfg, _ = scratch()
    monkeypatch.chdir(tmp_path)
    t0 = time.monotonic()
    # no models/ here, so it may be a Hub id: asked of the Hub once (offline: a DNS failure at once)
    assert rollout(cfg, tmp_path, "model.path=models/tiny1m") == 2
    line = one_line(capsys)
    assert f"model.path: 'models/tiny1m' does not exist (from {tmp_path}); as a Hub id: " in line
    assert time.monotonic() - t0 < 10  # no download retries
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert rollout(cfg, tmp_path, "model.path=models/tiny1m") == 2
    assert "as a Hub id: HF_HUB_OFFLINE is set and the local Hugging Face cache has no snapshot of it" in one_line(capsys)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    (tmp_path / "models" / "tiny10m").mkdir(parents=True)
    assert rollout(cfg, tmp_path, "model.path=models/tiny1m") == 2
    assert "'models/tiny1m' does not exist" in (line := one_line(capsys)) and "did you mean 'models/tiny10m'?" in line


def test_a_tiny_model_size_that_does_not_exist_lists_the_sizes(scratch, tmp_path, capsys):
    cfg, _ = scratch()
    assert rollout(cfg, tmp_path, "model.path=tiny:5m") == 2
    assert ("model.path: 'tiny:5m': no tiny model of that size; did you mean 'tiny:1m'? (sizes: tiny:10m, tiny:1m"
            in one_line(capsys))


WORDNET_ENV = ENV.replace('''    def load_split(self, split):
        return''', '''    def load_split(self, split):
        open("/nonexistent-wordnet/data.noun").close()
        return''')


def test_a_missing_env_data_file_is_named_before_the_model_loads(scratch, tmp_path, capsys):
    cfg, module = scratch(env_source=WORDNET_ENV)
    assert rollout(cfg, tmp_path, "--no-reward") == 2
    line = one_line(capsys)
    assert (f"env '{module}:NoteEnv': load_split('test') raised FileNotFoundError: [Errno 2] No such file or directory: "
            "'/nonexistent-wordnet/data.noun'") in line and f"{module}.py:" in line
    assert main(["sft", cfg]) == 2
    assert f"env '{module}:NoteEnv': load_split('train') raised FileNotFoundError" in one_line(capsys)


def test_a_family_that_breaks_the_token_contract_names_the_one_that_works(tiny):
    from rlfactory.config import ConfigError
    from rlfactory.train.session import checked_tool_manager
    from rlfactory.config import ModelConfig

    _, tok = tiny
    tok = copy.deepcopy(tok)
    # SmolLM2-135M's kind of template: plain ChatML that ignores tools
    tok.chat_template = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                         "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                         "{% endif %}")
    with pytest.raises(ConfigError, match=r"model.family: 'qwen3' does not fit the chat template of smollm2:135m \(.*\); "
                                          r"its template reads as family 'template', which does: set model.family: "
                                          r"template, or leave model.family unset"):
        checked_tool_manager(ModelConfig(path="smollm2:135m", family="qwen3"), tok, "llama")
    assert type(checked_tool_manager(ModelConfig(path="smollm2:135m"), tok, "llama")).__name__ == "TemplateToolManager"


TERM_ENV = ENV.replace('''@register_env''', '''from rlfactory.rewards import reward_term


@reward_term("{registered}/mine")
def mine(trajectory, answer=None):
    return float(answer == trajectory.info["answer"])


@register_env''').replace('''RuleReward({{"{term}": 1.0}})''', '''RuleReward({{"{registered}/mine": 1.0}})''')


def test_a_reward_term_reading_a_key_the_row_lacks_is_named_before_the_rollout(scratch, tmp_path, capsys):
    cfg, module = scratch(env_source=TERM_ENV, answer_key="label")
    assert rollout(cfg, tmp_path) == 2
    line = one_line(capsys)
    assert (f"reward term '{module}/mine' ({tmp_path / module}.py:") in line
    assert ("reads trajectory.info['answer'], which env '" + module + ":NoteEnv': test row 0 (id 'r0') has not "
            "(it has: id, question, label); a term receives the row's reference answers as its `references` "
            "parameter") in line
    assert not (tmp_path / "out.jsonl").exists()


def test_a_reward_term_that_fails_while_scoring_names_the_term_and_the_row(tmp_path):
    import asyncio

    from rlfactory.rewards import RuleReward, reward_term
    from rlfactory.rewards.rule import RewardTermError
    from rlfactory.trajectory import Trajectory

    @reward_term("mistakes/per_call")
    def per_call(trajectory, answer=None):
        return 1.0 / len(trajectory.tool_calls)

    reward = RuleReward({"mistakes/per_call": 1.0})
    with pytest.raises(RewardTermError, match=r"reward term 'mistakes/per_call' \(.*test_cli_mistakes.py:\d+\) raised "
                                              r"ZeroDivisionError: float division by zero on row 'q7'$"):
        asyncio.run(reward.score(Trajectory(id="t0", group="g", info={"id": "q7"})))


@pytest.mark.parametrize("argv, line", [
    (["serve", "tiny:1m", "--max-batch", "0"], "rlfactory serve: --max-batch must be >= 1"),
    (["gateway", "tiny:1m", "--max-new-tokens", "0"], "rlfactory gateway: --max-new-tokens must be >= 1"),
])
def test_the_model_servers_refuse_a_count_below_one_in_one_line(argv, line, capsys):
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]


def test_the_model_servers_share_their_model_options(capsys):
    for command in ("serve", "gateway"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        assert all(option in out for option in ("--device", "--dtype", "--seed", "--logits-processor")), command
        assert "--exit-with-parent" not in out
