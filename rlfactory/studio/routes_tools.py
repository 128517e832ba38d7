"""Routes of the Tools, Rewards, Data and Playground pages, and uploads."""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
import uuid
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.routing import Route

from rlfactory.studio import datasets, scoring
from rlfactory.studio.paths import BadPath, safe_name, within_any
from rlfactory.studio.runs import find_runs, run_dir
from rlfactory.studio.steps import step_path
from rlfactory.studio.toolbox import parse_arguments, python_names, tools_config
from rlfactory.studio.web import ApiError, arg, body, ok, sse, sse_event

TOOL_SUFFIXES = (".json", ".yaml", ".yml", ".pydata")
DATA_SUFFIXES = (".parquet", ".jsonl", ".json", ".csv")


def _state(request: Request) -> Any:
    return request.app.state.studio


def _file(st: Any, path: str) -> Path:
    p = within_any([st.workspace, st.runs], path)
    if not p.is_file():
        raise BadPath(f"{path!r} is not a file")
    return p


# ---- files and uploads -----------------------------------------------------------------------

async def list_files(request: Request):
    """Candidate files for a page: `kind` tools | data, from the work folder's examples/, the
    runs folder's data/ and the uploads."""
    st = _state(request)
    suffixes = DATA_SUFFIXES if arg(request, "kind", "tools") == "data" else TOOL_SUFFIXES
    roots = [st.workspace / "examples", st.runs / "data", st.runs / ".studio" / "uploads"]
    out = []
    for root in roots:
        for p in sorted(root.rglob("*")) if root.is_dir() else []:
            if p.is_file() and p.suffix.lower() in suffixes and p.stat().st_size < 512 << 20:
                if suffixes == DATA_SUFFIXES and p.suffix.lower() == ".json" and not _json_list(p):
                    continue  # an object (an MCP config, say) is no dataset: a .json dataset is a list of rows
                base = st.workspace if p.resolve().is_relative_to(st.workspace) else st.runs
                label = p.resolve().relative_to(base).as_posix()
                out.append({"path": str(p.resolve()), "label": label})
    if suffixes == DATA_SUFFIXES:  # .json last: often a config, not data
        out.sort(key=lambda f: (Path(f["path"]).suffix.lower() == ".json", f["label"]))
    return ok({"files": out})


def _json_list(path: Path) -> bool:
    """Whether a .json file holds a list (its first character past any whitespace is `[`)."""
    with open(path, "rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head[:1] == b"["


async def upload(request: Request):
    """Raw request body -> runs/.studio/uploads/<id>/<name> (refused past the size limit)."""
    st = _state(request)
    name = safe_name(arg(request, "name", ""), "file name")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > st.max_upload_bytes:
        raise ApiError(413, f"upload too large: {int(declared)} bytes, the limit is {st.max_upload_bytes} "
                            "(rlfactory ui --max-upload-mb)")
    folder = st.runs / ".studio" / "uploads" / uuid.uuid4().hex[:10]
    folder.mkdir(parents=True)
    target, size = folder / name, 0
    with open(target, "wb") as f:
        async for chunk in request.stream():
            size += len(chunk)
            if size > st.max_upload_bytes:
                f.close()
                target.unlink()
                folder.rmdir()
                raise ApiError(413, f"upload too large: over {st.max_upload_bytes} bytes (rlfactory ui --max-upload-mb)")
            f.write(chunk)
    return ok({"path": str(target), "label": target.relative_to(st.runs).as_posix(), "bytes": size}, 201)


# ---- tools -------------------------------------------------------------------------------------

async def tools_load(request: Request):
    from rlfactory.tools.runner import ToolStartError

    st = _state(request)
    data = await body(request)
    path = _file(st, data["path"]) if data.get("path") else None
    python = python_names(str(data.get("python") or ""))
    if path is None and not python:
        raise ApiError(400, "choose a tool config file or give module:function names")
    cfg = tools_config(path, python, data.get("timeout_s"))
    try:
        # module:function names resolve from the config's folder first, as on the command line
        session = await st.tools.open(cfg, str(path or ", ".join(python)), [*([path.parent] if path else []), st.workspace])
    except ToolStartError as e:
        raise ApiError(400, f"tools did not start: {e}") from None
    except (ImportError, AttributeError, ValueError) as e:
        raise ApiError(400, f"tools.python: {e}") from None
    if data.get("previous"):
        await st.tools.close(str(data["previous"]))
    return ok({"session": session.id, "source": session.source, "tools": session.listing()})


async def tools_call(request: Request):
    st = _state(request)
    data = await body(request)
    arguments = parse_arguments(data.get("arguments", {}))
    return ok(await st.tools.call(str(data.get("session", "")), str(data.get("name", "")), arguments))


async def tools_close(request: Request):
    data = await body(request)
    await _state(request).tools.close(str(data.get("session", "")))
    return ok({"closed": True})


# ---- rewards -------------------------------------------------------------------------------------

async def reward_terms(request: Request):
    return ok({"terms": scoring.term_catalog()})


async def reward_score(request: Request):
    st = _state(request)
    data = await body(request)
    traj = data.get("trajectory")
    pick = data.get("pick")
    if pick:
        path = run_dir(st.runs, str(pick.get("run", "")))
        traj = await run_in_threadpool(lambda: st.steps.get(step_path(path, int(pick["step"]))).read(int(pick["index"])))
    elif isinstance(traj, str):
        import json

        try:
            traj = json.loads(traj)
        except ValueError as e:
            raise ApiError(400, f"trajectory: not valid JSON ({e})") from None
    if not isinstance(traj, dict):
        raise ApiError(400, "trajectory: pick one from a run or paste its JSON line")
    section = scoring.reward_section(data.get("terms") or {}, data.get("options") or None, data.get("answer"))
    return ok(await scoring.score(section, traj))


# ---- data --------------------------------------------------------------------------------------

async def data_preview(request: Request):
    st = _state(request)
    data = await body(request)
    path = _file(st, str(data.get("path", "")))
    try:
        return ok(await run_in_threadpool(datasets.preview, path))
    except datasets.DataError as e:
        raise ApiError(400, str(e)) from None


async def data_convert(request: Request):
    st = _state(request)
    data = await body(request)
    src = _file(st, str(data.get("path", "")))
    name = safe_name(str(data.get("name", "")), "output name")
    out = st.runs / "data" / (name if name.endswith(".parquet") else name + ".parquet")
    try:
        result = await run_in_threadpool(
            datasets.convert, src, out, str(data.get("question_column", "question")),
            str(data.get("answer_column", "answer")), str(data.get("template") or ""),
            str(data.get("data_source") or "custom"), str(data.get("split") or "train"),
        )
    except datasets.DataError as e:
        raise ApiError(400, str(e)) from None
    result["path"] = str(out)
    return ok(result, 201)


async def data_template(request: Request):
    from rlfactory.envs.search.prompts import SEARCHR1_TEMPLATE

    return ok({"template": SEARCHR1_TEMPLATE})


# ---- playground ----------------------------------------------------------------------------------

async def models(request: Request):
    """Models to try: rlfactory's tiny models and every checkpoint / SFT output in the runs."""
    st = _state(request)
    out = [{"path": "tiny:1m", "label": "tiny:1m (rlfactory's untrained 1M model)"},
           {"path": "tiny:10m", "label": "tiny:10m"},
           {"path": "tiny-vl:1m", "label": "tiny-vl:1m (rlfactory's untrained tiny vision-language model)"}]
    root = st.runs.resolve()
    for run in find_runs(st.runs):
        for ck in sorted((run / "checkpoints").glob("step_*/model")) if (run / "checkpoints").is_dir() else []:
            out.append({"path": str(ck), "label": ck.relative_to(root).as_posix()})
    for model in sorted(root.glob("*/model")) + sorted(root.glob("*/*/model")):
        if (model / "config.json").is_file() and "checkpoints" not in model.parts:
            out.append({"path": str(model), "label": model.relative_to(root).as_posix()})
    return ok({"models": out})


IMAGE_URL = re.compile(r"data:(image/(?:png|jpeg));base64,")


def question_image(value: Any, max_bytes: int) -> str | None:
    """The playground question's image: a `data:image/png` or `data:image/jpeg` base64 URL whose
    bytes (at most `max_bytes`, the upload cap) Pillow reads; None for none. ApiError names `image`."""
    from rlfactory.images import ImageError, image_from_bytes

    if value in (None, ""):
        return None
    m = IMAGE_URL.match(value) if isinstance(value, str) else None
    if m is None:
        raise ApiError(400, "image: give a data:image/png or data:image/jpeg base64 URL")
    try:
        raw = base64.b64decode(value[m.end():], validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "image: the data URL is not valid base64") from None
    if len(raw) > max_bytes:
        raise ApiError(413, f"image: {len(raw)} bytes, the limit is {max_bytes} (rlfactory ui --max-upload-mb)")
    try:
        image_from_bytes(raw, m.group(1))
    except ImageError as e:
        raise ApiError(400, f"image: {e}") from None
    return value


async def playground_start(request: Request):
    st = _state(request)
    # an image comes as base64 (4 bytes per 3) in the body: room for one at the upload cap
    data = await body(request, max_bytes=st.max_upload_bytes * 4 // 3 + (2 << 20))
    question = str(data.get("question") or "").strip()
    if not question:
        raise ApiError(400, "question: type a question")
    image = await run_in_threadpool(question_image, data.get("image"), st.max_upload_bytes)
    model = str(data.get("model") or "tiny:1m")
    if not model.startswith(("tiny:", "tiny-vl:")):
        model = str(within_any([st.runs, st.workspace], model))
    req = {"config": str(_file(st, data["config"])) if data.get("config") else None, "model": model,
           "question": question, "image": image, "answer": str(data.get("answer") or ""),
           "script": data.get("script") or [],
           "max_turns": data.get("max_turns"), "max_new_tokens": data.get("max_new_tokens"),
           "temperature": data.get("temperature"), "seed": int(data.get("seed") or 0)}
    run = await run_in_threadpool(st.playground.start, req)
    return ok({"id": run.id}, 201)


async def playground_events(request: Request):
    run = _state(request).playground.get(arg(request, "id"))

    async def stream():
        sent = 0
        while not await request.is_disconnected():
            events = await run_in_threadpool(run.wait_events, sent, 1.0)
            for e in events:
                yield sse_event(e.get("type", "event"), e)
            sent += len(events)
            if events and events[-1].get("type") == "done":
                return
            await asyncio.sleep(0)

    return sse(stream())


async def playground_stop(request: Request):
    await run_in_threadpool(_state(request).playground.stop_all)
    return ok({"stopped": True})


routes = [
    Route("/api/files", list_files),
    Route("/api/upload", upload, methods=["POST"]),
    Route("/api/tools/load", tools_load, methods=["POST"]),
    Route("/api/tools/call", tools_call, methods=["POST"]),
    Route("/api/tools/close", tools_close, methods=["POST"]),
    Route("/api/rewards/terms", reward_terms),
    Route("/api/rewards/score", reward_score, methods=["POST"]),
    Route("/api/data/preview", data_preview, methods=["POST"]),
    Route("/api/data/convert", data_convert, methods=["POST"]),
    Route("/api/data/template", data_template),
    Route("/api/models", models),
    Route("/api/playground/start", playground_start, methods=["POST"]),
    Route("/api/playground/events", playground_events),
    Route("/api/playground/stop", playground_stop, methods=["POST"]),
]
