"""`rlfactory rollout CONFIG --n N --out FILE.jsonl [key=value ...]`: roll out N trajectories per
dataset row, write them as JSON lines and print a summary (statuses, turns, tool calls, speed)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "rollout",
        help="roll out trajectories for a config's dataset and write them as JSON lines",
        description=__doc__,
    )
    p.add_argument("config", help="run config (YAML)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.mode=lockstep sampling.temperature=0.7")
    p.add_argument("--n", type=int, default=1, help="trajectories per row (default 1)")
    p.add_argument("--out", required=True, help="output file (.jsonl); overwritten")
    p.add_argument("--split", default="test", help="dataset split of the env (default test)")
    p.add_argument("--limit", type=int, default=None, help="use only the first LIMIT rows")
    p.add_argument("--policy-version", type=int, default=0, help="recorded on model segments")
    p.set_defaults(func=run)
    allow_overrides_after_options(p)


def allow_overrides_after_options(parser: argparse.ArgumentParser) -> None:
    """Let positionals (KEY=VALUE overrides) follow the options: `CONFIG --n 4 --out f a.b=c`.

    The parent parser hands a subcommand's arguments to `parse_known_args`; route that through
    argparse's intermixed parsing (which itself calls `parse_known_args`, hence the guard)."""
    plain = parser.parse_known_args
    busy: list[bool] = []

    def parse_known_args(args=None, namespace=None):
        if busy:
            return plain(args, namespace)
        busy.append(True)
        try:
            return parser.parse_known_intermixed_args(args, namespace)
        finally:
            busy.pop()

    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]


def run(args: argparse.Namespace) -> int:
    from rlfactory.cli.common import load_run_config
    from rlfactory.rollout.build import open_rollout
    from rlfactory.rollout.summary import format_summary, summarize
    from rlfactory.trajectory import write_jsonl

    if args.n < 1:
        print("rlfactory rollout: --n must be >= 1", file=sys.stderr)
        return 2
    cfg = load_run_config(args.config, args.overrides)

    async def go():
        async with open_rollout(cfg, load_policy=False) as session:  # only generation servers need weights
            rows = session.env.load_split(args.split)
            if args.limit is not None:
                rows = rows[: args.limit]
            if not rows:
                raise ValueError(f"the {args.split!r} split has no rows")
            t0 = time.perf_counter()
            trajs = await session.engine.run(rows, args.n, policy_version=args.policy_version)
            return trajs, time.perf_counter() - t0, servers_line(session.generator)

    trajs, wall, servers = asyncio.run(go())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(out, trajs, mode="w")
    print(f"mode: {cfg.rollout.mode}" + (f" (tools {cfg.rollout.lockstep_tools})" if cfg.rollout.mode == "lockstep" else ""))
    print(format_summary(summarize(trajs, wall)))
    if servers:
        print(servers)
    print(f"wrote {len(trajs)} trajectories to {out}")
    return 0


def servers_line(generator) -> str:
    """`generation servers: URL N turns (version V)...` for a ServerGenerator, else ''."""
    servers = getattr(generator, "servers", None)
    if not servers:
        return ""
    parts = []
    for s in servers:
        version = s.reported if s.reported is not None else s.version
        parts.append(f"{s.url} {s.served} turns (version {version}{'; ' + s.last_error if s.last_error else ''})")
    return "generation servers: " + "; ".join(parts)
