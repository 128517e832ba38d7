"""The Playground's rollout, in its own process: `python -m rlfactory.studio.playground_worker`.

Reads one JSON request on stdin, rolls out one trajectory with rlfactory's rollout API
(`open_rollout`, the same engine training uses) and writes one JSON event per line on stdout as
the rollout happens: `status`, `prompt`, `model` (a model turn's tokens with the sampler's
logprobs), `tool_calls`, `tool_results`, `observation`, then `trajectory` (the whole record,
scored when the env has a reward and a reference answer was given), or `error`; `done` last.

Request: {config: path to a run config or a tool config, model: "tiny:1m" or a folder,
question, image (optional: a data:image/png or data:image/jpeg base64 URL shown with the question;
needs the plain prompt env and a vision-language model), answer (optional), max_turns,
max_new_tokens, temperature, seed,
script (optional: the text to force for each model turn, in order; the model's own tokens are
replaced by these, through rlfactory.rollout.scripted.ScriptedPolicy)}.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from rlfactory.images import Image
    from rlfactory.protocols import GenRequest, GenResult
    from rlfactory.rollout.observer import RolloutObserver
    from rlfactory.tools.base import ToolCall, ToolResult
    from rlfactory.trajectory import Trajectory

PROMPT_ENV = "rlfactory.rollout.prompt_env:PromptEnv"


def emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def build_config(req: dict[str, Any]) -> Any:
    """The RunConfig of a playground request (ConfigError names the key)."""
    from rlfactory.config import apply_overrides, read_yaml, validate
    from rlfactory.config import RunConfig

    path = Path(req["config"]) if req.get("config") else None
    data: dict[str, Any] = {}
    base_dir = None
    if path is not None:
        base_dir = str(path.parent)
        bare = path.suffix.lower() in (".json", ".pydata")
        raw = {} if bare else read_yaml(path)
        if bare or "mcpServers" in raw:  # a tool config: a plain prompt env with those tools
            data = {"tools": {"mcp": str(path)}, "env": {"name": PROMPT_ENV},
                    "reward": {"terms": {"exact_match": 1.0, "format": 0.1}}}
        else:
            data = raw
            # module:function names (tools.python, env.name, reward terms) import from the config's
            # folder, as on the command line
            from rlfactory.imports import make_config_folder_importable

            make_config_folder_importable(path)
    else:
        data = {"env": {"name": PROMPT_ENV}}
    overrides = [f"model.path={req.get('model') or 'tiny:1m'}", f"sampling.seed={int(req.get('seed', 0))}",
                 "trainer.progress=false"]
    for key, name in (("max_turns", "rollout.max_turns"), ("max_new_tokens", "rollout.max_new_tokens"),
                      ("temperature", "sampling.temperature")):
        if req.get(key) not in (None, ""):
            overrides.append(f"{name}={req[key]}")
    # The env's turn limit holds unless the user gives one; a given one is the env's too, so the
    # config's own `env.options.max_turns` cannot disagree with it.
    options = (data.get("env") or {}).get("options") if isinstance(data.get("env"), dict) else None
    if req.get("max_turns") not in (None, "") and isinstance(options, dict) and "max_turns" in options:
        overrides.append(f"env.options.max_turns={req['max_turns']}")
    data = apply_overrides(data, overrides)
    return validate(RunConfig, data, f"{path or 'playground'} (with {' '.join(overrides)})", base_dir)


def question_row(req: dict[str, Any], env: Any) -> dict[str, Any]:
    """The playground's dataset row: the question, and with an image one user message holding the
    question's text and the image (PromptEnv opens with a row's `messages`, after its system prompt).
    Any other env builds its own prompt from the row, so an image there is refused (ValueError)."""
    from rlfactory.rollout.prompt_env import PromptEnv

    row: dict[str, Any] = {"id": "playground", "question": req["question"]}
    image = req.get("image")
    if image:
        if type(env) is not PromptEnv:  # a subclass (the agent env) builds its prompt its own way
            raise ValueError(f"an image in the question needs a tool config or the prompt env ({PROMPT_ENV}): "
                             f"env {type(env).__name__} builds its own prompts")
        row["messages"] = [{"role": "user", "content": [{"type": "text", "text": req["question"]},
                                                        {"type": "image", "image": image}]}]
    return row


def check_vision(tool_manager: Any, model_path: str) -> None:
    """Refuse (one line) an image for a model whose chat family renders text only: its template
    would show the image part as text or fail on it."""
    from rlfactory.chat.vision import VisionToolManager

    if not isinstance(tool_manager, VisionToolManager):
        raise ValueError(f"the model {model_path} reads text only ({type(tool_manager).__name__}): pick a "
                         "vision-language model such as tiny-vl:1m to ask about an image")


def image_views(images: list[Image] | None) -> list[dict[str, Any]]:
    """Each image's reference with `src`, its bytes as a data: URL (a playground rollout's images
    live in no run folder for /api/run/image to serve)."""
    import base64

    return [{**im.ref(), "src": f"data:{im.mime};base64,{base64.b64encode(im.data or b'').decode()}"}
            for im in images or ()]


def watcher(tokens: Callable[[list[int], list[float] | None], list], decode: Callable[[list[int]], str]) -> RolloutObserver:
    """The rollout's observer that streams it: the prompt, each model turn, its tool calls and
    results, and each observation (emitted as the next turn starts, when the model reads it)."""
    from rlfactory.rollout.observer import RolloutObserver

    def turn_started(traj: Trajectory, request: GenRequest) -> None:
        seg = traj.segments[-1]  # the prompt, or the observation this turn continues from
        kind = "prompt" if traj.turns == 0 else "observation"
        emit({"type": kind, "tokens": tokens(seg.token_ids, None), "text": decode(seg.token_ids),
              "images": image_views(seg.images)})

    def tokens_generated(traj: Trajectory, res: GenResult) -> None:
        emit({"type": "model", "tokens": tokens(res.token_ids, res.logprobs), "text": res.text or decode(res.token_ids),
              "finish_reason": res.finish_reason, "gen_s": res.gen_s})

    def tools_started(traj: Trajectory, calls: list[ToolCall]) -> None:
        emit({"type": "tool_calls", "calls": [{"name": c.name, "arguments": c.arguments} for c in calls]})

    def tool_results(traj: Trajectory, calls: list[ToolCall], results: list[ToolResult]) -> None:
        emit({"type": "tool_results", "results": [
            {"name": c.name, "status": r.status, "is_error": r.is_error, "text": r.text, "latency_s": r.latency_s,
             "cached": r.cached} for c, r in zip(calls, results)]})

    return RolloutObserver(turn_started=turn_started, tokens_generated=tokens_generated, tools_started=tools_started,
                           tool_results=tool_results)


def script_policy(script: list[str], tokenizer: Any, tool_manager: Any) -> Any:
    """A ScriptedPolicy forcing turn k's text (the last entry repeats)."""
    from rlfactory.rollout.scripted import ScriptedPolicy, TurnPlan

    turns = {"n": 0}

    def plan(_context: str) -> TurnPlan:
        k = min(turns["n"], len(script) - 1)
        turns["n"] += 1
        return TurnPlan(free=0, forced=script[k])

    end = list(tool_manager.stop_token_ids())[0]
    return ScriptedPolicy(tokenizer, plan, end, banned=[])


async def run(req: dict[str, Any]) -> None:
    from rlfactory.train.prepare import build_env

    cfg = build_config(req)
    env = build_env(cfg)  # before the model loads: an image the env cannot show costs one line, not a load
    try:
        await roll_out(req, cfg, env)
    finally:
        env.close()


async def roll_out(req: dict[str, Any], cfg: Any, env: Any) -> None:
    from rlfactory.generation.model_source import load_model, pick_device
    from rlfactory.train.session import open_rollout, tool_manager_for

    row = question_row(req, env)
    emit({"type": "status", "message": f"loading {cfg.model.path}"})
    model, tokenizer = load_model(cfg.model, pick_device(cfg.model.device))
    piece: dict[int, str] = {}

    def tokens(ids: list[int], lps: list[float] | None) -> list:
        out = []
        for j, i in enumerate(ids):
            if i not in piece:
                piece[i] = tokenizer.decode([i], skip_special_tokens=False)
            out.append([i, piece[i], lps[j] if lps is not None and j < len(lps) else None, None])
        return out

    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    processor = None
    script = [s for s in (req.get("script") or []) if isinstance(s, str) and s.strip()]
    if script or "messages" in row:
        tm = tool_manager_for(cfg.model, tokenizer, model)
        if "messages" in row:  # before the tools start
            check_vision(tm, cfg.model.path)
        if script:
            processor = script_policy(script, tokenizer, tm)
    emit({"type": "status", "message": "starting tools"})
    async with open_rollout(cfg, model=model, tokenizer=tokenizer, env=env, logits_processor=processor,
                            reward_mode="off") as session:  # scored below, only when an answer is given
        engine = session.engine
        emit({"type": "status", "message": f"rolling out ({len(session.runner.specs())} tools)",
              "tools": [s.name for s in session.runner.specs()]})
        answer = (req.get("answer") or "").strip()
        if answer:
            row.update(answer=answer, golden_answers=[answer])
        (traj,) = await engine.run([row], 1, observer=watcher(tokens, decode))
        if answer and traj.status != "infra_error":
            from rlfactory.config import ConfigError
            from rlfactory.rewards import build_reward

            try:
                default = session.env.reward()
            except NotImplementedError:
                default = None
            try:
                reward = build_reward(cfg.reward, default=default, tools=session.runner.tools())
            except ConfigError:
                reward = None
            if reward is not None:
                s = await reward.score(traj)
                traj.reward, traj.reward_terms = float(s.total), dict(s.terms)
        from rlfactory.studio.steps import trajectory_view
        from rlfactory.studio.tokens import TokenText

        text_of = TokenText(lambda i: piece.get(i) or tokenizer.decode([i], skip_special_tokens=False),
                            tokenizer.convert_ids_to_tokens)
        d = traj.to_dict()
        if "messages" in d["info"]:  # the image travels once, in the prompt segment's view, not again here
            d["info"]["messages"] = [{**m, "content": [{"type": "image"} if p.get("type") == "image" else p
                                                       for p in m["content"]]} for m in d["info"]["messages"]]
        view = trajectory_view(d, text_of)
        for seg, shown in zip(traj.segments, view["segments"]):
            shown["images"] = image_views(seg.images)
        emit({"type": "trajectory", "trajectory": d, "view": view})


def main() -> int:
    req = json.loads(sys.stdin.readline() or "{}")
    try:
        asyncio.run(run(req))
    except KeyboardInterrupt:
        emit({"type": "error", "message": "stopped"})
    except Exception as e:  # one line for the page; the traceback on stderr
        import traceback

        traceback.print_exc()
        emit({"type": "error", "message": f"{type(e).__name__}: {e}"})
    emit({"type": "done"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
