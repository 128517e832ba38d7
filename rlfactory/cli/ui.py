"""`rlfactory ui [--runs DIR] [--host 127.0.0.1] [--port 7860]`: the studio web UI."""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "ui",
        help="serve the studio: runs, live metrics, trajectories, launching runs, tools, rewards, data",
        description="Serve rlfactory's web UI on http://HOST:PORT. Every page and API call needs the token "
        "printed at start-up (open the printed URL once; the browser keeps it in a cookie). Runs launched "
        "from the UI keep running when it stops; stop them from the page.",
    )
    p.add_argument("--runs", default="runs", help="the runs folder to show and launch into (default: runs)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=7860, help="port (default 7860; 0 picks a free one)")
    p.add_argument("--token", default=os.environ.get("RLFACTORY_STUDIO_TOKEN"),
                   help="the access token (default: $RLFACTORY_STUDIO_TOKEN, else a random one)")
    p.add_argument("--max-upload-mb", type=float, default=50.0, help="largest upload accepted (default 50 MB)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from rlfactory.studio.app import StudioSettings, create_app

    token = args.token or secrets.token_urlsafe(24)
    if len(token) < 16:
        print("rlfactory ui: --token must be at least 16 characters", file=sys.stderr)
        return 2
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as e:
        print(f"rlfactory ui: cannot listen on {args.host}:{args.port}: {e.strerror}", file=sys.stderr)
        return 2
    sock.listen(128)
    port = sock.getsockname()[1]
    settings = StudioSettings(runs=Path(args.runs), token=token, max_upload_bytes=int(args.max_upload_mb * (1 << 20)),
                              cookie_name=f"rlfactory_studio_{port}")
    app = create_app(settings)
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"rlfactory studio: runs in {settings.runs.resolve()}", flush=True)
    print(f"open http://{host}:{port}/?token={token}", flush=True)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: listening on {args.host}: anyone who can reach it and has the token controls runs", file=sys.stderr)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])
    return 0
