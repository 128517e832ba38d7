"""Routes of the Runs, Live metrics and Trajectory viewer pages."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse
from starlette.routing import Route

from rlfactory.studio import metrics as M
from rlfactory.studio.paths import inside
from rlfactory.studio.runs import find_runs, list_steps, run_dir, summarize
from rlfactory.studio.steps import step_path, trajectory_view
from rlfactory.studio.tokens import token_text_for, tokenizer_folder
from rlfactory.studio.web import ApiError, arg, ok, sse, sse_event

POLL_S = 0.5
HEARTBEAT_S = 15.0


def _state(request: Request) -> Any:
    return request.app.state.studio


def _run(request: Request):
    return run_dir(_state(request).runs, arg(request, "run"))


async def list_runs(request: Request):
    st = _state(request)

    def work() -> list[dict[str, Any]]:
        return [summarize(st.runs, p, st.jobs.latest_for(p)).to_json() for p in find_runs(st.runs)]

    return ok({"root": str(st.runs), "runs": await run_in_threadpool(work)})


async def run_info(request: Request):
    st = _state(request)
    path = _run(request)
    cfg = path / "config.yaml"
    return ok({"summary": summarize(st.runs, path, st.jobs.latest_for(path)).to_json(),
               "config": cfg.read_text(encoding="utf-8") if cfg.is_file() else "",
               "steps": list_steps(path)})


async def run_metrics(request: Request):
    path = _run(request)
    points = max(10, min(int(arg(request, "points", 2000, int)), 20000))
    first, last = arg(request, "from", None, int), arg(request, "to", None, int)

    def work() -> dict[str, Any]:
        if first is not None and last is not None:
            return {"train": M.window(path / "metrics.jsonl", first, last, points).to_json(),
                    "eval": M.window(path / "eval.jsonl", first, last, points).to_json()}
        return {"train": M.overview(path / "metrics.jsonl", points).to_json(),
                "eval": M.overview(path / "eval.jsonl", points).to_json()}

    return ok(await run_in_threadpool(work))


async def run_events(request: Request):
    """Server-sent events for one run: `metrics` (records appended since the given offsets),
    `reset` (the logs were rewritten: reload), `steps` (new trajectory files), `status` (the run's
    summary, whenever its status or its last step changes)."""
    st = _state(request)
    path = _run(request)
    train = M.JsonlTail(path / "metrics.jsonl", arg(request, "offset", 0, int))
    evals = M.JsonlTail(path / "eval.jsonl", arg(request, "eval_offset", 0, int))

    async def stream():
        steps = list_steps(path)
        status = None
        beat = time.monotonic()
        yield sse_event("hello", {"offset": train.offset})
        while not await request.is_disconnected():
            new, reset = train.read_new()
            new_eval, reset_eval = evals.read_new()
            if reset or reset_eval:
                yield sse_event("reset", {})
                return
            if new or new_eval:
                yield sse_event("metrics", {"train": new, "eval": new_eval, "offset": train.offset,
                                            "eval_offset": evals.offset})
            now_steps = list_steps(path)
            if now_steps != steps:
                yield sse_event("steps", {"steps": now_steps})
                steps = now_steps
            summary = summarize(st.runs, path, st.jobs.latest_for(path)).to_json()
            now = (summary["status"], summary["steps_done"])  # the page's header shows both
            if now != status:
                status = now
                yield sse_event("status", summary)
            if time.monotonic() - beat > HEARTBEAT_S:
                beat = time.monotonic()
                yield ": heartbeat\n\n"
            await asyncio.sleep(POLL_S)

    return sse(stream())


async def step_view(request: Request):
    st = _state(request)
    path = _run(request)
    step = arg(request, "step", None, int)
    if step is None:
        raise ApiError(400, "missing query parameter 'step'")

    def work() -> dict[str, Any]:
        index = st.steps.get(step_path(path, step))
        keep = index.filter(
            status=arg(request, "status") or None, min_reward=arg(request, "min_reward", None, float),
            max_reward=arg(request, "max_reward", None, float), tool_errors=arg(request, "tool_errors") == "1",
            text=arg(request, "q"),
        )
        terms = sorted({k for s in index.summaries for k in s.reward_terms})
        return {"step": step, "count": len(index.summaries), "shown": len(keep), "terms": terms,
                "groups": index.groups(keep)}

    return ok(await run_in_threadpool(work))


async def trajectory(request: Request):
    st = _state(request)
    path = _run(request)
    step, index = arg(request, "step", None, int), arg(request, "index", None, int)
    if step is None or index is None:
        raise ApiError(400, "missing query parameter 'step' or 'index'")

    def work() -> dict[str, Any]:
        record = st.steps.get(step_path(path, step)).read(index)
        if arg(request, "raw") == "1":
            return record
        view = trajectory_view(record, token_text_for(tokenizer_folder(path)))
        view.update(step=step, index=index, run=arg(request, "run"))
        return view

    return ok(await run_in_threadpool(work))


# An image file's name is its content hash (rlfactory.images.Image.file_name): nothing else is served,
# so no name can walk out of the folder or reach a file the trajectories did not store.
_IMAGE_NAME = re.compile(r"[0-9a-f]{64}\.(png|jpg)")
_IMAGE_MIME = {"png": "image/png", "jpg": "image/jpeg"}


async def image(request: Request):
    """One image of the run's logged trajectories: `trajectories/images/<sha256>.<png|jpg>`
    (where `write_jsonl` stores them beside the step files). Its name fixes its bytes, so the
    browser may keep it."""
    path = _run(request)
    name = arg(request, "name", "")
    m = _IMAGE_NAME.fullmatch(name)
    if m is None:
        raise ApiError(400, f"image name {name[:80]!r} is not <sha256>.png or <sha256>.jpg (64 lower-case hex digits)")
    file = inside(path, f"trajectories/images/{name}", must_exist=False)  # also refuses a symlink out of the run
    if not file.is_file():
        raise ApiError(404, f"no image {name} in this run's trajectories/images")
    return FileResponse(file, media_type=_IMAGE_MIME[m.group(1)],
                        headers={"Cache-Control": "private, max-age=86400, immutable", "X-Content-Type-Options": "nosniff"})


routes = [
    Route("/api/runs", list_runs),
    Route("/api/run", run_info),
    Route("/api/run/metrics", run_metrics),
    Route("/api/run/events", run_events),
    Route("/api/run/step", step_view),
    Route("/api/run/trajectory", trajectory),
    Route("/api/run/image", image),
]
