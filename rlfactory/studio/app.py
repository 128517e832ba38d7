"""The studio's Starlette app: API routes, static files, token auth, error answers."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from rlfactory.config import ConfigError
from rlfactory.studio import routes_launch, routes_manage, routes_runs, routes_tools
from rlfactory.studio.auth import TokenAuth
from rlfactory.studio.changes import PromptIndex
from rlfactory.studio.jobs import JobManager
from rlfactory.studio.paths import BadPath
from rlfactory.studio.playground import Playground
from rlfactory.studio.steps import StepCache
from rlfactory.studio.toolbox import ToolSessions
from rlfactory.studio.web import ApiError

STATIC = Path(__file__).parent / "static"


@dataclass
class StudioSettings:
    runs: Path
    """The runs folder (created if missing); every run path resolves inside it."""
    token: str
    """Required on every request (see auth.py)."""
    workspace: Path = field(default_factory=Path.cwd)
    """The work folder: example configs (examples/) and files the pages may read."""
    max_upload_bytes: int = 50 << 20
    cookie_name: str = "rlfactory_studio"


@dataclass
class StudioState:
    runs: Path
    workspace: Path
    max_upload_bytes: int
    jobs: JobManager
    steps: StepCache
    tools: ToolSessions
    playground: Playground
    prompts: PromptIndex = field(default_factory=PromptIndex)


def _error(status: int, message: str, issues: list[dict[str, Any]] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "issues": issues or []}, status_code=status)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, ApiError):
        return _error(exc.status, exc.message, exc.issues)
    if isinstance(exc, (BadPath, ConfigError)):
        return _error(400, str(exc))
    if isinstance(exc, (KeyError, FileNotFoundError, IndexError)):
        return _error(404, str(exc.args[0]) if exc.args else str(exc))
    return _error(500, f"{type(exc).__name__}: {exc}")


async def index(request: Request) -> FileResponse:
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})


async def whoami(request: Request) -> JSONResponse:
    st = request.app.state.studio
    return JSONResponse({"runs": str(st.runs), "workspace": str(st.workspace), "max_upload_bytes": st.max_upload_bytes})


def create_app(settings: StudioSettings) -> Starlette:
    """The studio for `settings` (every route behind the token)."""
    runs = settings.runs.expanduser().resolve()
    runs.mkdir(parents=True, exist_ok=True)
    workspace = settings.workspace.resolve()
    state = StudioState(runs, workspace, settings.max_upload_bytes, JobManager(runs, workspace), StepCache(),
                        ToolSessions(), Playground(workspace))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        yield
        await state.tools.close_all()
        state.playground.stop_all()

    routes = [
        Route("/", index),
        Route("/api/whoami", whoami),
        *routes_runs.routes,
        *routes_manage.routes,
        *routes_launch.routes,
        *routes_tools.routes,
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    handlers = {exc: _api_error for exc in (ApiError, BadPath, ConfigError, KeyError, FileNotFoundError, IndexError, Exception)}
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers,  # type: ignore[arg-type]
                    middleware=[Middleware(TokenAuth, token=settings.token, cookie_name=settings.cookie_name)])
    app.state.studio = state
    return app
