"""BFCL as an eval: roll out BFCL's single-turn categories with any model and family, score every
entry with bfcl-eval's own checkers, and report per category and as BFCL's leaderboard summary.

One rollout per entry, greedy. Each entry's record keeps every call the model made (the
`rlfactory bench bfcl` JSON lines), its whole output and BFCL's verdict with its error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from rlfactory.envs.bfcl.env import BfclEnv, decoded_of, verdict_of
from rlfactory.envs.bfcl.score import accuracy_summary

if TYPE_CHECKING:
    from rlfactory.config import RunConfig

ENV_NAME = "rlfactory.envs.bfcl:BfclEnv"


@dataclass
class EntryResult:
    id: str
    category: str
    valid: bool
    error: list[Any]
    error_type: str
    calls: list[dict[str, Any]]
    """Every call of the model's turn, decoded as BFCL scores it: [{name: arguments}]."""
    decode_error: str | None
    output: str
    status: str
    prompt_style: str
    prompt_tokens: int
    output_tokens: int


@dataclass
class BfclReport:
    model: str
    family: str
    prompt_style: str
    categories: dict[str, dict[str, float]] = field(default_factory=dict)
    """category -> {accuracy, correct, total}."""
    summary: dict[str, float] = field(default_factory=dict)
    """BFCL's leaderboard aggregates over the categories run (see score.accuracy_summary)."""
    entries: list[EntryResult] = field(default_factory=list)

    def header(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("entries")
        return d


def bfcl_config(model: str, family: str | None, prompt_style: str, overrides: list[str] | None = None) -> Any:
    """The RunConfig a BFCL run uses: the model, the bfcl env, greedy one-turn rollouts with room for
    BFCL's long function lists (rollout.max_total_tokens 8192), then the caller's dotted overrides."""
    from rlfactory.config import load_config
    from rlfactory.config import RunConfig

    base = [f"model.path={model}", f"env.name={ENV_NAME}", f"env.options.prompt_style={prompt_style}",
            "rollout.max_total_tokens=8192", "rollout.max_new_tokens=512"]
    if family:
        base.append(f"model.family={family}")
    return load_config(RunConfig, None, base + list(overrides or []))


async def run_bfcl(cfg: RunConfig, categories: list[str], *, limit: int | None = None,
                   logits_processor: Any = None) -> BfclReport:
    """Roll out `categories` (the first `limit` entries of each) with cfg's model and score them."""
    from rlfactory.train.session import open_rollout
    from rlfactory.train.evaluate import sampling_override

    style = str(cfg.env.options.get("prompt_style", "tools"))
    env = BfclEnv(prompt_style=style,  # type: ignore[arg-type]
                  test_categories=categories, train_categories=(), limit=limit)
    rows = env.load_split("test")
    report = BfclReport(model=str(cfg.model.path), family="", prompt_style=style)
    async with open_rollout(cfg, env=env, reward_mode="off", logits_processor=logits_processor) as session:
        report.family = str(session.tool_manager.family)
        with sampling_override(session.engine, greedy=True):
            trajs = await session.engine.run(rows, 1)
    for row, traj in zip(rows, trajs):
        verdict = verdict_of(traj) if traj.status != "infra_error" else None
        decoded = decoded_of(traj)
        prompt = next((s for s in traj.segments if s.role == "prompt"), None)
        report.entries.append(EntryResult(
            id=row["id"], category=row["category"], valid=bool(verdict and verdict.valid),
            error=verdict.error if verdict else [traj.error or "infra_error"],
            error_type=verdict.error_type if verdict else "rlfactory:infra_error",
            calls=decoded.calls, decode_error=decoded.error, output=traj.model_text(), status=traj.status,
            prompt_style=style, prompt_tokens=len(prompt.token_ids) if prompt else 0,
            output_tokens=sum(len(s.token_ids) for s in traj.segments if s.role == "model")))
    for category in categories:
        mine = [e for e in report.entries if e.category == category]
        right = sum(e.valid for e in mine)
        report.categories[category] = {"accuracy": right / len(mine) if mine else 0.0,
                                       "correct": float(right), "total": float(len(mine))}
    report.summary = accuracy_summary({c: (v["accuracy"], int(v["total"])) for c, v in report.categories.items()
                                       if v["total"]})
    return report
