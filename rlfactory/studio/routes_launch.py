"""Routes of the New run page: configs, validation, jobs (launch, log, stop, resume)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.routing import Route

from rlfactory.config import ConfigError
from rlfactory.studio.configs import check_config, example_configs, resolved_yaml, with_lines, with_section
from rlfactory.studio.jobs import COMMANDS, LaunchRefused, NeedsConfirmation, read_log
from rlfactory.studio.paths import BadPath, within_any
from rlfactory.studio.runs import find_runs, run_dir
from rlfactory.studio.web import ApiError, arg, body, ok, sse, sse_event

LOG_POLL_S = 0.3


def _state(request: Request) -> Any:
    return request.app.state.studio


def source_folder(st: Any, source: str | None) -> Path | None:
    """The folder a config's relative paths are taken from: `run:ID` -> the run's folder,
    a path -> its folder (inside the work or runs folder)."""
    if not source:
        return st.workspace
    if source.startswith("run:"):
        return run_dir(st.runs, source[4:])
    return within_any([st.workspace, st.runs], source).parent


async def list_configs(request: Request):
    st = _state(request)
    examples = [{"source": p.relative_to(st.workspace).as_posix(), "label": p.relative_to(st.workspace).as_posix()}
                for p in example_configs(st.workspace)]
    runs = [{"source": "run:" + p.relative_to(st.runs.resolve()).as_posix(),
             "label": "run " + p.relative_to(st.runs.resolve()).as_posix()}
            for p in find_runs(st.runs) if (p / "config.yaml").is_file()]
    # demo.yaml (train, tiny model, CPU minutes) is what a first launch should start from
    default = next((e["source"] for e in examples if e["source"] == "examples/demo.yaml"), examples[0]["source"] if examples else None)
    return ok({"examples": examples, "runs": runs, "default": default})


async def get_config(request: Request):
    st = _state(request)
    source = arg(request, "source", "")
    if source.startswith("run:"):
        path = run_dir(st.runs, source[4:]) / "config.yaml"
    else:
        path = within_any([st.workspace, st.runs], source)
    if path.suffix.lower() not in (".yaml", ".yml") or not path.is_file():
        raise ApiError(400, f"{source}: not a YAML config file")
    return ok({"source": source, "text": path.read_text(encoding="utf-8"), "base_dir": str(path.parent)})


async def check(request: Request):
    """The config validated as the command line does; with `command`, then also the command's own
    checks before it loads a model (preflight.py): env, tools, the reward it needs, the data."""
    st = _state(request)
    data = await body(request)
    overrides = [o for o in data.get("overrides") or [] if str(o).strip()]
    base = source_folder(st, data.get("source"))
    text, command = str(data.get("text", "")), data.get("command")
    if command is not None and command not in COMMANDS:
        raise ApiError(400, f"command {command!r} is not one of {', '.join(COMMANDS)}")
    checked = await run_in_threadpool(check_config, text, overrides, base)
    issues = checked.issues
    if checked.ok and command:
        issues = with_lines(await run_in_threadpool(st.jobs.preflight.check, command, resolved_yaml(checked.config), base),
                            text)
    return ok({"ok": checked.ok and not issues, "issues": [i.to_json() for i in issues], "command": command,
               "resolved": resolved_yaml(checked.config) if checked.ok else None})


async def set_section(request: Request):
    data = await body(request)
    section = data.get("section")
    if section not in ("reward", "tools", "env", "model"):
        raise ApiError(400, f"section {section!r} cannot be set here")
    try:
        return ok({"text": with_section(str(data.get("text", "")), section, data.get("value"))})
    except (ConfigError, ValueError) as e:
        raise ApiError(400, str(e)) from None


async def list_jobs(request: Request):
    return ok({"jobs": [j.to_json() for j in _state(request).jobs.list()]})


async def launch(request: Request):
    st = _state(request)
    data = await body(request)
    overrides = [str(o) for o in data.get("overrides") or [] if str(o).strip()]
    try:
        base = source_folder(st, data.get("source"))
        job = await run_in_threadpool(
            st.jobs.launch, str(data.get("command", "train")), str(data.get("text", "")), overrides, base,
            str(data.get("name", "")), data.get("model"), data.get("limit"),
        )
    except LaunchRefused as e:
        raise ApiError(400, "launch refused: " + str(e), [i.to_json() for i in e.issues]) from None
    return ok({"job": job.to_json()}, 201)


async def job_info(request: Request):
    job = _state(request).jobs.get(arg(request, "id"))
    text, _ = read_log(Path(job.log_path), 0)
    return ok({"job": job.to_json(), "log": text[-20000:]})


async def job_events(request: Request):
    """Server-sent events of a job: `log` (new output) and `state` (running -> how it ended)."""
    jobs = _state(request).jobs
    job = jobs.get(arg(request, "id"))
    offset = arg(request, "offset", 0, int)

    async def stream():
        nonlocal offset
        state = None
        while not await request.is_disconnected():
            text, offset = read_log(Path(job.log_path), offset)
            if text:
                yield sse_event("log", {"text": text, "offset": offset})
            current = jobs.get(job.id)
            if current.state != state:
                state = current.state
                yield sse_event("state", current.to_json())
            if state != "running":
                text, offset = read_log(Path(job.log_path), offset)
                if text:
                    yield sse_event("log", {"text": text, "offset": offset})
                yield sse_event("end", {})
                return
            await asyncio.sleep(LOG_POLL_S)

    return sse(stream())


async def stop_job(request: Request):
    data = await body(request)
    job = await run_in_threadpool(_state(request).jobs.stop, str(data.get("id", "")))
    return ok({"job": job.to_json()})


async def resume_run(request: Request):
    st = _state(request)
    data = await body(request)
    try:
        job = await run_in_threadpool(st.jobs.resume, run_dir(st.runs, str(data.get("run", ""))), bool(data.get("restart")))
    except NeedsConfirmation as e:  # the page asks the user, then calls again with restart
        raise ApiError(409, str(e)) from None
    except LaunchRefused as e:
        raise ApiError(400, "resume refused: " + str(e), [i.to_json() for i in e.issues]) from None
    except BadPath as e:
        raise ApiError(400, str(e)) from None
    return ok({"job": job.to_json()}, 201)


routes = [
    Route("/api/configs", list_configs),
    Route("/api/config", get_config),
    Route("/api/config/check", check, methods=["POST"]),
    Route("/api/config/section", set_section, methods=["POST"]),
    Route("/api/jobs", list_jobs),
    Route("/api/jobs", launch, methods=["POST"]),
    Route("/api/job", job_info),
    Route("/api/job/events", job_events),
    Route("/api/job/stop", stop_job, methods=["POST"]),
    Route("/api/run/resume", resume_run, methods=["POST"]),
]
