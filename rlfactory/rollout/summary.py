"""What a batch of trajectories looks like, in numbers: statuses, turns, tool calls, speed."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rlfactory.trajectory import Trajectory


def summarize(trajs: list[Trajectory], wall_s: float) -> dict[str, Any]:
    """Counts and rates over `trajs`, rolled out in `wall_s` seconds."""
    n = max(len(trajs), 1)
    calls = [c for t in trajs for c in t.tool_calls]
    gen_tokens = sum(len(s.token_ids) for t in trajs for s in t.segments if s.role == "model")
    tool_s = [t.metrics.get("tool_s", 0.0) for t in trajs]
    latencies = sorted(c.latency_s for c in calls if c.status != "malformed")
    return {
        "trajectories": len(trajs),
        "wall_s": wall_s,
        "status": dict(Counter(t.status for t in trajs)),
        "turns_mean": sum(t.turns for t in trajs) / n,
        "turns": dict(sorted(Counter(t.turns for t in trajs).items())),
        "tool_calls": len(calls),
        "tool_call_status": dict(Counter(c.status for c in calls)),
        "tool_cached": sum(c.cached for c in calls),
        "tool_latency_mean_s": sum(latencies) / len(latencies) if latencies else 0.0,
        "tool_latency_p50_s": latencies[len(latencies) // 2] if latencies else 0.0,
        "tool_latency_max_s": latencies[-1] if latencies else 0.0,
        "tool_time_per_traj_mean_s": sum(tool_s) / n,
        "tool_time_total_s": sum(tool_s),
        "gen_tokens": gen_tokens,
        "gen_tokens_per_s": gen_tokens / wall_s if wall_s > 0 else 0.0,
        "tokens_mean": sum(len(t.input_ids) for t in trajs) / n,
    }


def format_summary(s: dict[str, Any]) -> str:
    def kv(d: dict) -> str:
        return ", ".join(f"{k}={v}" for k, v in d.items()) or "-"

    return "\n".join(
        [
            f"trajectories: {s['trajectories']} in {s['wall_s']:.2f} s",
            f"status:       {kv(s['status'])}",
            f"turns:        mean {s['turns_mean']:.2f} ({kv(s['turns'])})",
            f"tool calls:   {s['tool_calls']} ({kv(s['tool_call_status'])}; cached {s['tool_cached']})",
            f"tool time:    latency mean {s['tool_latency_mean_s']:.3f} s, p50 {s['tool_latency_p50_s']:.3f} s, "
            f"max {s['tool_latency_max_s']:.3f} s; per trajectory {s['tool_time_per_traj_mean_s']:.3f} s, "
            f"total {s['tool_time_total_s']:.2f} s",
            f"generation:   {s['gen_tokens']} tokens, {s['gen_tokens_per_s']:.1f} tokens/s; "
            f"mean trajectory length {s['tokens_mean']:.1f} tokens",
        ]
    )
