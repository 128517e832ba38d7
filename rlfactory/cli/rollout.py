"""`rlfactory rollout CONFIG --n N --out FILE.jsonl [key=value ...]`: roll out N trajectories per
dataset row, score them with the run's reward (the `reward:` section, else the env's own; skip
with --no-reward), write them as JSON lines and print a summary (statuses, turns, tool calls,
reward terms, speed)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rlfactory.cli.common import allow_overrides_after_options

if TYPE_CHECKING:
    from rlfactory.protocols import Generator


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
    p.add_argument("--no-reward", action="store_true",
                   help="do not score the trajectories (by default they are scored when a reward is configured)")
    p.set_defaults(func=run)
    allow_overrides_after_options(p)


def run(args: argparse.Namespace) -> int:
    from rlfactory.cli.common import load_run_config
    from rlfactory.rewards.base import score_all
    from rlfactory.train.session import open_rollout
    from rlfactory.train.prepare import command_checks
    from rlfactory.rollout.summary import format_summary, summarize
    from rlfactory.trajectory import write_jsonl

    if args.n < 1:
        print("rlfactory rollout: --n must be >= 1", file=sys.stderr)
        return 2
    cfg = load_run_config(args.config, args.overrides)

    async def go():
        checks = command_checks("rollout", cfg, args.split, reward=not args.no_reward)
        # only generation servers need the policy's weights
        async with open_rollout(cfg, load_policy=False, reward_mode=checks.reward_mode,
                                check_splits=checks.check_splits) as session:
            rows = session.env.load_split(args.split)
            if args.limit is not None:
                rows = rows[: args.limit]
            if not rows:
                raise ValueError(f"the {args.split!r} split has no rows")
            t0 = time.perf_counter()
            trajs = await session.engine.run(rows, args.n, policy_version=args.policy_version)
            wall = time.perf_counter() - t0
            if session.reward is not None:
                for t, s in zip(trajs, await score_all(session.reward, trajs)):
                    if s is not None:
                        t.reward, t.reward_terms = float(s.total), dict(s.terms)
            return trajs, wall, session.reward is not None, servers_line(session.generator)

    trajs, wall, scored, servers = asyncio.run(go())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(out, trajs, mode="w")
    print(f"mode: {cfg.rollout.mode}" + (f" (tools {cfg.rollout.lockstep_tools})" if cfg.rollout.mode == "lockstep" else ""))
    print(format_summary(summarize(trajs, wall)))
    if servers:
        print(servers)
    print(reward_line(trajs) if scored else "reward:       not scored (" + ("--no-reward" if args.no_reward else
          "no reward configured: set reward.terms, or give the env a reward()") + ")")
    print(f"wrote {len(trajs)} trajectories to {out}")
    return 0


def servers_line(generator: Generator) -> str:
    """`generation servers: URL N turns (version V)...` for a ServerGenerator, else ''."""
    from rlfactory.generation.server_generator import ServerGenerator

    if not isinstance(generator, ServerGenerator) or not generator.servers:
        return ""
    parts = []
    for s in generator.servers:
        version = s.reported if s.reported is not None else s.version
        parts.append(f"{s.url} {s.served} turns (version {version}{'; ' + s.last_error if s.last_error else ''})")
    return "generation servers: " + "; ".join(parts)


def reward_line(trajs: list) -> str:
    """`reward: mean 0.25 (exact_match 0.00, format 1.00); N infra_error not scored`."""
    scored = [t for t in trajs if t.reward is not None]
    if not scored:
        return "reward:       none scored (every trajectory is infra_error)"
    mean = sum(t.reward for t in scored) / len(scored)
    names = list(dict.fromkeys(k for t in scored for k in t.reward_terms))
    terms = ", ".join(f"{k} {sum(t.reward_terms.get(k, 0.0) for t in scored) / len(scored):.2f}" for k in names)
    skipped = len(trajs) - len(scored)
    line = f"reward:       mean {mean:.3f}" + (f" ({terms})" if terms else "")
    return line + (f"; {skipped} infra_error not scored" if skipped else "")
