"""`rlfactory tools list|call`: see and try the tools of a config.

    rlfactory tools list --config run.yaml
    rlfactory tools call add --args '{"a": 1, "b": 2}' --config mcp.json tools.timeout_s=5

`--config` is a run config YAML or a bare MCP config (JSON, YAML with `mcpServers`, or RL-Factory
`.pydata`). A run config with an `env:` section lists what the model will see: the `tools:`
section's tools plus the env's own, under the names the model calls them. Trailing `key=value`
words are dotted overrides.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Any, AsyncIterator

from pydantic import BaseModel, ConfigDict

from rlfactory.cli.common import load_run_config, make_config_folder_importable
from rlfactory.config import ConfigError, ToolsConfig, apply_overrides, read_yaml, validate
from rlfactory.tools.base import Tool


class _ToolsView(BaseModel):
    """A run config seen by the tools command: only `tools:` is read (and validated)."""

    model_config = ConfigDict(extra="ignore")
    tools: ToolsConfig = ToolsConfig()


def _is_bare_mcp(path: Path) -> bool:
    if path.suffix.lower() in (".json", ".pydata", ".py", ".txt"):
        return True
    try:
        data = read_yaml(path)
    except ConfigError:
        return False
    return "mcpServers" in data


def load_tools_config(path: str | None, overrides: list[str]) -> ToolsConfig:
    """The `tools:` section from a run config or a bare MCP config, with dotted overrides applied."""
    if path is None:
        data: dict[str, Any] = {}
        base_dir = None
    else:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        base_dir = str(p.resolve().parent)
        data = {"tools": {"mcp": str(p.resolve())}} if _is_bare_mcp(p) else read_yaml(p)
        make_config_folder_importable(p)
    data = apply_overrides(data, overrides)
    source = (path or "<no config>") + (f" (with overrides {' '.join(overrides)})" if overrides else "")
    return validate(_ToolsView, data, source, base_dir).tools


def _has_env(path: str | None) -> bool:
    """Whether `path` is a run config with an `env:` section (then the env's tools count too)."""
    return path is not None and Path(path).is_file() and not _is_bare_mcp(Path(path)) and "env" in read_yaml(path)


@contextlib.asynccontextmanager
async def open_tools(path: str | None, overrides: list[str]) -> AsyncIterator[tuple[Any, set[str]]]:
    """(started ToolRunner, names of the env's own Python tools) for a config, checked as a run
    checks it (rlfactory/train/prepare.py); with an env, its tools join the config's."""
    from rlfactory.train.prepare import build_env, build_runner, env_tools, start_runner

    env = own = None
    if _has_env(path):
        cfg = load_run_config(str(path), overrides)
        tools = cfg.tools
        env = build_env(cfg)
    else:
        tools = load_tools_config(path, overrides)
    try:
        if env is not None:
            own = env_tools(cfg, env)
        runner = build_runner(tools, own)
        try:
            await start_runner(runner, tools)
            own_names = {f.name if isinstance(f, Tool) else getattr(f, "__name__", "") for f in (own.python if own else [])}
            yield runner, own_names
        finally:
            await runner.aclose()
    finally:
        if env is not None:  # an Env (make_env checked its members): it has close
            env.close()


def _split(extra: list[str]) -> list[str]:
    bad = [w for w in extra if "=" not in w]
    if bad:
        raise ConfigError(f"unexpected argument(s) {bad}: overrides look like tools.timeout_s=5")
    return extra


def _describe_parameters(schema: dict[str, Any]) -> list[str]:
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    lines = []
    for name, p in props.items():
        kind = p.get("type") or ("enum" if "enum" in p else "any")
        if isinstance(kind, list):
            kind = "|".join(map(str, kind))
        flags = "required" if name in required else f"default {json.dumps(p['default'])}" if "default" in p else "optional"
        desc = (p.get("description") or "").strip()
        lines.append(f"    {name} ({kind}, {flags})" + (f": {desc}" if desc else ""))
    return lines or ["    (none)"]


async def _list(path: str | None, overrides: list[str], as_json: bool) -> int:
    async with open_tools(path, overrides) as (runner, env_python):
        specs = runner.specs()
        if as_json:
            rows = [
                {"server": runner.server_of(s.name), "name": s.name, "description": s.description, "parameters": s.parameters}
                for s in specs
            ]
            print(json.dumps(rows, indent=2))
            return 0
        for s in specs:
            server = runner.server_of(s.name)
            where = f"server: {server}" if server else "python: env" if s.name in env_python else "python: tools.python"
            first = (s.description or "").strip().splitlines()
            print(f"{s.name}  [{where}]")
            print(f"  {first[0] if first else '(no description)'}")
            print("  parameters:")
            print("\n".join(_describe_parameters(s.parameters)))
        print(f"{len(specs)} tool(s)")
    return 0


async def _call(path: str | None, overrides: list[str], name: str, raw_args: str) -> int:
    from rlfactory.tools.base import ToolCall

    try:
        arguments = json.loads(raw_args) if raw_args.strip() else {}
    except ValueError as e:
        print(f"rlfactory tools call: --args is not valid JSON: {e}", file=sys.stderr)
        return 2
    async with open_tools(path, overrides) as (runner, _):
        result = await runner.call(ToolCall(name, arguments))
    if result.is_error:
        print(f"tool error ({result.status}): {result.text}", file=sys.stderr)
        return 1
    print(result.text)
    return 0


def _run(args: argparse.Namespace) -> int:
    overrides = _split(args.overrides)
    if args.tools_command == "list":
        return asyncio.run(_list(args.config, overrides, args.json))
    return asyncio.run(_call(args.config, overrides, args.name, args.args))


class _OverridesParser(argparse.ArgumentParser):
    """Collects `key=value` words anywhere on the line as overrides (argparse alone cannot after a
    positional that is followed by options)."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        ns, extra = super().parse_known_args(args, namespace)
        words = [w for w in extra if "=" in w and not w.startswith("-")]
        ns.overrides = [*(getattr(ns, "overrides", None) or []), *words]
        return ns, [w for w in extra if w not in words]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("tools", help="list or call the tools of a config", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="tools_command", metavar="{list,call}", required=True, parser_class=_OverridesParser)
    ls = sub.add_parser("list", help="print every tool: server, name, description, parameters")
    ls.add_argument("--config", help="run config YAML (tools: section) or MCP config (JSON/YAML/.pydata)")
    ls.add_argument("--json", action="store_true", help="print JSON instead of text")
    call = sub.add_parser("call", help="call one tool and print its result (exit 1 on a tool error)")
    call.add_argument("name", help="tool name as `list` prints it")
    call.add_argument("--args", default="{}", help='arguments as a JSON object, e.g. \'{"a": 1}\'')
    call.add_argument("--config", help="run config YAML (tools: section) or MCP config (JSON/YAML/.pydata)")
    for sp in (ls, call):
        sp.set_defaults(func=_run, overrides=[])
        sp.epilog = "Trailing KEY=VALUE words are dotted config overrides, e.g. tools.timeout_s=5."
