"""examples/units (README "Your own task"): the env's rows, its MCP server, its solver and its config.

The solver's demonstrations are replayed through a real rollout: rlfactory's tiny model is forced
(ScriptedPolicy) to write the demonstrator's turns token by token, the engine parses them, the real
MCP server (units_server.py, started from mcp.json) answers the call, and the env's reward scores
the result, so a demonstration that the reward would refuse fails here."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import pytest

from rlfactory.cli.main import main
from rlfactory.tiny.cache import ensure_tiny
from rlfactory.tiny.pretrain import CopyRecipe
from rlfactory.trajectory import read_jsonl

UNITS = Path(__file__).resolve().parents[2] / "examples" / "units"
CONFIG = str(UNITS / "units.yaml")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def units_env():
    sys.path.insert(0, str(UNITS))
    try:
        import units_env
        import unitconv

        yield units_env, unitconv
    finally:
        sys.path.remove(str(UNITS))


def test_rows_are_deterministic_and_test_amounts_never_occur_in_training(units_env):
    mod, conv = units_env
    rows = mod.make_rows(0, 300, 100)
    assert rows == mod.make_rows(0, 300, 100) and rows != mod.make_rows(1, 300, 100)
    assert len(rows["train"]) == 300 and len(rows["test"]) == 100
    train_values = {r["value"] for r in rows["train"]}
    for row in rows["test"]:
        assert row["value"] not in train_values
        assert str(row["value"]) in row["question"] and row["from_unit"] in row["question"]
    for row in rows["train"] + rows["test"]:
        result = conv.convert_value(row["value"], row["from_unit"], row["to_unit"])
        assert result.denominator == 1 and row["answer"][0] == str(result.numerator)
    assert conv.convert_text(37, "hours", "minutes") == "37 hours = 2220 minutes"
    assert conv.convert_text(3, "mi", "feet") == "3 miles = 15840 feet"
    assert conv.convert_text(1, "inch", "cm") == "1 inches = 2.54 centimeters"
    with pytest.raises(ValueError, match="cannot convert hours \\(time\\) to kilograms \\(mass\\)"):
        conv.convert_text(2, "hours", "kg")
    with pytest.raises(ValueError, match="unknown unit 'hourz'"):
        conv.convert_text(2, "hourz", "minutes")


def test_the_solver_replayed_through_the_real_server_earns_the_whole_reward(units_env):
    from rlfactory.chat.template import ModelTurn
    from rlfactory.cli.common import load_run_config
    from rlfactory.train.session import open_rollout
    from rlfactory.rollout.scripted import ScriptedPolicy, TurnPlan
    from rlfactory.tools.base import ToolCall
    from rlfactory.train.evaluate import evaluate

    # the scripted policy writes every token, so the weights do not matter: tiny:1m, the same
    # tokenizer as units.yaml's tiny:1m-copy, without its first-use pretraining
    cfg = load_run_config(CONFIG, ["rollout.max_new_tokens=64", "model.path=tiny:1m"])

    async def go():
        async with open_rollout(cfg) as session:
            env, tm, tok = session.env, session.tool_manager, session.tokenizer
            rows = env.load_split("test")[:12] + env.load_split("train")[:12]
            by_question = {r["question"]: r for r in rows}
            end = tok.convert_tokens_to_ids("<|im_end|>")

            def turn_text(message) -> str:
                calls = [ToolCall(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
                ids = tm.model_turn_ids(ModelTurn(calls=calls, content=message["content"]))
                return tok.decode([i for i in ids if i != end], skip_special_tokens=False)

            def plan(context: str) -> TurnPlan:
                question = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", context, re.S)[0]  # the question (tool results come as user turns)
                turns = [m for m in env.solve(by_question[question]) if m["role"] == "assistant"]
                return TurnPlan(free=0, forced=turn_text(turns[context.count("<tool_response>")]))

            session.generator.logits_processor = ScriptedPolicy(tok, plan, end)
            report = await evaluate(session.engine, session.reward, rows)
            # the server's text is the solver's text, call for call
            for row, q in zip(rows, report["questions"]):
                demo = env.solve(row)
                assert q["calls"] == [[{"name": "convert", "arguments": demo[2]["tool_calls"][0]["function"]["arguments"],
                                        "status": "ok"}]], q
            return report

    report = asyncio.run(go())
    assert report["averages"]["accuracy"] == 1.0, [q for q in report["questions"] if q["accuracy"] != 1.0][:2]
    assert all(q["reward_terms"] == {"exact_match": 1.0, "format": 1.0} for q in report["questions"])


def test_a_bad_unit_reaches_the_model_as_the_servers_message(capsys):
    cfg = str(UNITS / "mcp.json")
    assert main(["tools", "call", "convert", "--args", '{"value": 3, "from_unit": "tonnes", "to_unit": "minutes"}',
                 "--config", cfg]) != 0
    assert "cannot convert tonnes (mass) to minutes (time)" in capsys.readouterr().err
    assert main(["tools", "call", "convert", "--args", '{"value": 3, "from_unit": "hours", "to_unit": "min"}',
                 "--config", cfg]) == 0
    assert capsys.readouterr().out.strip() == "3 hours = 180 minutes"


def _readme_commands() -> list[list[str]]:
    """The README's `.venv/bin/rlfactory ...` lines about examples/units, as argument lists."""
    import shlex

    lines = [line.strip() for line in (UNITS.parents[1] / "README.md").read_text().splitlines()]
    return [shlex.split(line)[1:] for line in lines
            if line.startswith(".venv/bin/rlfactory ") and "examples/units/" in line]


def test_the_guide_commands_of_the_readme_run_as_printed(tmp_path, capsys, monkeypatch):
    """README "Your own task", every command as printed, from a folder of their own (runs/ lands
    there), on tiny budgets."""
    import yaml

    commands = _readme_commands()
    assert [c[0] for c in commands] == ["tools", "rollout", "eval", "sft", "eval", "train", "eval", "experiment"]
    steps = yaml.safe_load(Path(CONFIG).read_text())["trainer"]["steps"]
    assert f"step_{steps:06d}" in " ".join(commands[6])  # the checkpoint that units.yaml's trainer.steps writes
    monkeypatch.chdir(tmp_path)
    # units.yaml's tiny:1m-copy, made here by a few steps of its recipe (the real one takes minutes)
    monkeypatch.setenv("RLFACTORY_CACHE", str(tmp_path / "cache"))
    ensure_tiny("1m-copy", 0, copy_recipe=CopyRecipe(steps=2, batch_size=1, seq_len=32, warmup=1))
    small = {"rollout": ["rollout.max_new_tokens=12"],
             "eval": ["--limit", "2", "rollout.max_new_tokens=12"],
             "sft": ["sft.steps=2", "sft.full_text_steps=1", "sft.demos=4", "sft.batch_size=2", "sft.check_rows=2",
                     f"sft.out={tmp_path / 'runs' / 'units' / 'sft'}"],
             "train": ["trainer.steps=1", "trainer.prompts_per_step=2", "algo.group_size=2", "trainer.progress=false",
                       f"trainer.run_dir={tmp_path / 'runs' / 'units' / 'grpo'}", "rollout.max_new_tokens=12"],
             "experiment": ["sft.steps=2", "sft.demos=4", "sft.batch_size=2", "sft.check_rows=0", "trainer.steps=1",
                            "trainer.prompts_per_step=2", "algo.group_size=2", "trainer.progress=false",
                            "rollout.max_new_tokens=12", "--eval-limit", "2"]}
    for argv in commands:
        argv = [str(UNITS.parents[1] / a) if a.startswith("examples/") else a.replace(f"step_{steps:06d}", "step_000001")
                for a in argv]
        extra = small.get(argv[0], [])
        # overrides right after the config: `experiment` takes no KEY=VALUE after its options
        assert main([*argv[:2], *extra, *argv[2:]] if argv[0] != "tools" else argv) == 0, argv
        out, err = capsys.readouterr()
        if argv[0] == "tools":
            assert "convert  [server: units]" in out and "1 tool(s)" in out
        if argv[0] == "rollout":
            trajs = read_jsonl(argv[argv.index("--out") + 1])
            assert len(trajs) == 2 * int(argv[argv.index("--limit") + 1]) and "convert" in trajs[0].segments[0].text
            assert "reward:       mean" in out
        if argv[0] == "sft":
            assert json.loads((tmp_path / "runs" / "units" / "sft" / "warm_start.json").read_text())["rows"] == 2
        if argv[0] == "eval":
            assert "2 questions (test)" in out and "reward/exact_match" in out
        if argv[0] == "experiment":
            assert "after GRPO" in out and (tmp_path / argv[argv.index("--out") + 1] / "results.json").is_file()
