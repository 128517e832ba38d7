"""Routes that manage runs: tags and notes, deletion, config diffs, a run's job (for Stop on the
run's page), and the "what changed" view between two steps of one prompt."""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.routing import Route

from rlfactory.studio.changes import what_changed
from rlfactory.studio.run_meta import MetaError, config_diff, delete_run, read_notes, write_notes
from rlfactory.studio.runs import find_runs, run_dir, summarize
from rlfactory.studio.steps import step_path
from rlfactory.studio.web import ApiError, arg, body, ok

MAX_DIFF_RUNS = 10


def _state(request: Request) -> Any:
    return request.app.state.studio


def _id(st: Any, path) -> str:
    return path.relative_to(st.runs.resolve()).as_posix()


async def all_notes(request: Request):
    """Every run's tags and notes, by run id (the Runs page searches them)."""
    st = _state(request)

    def work() -> dict[str, Any]:
        return {_id(st, p): read_notes(p).to_json() for p in find_runs(st.runs)}

    return ok({"notes": await run_in_threadpool(work)})


async def set_notes(request: Request):
    st = _state(request)
    data = await body(request, max_bytes=1 << 20)
    path = run_dir(st.runs, str(data.get("run", "")))
    try:
        notes = write_notes(path, data.get("tags"), data.get("notes"))
    except MetaError as e:
        raise ApiError(400, str(e)) from None
    return ok({"run": _id(st, path), **notes.to_json()})


async def delete(request: Request):
    """Delete a run folder. The body must repeat the run id in `confirm` (the page asks first)."""
    st = _state(request)
    data = await body(request)
    run_id = str(data.get("run", ""))
    if data.get("confirm") != run_id:
        raise ApiError(400, f"delete {run_id!r}: not confirmed (send confirm equal to the run id); nothing deleted")
    path = run_dir(st.runs, run_id)
    job = st.jobs.latest_for(path)
    summary = summarize(st.runs, path, job)
    try:
        await run_in_threadpool(delete_run, st.runs, path, summary.status, summary.status_reason)
    except MetaError as e:
        raise ApiError(409, str(e)) from None
    return ok({"deleted": run_id})


async def diff(request: Request):
    st = _state(request)
    ids = request.query_params.getlist("run")
    if not 2 <= len(ids) <= MAX_DIFF_RUNS:
        raise ApiError(400, f"config diff: give 2 to {MAX_DIFF_RUNS} runs (run=...&run=...), got {len(ids)}")
    runs = {rid: run_dir(st.runs, rid) for rid in dict.fromkeys(ids)}
    return ok((await run_in_threadpool(config_diff, runs)).to_json())


async def run_job(request: Request):
    """The run's latest studio job (null when it was started elsewhere)."""
    st = _state(request)
    job = st.jobs.latest_for(run_dir(st.runs, arg(request, "run")))
    return ok({"job": job.to_json() if job is not None else None})


async def changes(request: Request):
    st = _state(request)
    path = run_dir(st.runs, arg(request, "run"))
    a, b = arg(request, "a", None, int), arg(request, "b", None, int)
    if a is None or b is None:
        raise ApiError(400, "missing query parameter 'a' or 'b' (the two steps)")
    key = arg(request, "key") or None

    def work() -> dict[str, Any]:
        return what_changed(st.prompts, st.steps.get(step_path(path, a)), a, st.steps.get(step_path(path, b)), b, key)

    return ok(await run_in_threadpool(work))


routes = [
    Route("/api/runs/notes", all_notes),
    Route("/api/runs/diff", diff),
    Route("/api/run/notes", set_notes, methods=["POST"]),
    Route("/api/run/delete", delete, methods=["POST"]),
    Route("/api/run/job", run_job),
    Route("/api/run/changes", changes),
]
