"""`rlfactory envs list`: the envs a config can name in `env.name`, with their options.

    rlfactory envs list            # built-in and installed envs (entry points `rlfactory.envs`)
    rlfactory envs list --json
    rlfactory envs list --module my_envs   # also the envs that module registers with @register_env
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from rlfactory.imports import import_module_named


def _list(args: argparse.Namespace) -> int:
    from rlfactory.envs.catalog import env_catalog

    for module in args.module or []:
        import_module_named(module, "--module")
    entries = env_catalog()
    if args.json:
        print(json.dumps([asdict(e) for e in entries], indent=1))
        return 0
    for e in entries:
        print(f"{e.name}  [{e.source}]  {e.target}")
        if e.error:
            print(f"    cannot be imported: {e.error}")
            continue
        if e.summary:
            print(f"    {e.summary}")
        if e.options:
            opts = ", ".join(f"{o.name}={o.default}" if o.default else f"{o.name} (required)" for o in e.options)
            print(f"    options: {opts}")
    broken = [e.name for e in entries if e.error]
    if broken:
        print(f"rlfactory envs: {len(broken)} env(s) cannot be imported: {', '.join(broken)}", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("envs", help="list the envs a config can name (built-in and installed)")
    inner = parser.add_subparsers(dest="envs_command", metavar="ACTION")
    lister = inner.add_parser("list", help="built-in and installed envs with their options")
    lister.add_argument("--json", action="store_true", help="print JSON")
    lister.add_argument("--module", action="append", help="import this module first (its @register_env names are listed)")
    lister.set_defaults(func=_list)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])
