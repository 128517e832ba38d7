"""`rlfactory tools list|call` on run configs and bare MCP configs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import server

import rlfactory.cli.main as cli


@pytest.fixture
def tools_cli(monkeypatch):
    # Only the tools subcommand: other subcommands' imports are not this test's business.
    monkeypatch.setattr(cli, "COMMAND_MODULES", ["tools"])
    return cli.main


@pytest.fixture
def configs(tmp_path):
    mcp = {"mcpServers": {"calc": server("calculator", include=["add", "evaluate"])}}
    (tmp_path / "mcp.json").write_text(json.dumps(mcp))
    (tmp_path / "mcp_tools.pydata").write_text(repr([{"mcpServers": {"calc": server("calculator")}}]))
    (tmp_path / "run.yaml").write_text("trainer:\n  lr: 0.001\ntools:\n  mcp: mcp_tools.pydata\n  timeout_s: 3\n")
    return tmp_path


def test_list_prints_server_name_description_parameters(tools_cli, configs, capsys):
    assert tools_cli(["tools", "list", "--config", str(configs / "mcp.json")]) == 0
    out = capsys.readouterr().out
    assert "add  [server: calc]" in out and "Add two numbers." in out
    assert "a (number, required): The first number." in out
    assert "evaluate  [server: calc]" in out and "expression (string, required)" in out
    assert "divide" not in out and "2 tool(s)" in out


def test_list_json_from_a_run_config_with_overrides(tools_cli, configs, capsys):
    assert tools_cli(["tools", "list", "--json", "--config", str(configs / "run.yaml"), "tools.timeout_s=5"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == ["add", "multiply", "divide", "evaluate"]
    assert rows[0]["server"] == "calc" and rows[0]["parameters"]["required"] == ["a", "b"]


def test_call_success_tool_error_and_config_errors(tools_cli, configs, capsys):
    run = str(configs / "run.yaml")
    assert tools_cli(["tools", "call", "evaluate", "--args", '{"expression": "6*7"}', "--config", run]) == 0
    assert capsys.readouterr().out.strip() == "42"
    assert tools_cli(["tools", "call", "divide", "--args", '{"a": 1, "b": 0}', "--config", run, "tools.retries=0"]) == 1
    assert "division by zero" in capsys.readouterr().err
    assert tools_cli(["tools", "call", "add", "--args", "{not json", "--config", run]) == 2
    assert tools_cli(["tools", "call", "add", "--args", "{}", "--config", run, "tools.timeout_s=soon"]) == 2
    assert "tools.timeout_s" in capsys.readouterr().err


def test_the_installed_command(configs):
    exe = Path(sys.executable).parent / "rlfactory"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "rlfactory.cli.main"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(
        cmd + ["tools", "call", "add", "--args", '{"a": 1, "b": 2.5}', "--config", str(configs / "mcp.json")],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "3.5"


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_list_on_a_run_config_shows_the_env_tools_under_the_names_the_model_sees(tools_cli, capsys):
    wiki = str(EXAMPLES / "wiki" / "wiki.yaml")
    assert tools_cli(["tools", "list", "--config", wiki]) == 0
    out = capsys.readouterr().out
    assert "search  [python: env]" in out and "1 tool(s)" in out
    # the same tool also over MCP: both are offered, the MCP copy renamed, and start-up says so
    assert tools_cli(["tools", "list", "--config", wiki, "tools.mcp=mcp.json"]) == 0
    captured = capsys.readouterr()
    assert "search  [python: env]" in captured.out and "wiki.search  [server: wiki]" in captured.out
    assert "2 tool(s)" in captured.out
    assert captured.err.strip().splitlines() == [
        "tools: 'search' is served more than once, so the model sees 'search' (python), 'wiki.search' (hide a copy "
        "with the server's `exclude`, or set tools.qualify_names: true to always name MCP tools server.tool)"]
    assert tools_cli(["tools", "call", "wiki.search", "--args", '{"query": "Hessvik founder"}', "--config", wiki,
                      "tools.mcp=mcp.json"]) == 0
    assert "Doc 1(Title: Hessvik)" in capsys.readouterr().out


def test_list_imports_the_config_folder_as_every_command_does(tmp_path):
    """A fresh process (nothing imported yet), run from another folder: `tools.python` of a shipped
    example resolves from the config's folder, as under `train`."""
    exe = Path(sys.executable).parent / "rlfactory"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "rlfactory.cli.main"]
    out = subprocess.run(cmd + ["tools", "list", "--config", str(EXAMPLES / "rollout_calculator.yaml")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "calculate  [python: tools.python]" in out.stdout and "1 tool(s)" in out.stdout
