import json
import sys

import pytest

from rlfactory.config import ConfigError, RunConfig, ToolsConfig, load_config
from rlfactory.tools import load_mcp_config

SERVERS = {
    "calc": {"command": "python", "args": ["-m", "rlfactory.tools.servers.calculator"], "env": {"K": 1}},
    "web": {"url": "http://127.0.0.1:9/mcp", "include": ["search"], "timeout_s": 5, "cache": False},
    "events": {"url": "http://127.0.0.1:9/sse", "type": "sse", "max_concurrency": 4},
}


def test_json_yaml_and_dict_forms_agree(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps({"mcpServers": SERVERS}))
    import yaml

    (tmp_path / "m.yaml").write_text(yaml.safe_dump({"mcpServers": SERVERS}))
    a = load_mcp_config(tmp_path / "m.json")
    b = load_mcp_config(str(tmp_path / "m.yaml"))
    c = load_mcp_config({"mcpServers": SERVERS})
    assert a == b
    # a stdio server from a file runs in the file's folder; an inline one where rlfactory runs
    assert a["calc"].cwd == str(tmp_path.resolve()) and c["calc"].cwd is None
    assert {n: s.model_copy(update={"cwd": None}) for n, s in a.items()} == c
    assert a["calc"].transport == "stdio" and a["calc"].env == {"K": "1"}
    assert a["calc"].executable() == sys.executable  # bare `python` is this interpreter
    assert a["web"].transport == "streamable-http" and a["web"].include == ["search"] and a["web"].cache is False
    assert a["events"].transport == "sse" and a["events"].max_concurrency == 4
    assert a["web"].exposes("search") and not a["web"].exposes("other")


def test_rl_factory_pydata_list_form(tmp_path):
    p = tmp_path / "mcp_tools.pydata"
    p.write_text(
        "[\n  {'mcpServers': {'time': {'command': 'uv', 'args': ['run', 'mcp-server-time']}}},\n"
        "  {'mcpServers': {'calc': {'command': 'python', 'args': ['-m', 'x'], 'exclude': ['divide']}}},\n]\n"
    )
    servers = load_mcp_config(p)
    assert list(servers) == ["time", "calc"]
    assert servers["calc"].exclude == ["divide"] and not servers["calc"].exposes("divide")


def test_disabled_servers_and_foreign_keys(tmp_path):
    servers = load_mcp_config(
        {"mcpServers": {"a": {"command": "x", "disabled": True}, "b": {"command": "y", "autoApprove": ["t"]}}}
    )
    assert list(servers) == ["b"]


@pytest.mark.parametrize(
    "servers, key, message",
    [
        ({"s": {"command": "x", "bogus": 1}}, "mcpServers.s.bogus", "unknown key"),
        ({"s": {"args": ["a"]}}, "mcpServers.s", "exactly one of"),
        ({"s": {"command": "x", "url": "http://h"}}, "mcpServers.s", "exactly one of"),
        ({"s": {"command": "x", "timeout_s": "soon"}}, "mcpServers.s.timeout_s", "number"),
        ({"s": {"url": "http://h", "type": "carrier-pigeon"}}, "mcpServers.s.type", "Input should be"),
        ({"s": {"command": "x", "processes": 0}}, "mcpServers.s.processes", "greater than or equal to 1"),
        ({"s": {"url": "http://h", "processes": 2}}, "mcpServers.s", "copies of a stdio server"),
    ],
)
def test_errors_name_file_and_key(tmp_path, servers, key, message):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"mcpServers": servers}))
    with pytest.raises(ConfigError) as e:
        load_mcp_config(p)
    assert str(p) in str(e.value) and key in str(e.value) and message in str(e.value)


def test_unparseable_files_and_shapes(tmp_path):
    bad = tmp_path / "bad.pydata"
    bad.write_text("[{'mcpServers': {")
    with pytest.raises(ConfigError, match="bad.pydata: cannot parse as a Python literal"):
        load_mcp_config(bad)
    dup = tmp_path / "dup.pydata"
    dup.write_text("[{'mcpServers': {'a': {'command': 'x'}}}, {'mcpServers': {'a': {'command': 'y'}}}]")
    with pytest.raises(ConfigError, match=r"dup.pydata.*\[1\]\.mcpServers\.a: server defined twice"):
        load_mcp_config(dup)
    with pytest.raises(ConfigError, match="not found"):
        load_mcp_config(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="servers: unknown key"):
        load_mcp_config({"servers": {}})


def test_run_config_resolves_mcp_path_next_to_the_config(tmp_path):
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "mcp.json").write_text(json.dumps({"mcpServers": SERVERS}))
    run = tmp_path / "run.yaml"
    run.write_text("tools:\n  mcp: tools/mcp.json\n  cache: true\n  per_tool:\n    add: {timeout_s: 2, cache: false}\n")
    cfg = load_config(RunConfig, run, ["tools.timeout_s=5"])
    assert cfg.tools.mcp == str(tmp_path / "tools" / "mcp.json")
    assert cfg.tools.timeout_s == 5 and cfg.tools.per_tool["add"].cache is False
    assert set(load_mcp_config(cfg.tools.mcp)) == {"calc", "web", "events"}
    run.write_text("tools:\n  mcp: nowhere.json\n")
    with pytest.raises(ConfigError, match=r"tools\.mcp.*MCP config file not found: nowhere.json"):
        load_config(RunConfig, run)
    run.write_text("tools:\n  per_tool:\n    add: {timeout: 2}\n")
    with pytest.raises(ConfigError, match=r"tools\.per_tool\.add\.timeout: unknown key"):
        load_config(RunConfig, run)


def test_inline_mcp_in_tools_config():
    cfg = ToolsConfig(mcp={"mcpServers": SERVERS})
    assert set(load_mcp_config(cfg.mcp)) == {"calc", "web", "events"}


def test_check_commands_names_a_missing_command_and_the_closest_one(tmp_path):
    from rlfactory.tools.mcp_config import check_commands

    p = tmp_path / "mcp.json"
    p.write_text(json.dumps({"mcpServers": {"ok": {"command": "python", "args": ["x.py"]},
                                            "web": {"url": "http://127.0.0.1:1/mcp"},
                                            "typo": {"command": "pythn"}}}))
    with pytest.raises(ConfigError) as e:
        check_commands(p)
    assert str(e.value) == f"{p}: mcpServers.typo.command: 'pythn' not found in PATH; did you mean 'python'?"
    p.write_text(json.dumps({"mcpServers": {"local": {"command": "./serve.sh"}}}))
    with pytest.raises(ConfigError, match=r"mcpServers.local.command: './serve.sh' not found in .* \(the server's cwd\)"):
        check_commands(p)
    (tmp_path / "serve.sh").write_text("#!/bin/sh\n")
    (tmp_path / "serve.sh").chmod(0o755)
    check_commands(p)  # relative to the config's folder, wherever rlfactory runs
    check_commands(None)


def test_relative_args_are_taken_from_the_config_files_folder(tmp_path, monkeypatch):
    import asyncio

    from rlfactory.tools import ToolCall, ToolRunner

    folder = tmp_path / "cfg"
    folder.mkdir()
    (folder / "notes.txt").write_text("from the config's folder")
    (folder / "server.py").write_text(
        "from mcp.server.mcpserver import MCPServer\n"
        "server = MCPServer('notes', log_level='WARNING')\n"
        "@server.tool()\n"
        "async def read() -> str:\n"
        "    '''Read the notes.'''\n"
        "    return open('notes.txt').read()\n"
        "server.run('stdio')\n")
    (folder / "mcp.json").write_text(json.dumps({"mcpServers": {"notes": {"command": "python", "args": ["server.py"]}}}))
    (folder / "run.yaml").write_text(
        "tools:\n  mcp:\n    mcpServers:\n      inline: {command: python, args: [server.py]}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    inline_tools = load_config(RunConfig, folder / "run.yaml").tools  # an inline config: the run config's folder

    async def main():
        for cfg in (ToolsConfig(mcp=str(folder / "mcp.json")), inline_tools):
            async with ToolRunner.from_config(cfg) as runner:
                result = await runner.call(ToolCall("read", {}))
            assert result.text == "from the config's folder", result

    asyncio.run(main())
