"""BFCL as an eval: roll out BFCL's categories with any model and family, score every entry with
bfcl-eval's own checkers, and report per category and as BFCL's leaderboard summary.

One rollout per entry, greedy: single-turn categories on the `bfcl` env (AST / relevance checker),
multi-turn ones on the `bfcl_multi_turn` env (BFCL's backends across user turns; its state and
response checkers). Each entry's record keeps every call the model made (the `rlfactory bench bfcl`
JSON lines), its whole output and BFCL's verdict with its error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from rlfactory.envs.bfcl.env import BfclEnv, decoded_of, verdict_of
from rlfactory.envs.bfcl.multi_turn import check_multi_turn
from rlfactory.envs.bfcl.multi_turn_env import MULTI_TURN_CATEGORIES, BfclMultiTurnEnv, calls_per_turn
from rlfactory.envs.bfcl.score import Decoded, Verdict, accuracy_summary
from rlfactory.trajectory import Trajectory

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
    turns: list[list[list[str]]] | None = None
    """Multi-turn entries: the calls that ran per BFCL turn and step, as BFCL's call strings."""


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
    """The RunConfig a BFCL run uses: the model, the bfcl env, greedy rollouts with room for BFCL's
    long function lists and multi-turn conversations (rollout.max_total_tokens 16384, tool results
    up to 2048 tokens), then the caller's dotted overrides."""
    from rlfactory.config import load_config
    from rlfactory.config import RunConfig

    base = [f"model.path={model}", f"env.name={ENV_NAME}", f"env.options.prompt_style={prompt_style}",
            "rollout.max_total_tokens=16384", "rollout.max_new_tokens=512", "rollout.max_observation_tokens=2048"]
    if family:
        base.append(f"model.family={family}")
    return load_config(RunConfig, None, base + list(overrides or []))


async def run_bfcl(cfg: RunConfig, categories: list[str], *, limit: int | None = None,
                   logits_processor: Any = None) -> BfclReport:
    """Roll out `categories` (the first `limit` entries of each) with cfg's model and score them."""
    style = str(cfg.env.options.get("prompt_style", "tools"))
    report = BfclReport(model=str(cfg.model.path), family="", prompt_style=style)
    single = [c for c in categories if c not in MULTI_TURN_CATEGORIES]
    multi = [c for c in categories if c in MULTI_TURN_CATEGORIES]
    if single:
        env = BfclEnv(prompt_style=style,  # type: ignore[arg-type]
                      test_categories=single, train_categories=(), limit=limit)
        await _run(cfg, env, report, style, logits_processor, _single_turn_verdict)
    if multi:
        if style != "tools":
            raise ValueError("bfcl: the multi-turn categories run with prompt style 'tools' only")
        menv = BfclMultiTurnEnv(test_categories=multi, limit=limit)
        await _run(cfg, menv, report, style, logits_processor, _multi_turn_verdict)
    for category in categories:
        mine = [e for e in report.entries if e.category == category]
        right = sum(e.valid for e in mine)
        report.categories[category] = {"accuracy": right / len(mine) if mine else 0.0,
                                       "correct": float(right), "total": float(len(mine))}
    report.summary = accuracy_summary({c: (v["accuracy"], int(v["total"])) for c, v in report.categories.items()
                                       if v["total"]})
    return report


def _single_turn_verdict(traj: Trajectory) -> tuple[Verdict, Decoded, None]:
    return verdict_of(traj), decoded_of(traj), None


def _multi_turn_verdict(traj: Trajectory) -> tuple[Verdict, Decoded, list[list[list[str]]]]:
    turns = calls_per_turn(traj)
    ran = [{r.name: r.arguments} for r in traj.tool_calls if r.status == "ok"]
    return check_multi_turn(traj.info, turns), Decoded(ran), turns


async def _run(cfg: RunConfig, env: Any, report: BfclReport, style: str, logits_processor: Any,
               judge: Any) -> None:
    """Roll out every row of `env`'s test split once, greedily, and add each entry's record."""
    from rlfactory.train.evaluate import sampling_override
    from rlfactory.train.session import open_rollout

    rows = env.load_split("test")
    async with open_rollout(cfg, env=env, reward_mode="off", logits_processor=logits_processor) as session:
        report.family = str(session.tool_manager.family)
        with sampling_override(session.engine, greedy=True):
            trajs = await session.engine.run(rows, 1)
    for row, traj in zip(rows, trajs):
        verdict, decoded, turns = judge(traj) if traj.status != "infra_error" else (None, Decoded(), None)
        prompt = next((s for s in traj.segments if s.role == "prompt"), None)
        report.entries.append(EntryResult(
            id=row["id"], category=row["category"], valid=bool(verdict and verdict.valid),
            error=verdict.error if verdict else [traj.error or "infra_error"],
            error_type=verdict.error_type if verdict else "rlfactory:infra_error",
            calls=decoded.calls, decode_error=decoded.error, output=traj.model_text(), status=traj.status,
            prompt_style=style, prompt_tokens=len(prompt.token_ids) if prompt else 0,
            output_tokens=sum(len(s.token_ids) for s in traj.segments if s.role == "model"), turns=turns))
