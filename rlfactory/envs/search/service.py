"""Start and stop the retriever as a real server process.

`RetrieverProcess(corpus)` picks a free port, starts `python -m rlfactory.envs.search.retriever`
and waits until `/health` answers (rlfactory.server_process: stopped on `stop()`, on leaving a
`with` block, when garbage-collected and at interpreter exit; it exits by itself when its parent
process dies, so a crash leaves no orphan).
"""

from __future__ import annotations

import sys
from pathlib import Path

from rlfactory.server_process import ServerProcess, free_port

__all__ = ["RetrieverProcess", "free_port"]


class RetrieverProcess(ServerProcess):
    """A BM25 retriever server process over `corpus` (JSON lines). Use as a context manager or
    call `start()` / `stop()`; `url` is `http://host:port` once started."""

    log_prefix = "rlfactory-retriever-"
    stop_grace_s = 5.0

    def __init__(self, corpus: str | Path | None = None, port: int | None = None, host: str = "127.0.0.1",
                 topk: int = 3, startup_timeout_s: float = 60.0, index: str | Path | None = None) -> None:
        if (corpus is None) == (index is None):
            raise ValueError("RetrieverProcess: give a corpus or an index folder (rlfactory index), not both")
        self.corpus, self.index = (str(corpus) if corpus else None), (str(index) if index else None)
        if self.corpus and not Path(self.corpus).is_file():
            raise FileNotFoundError(f"retriever corpus not found: {self.corpus}")
        if self.index and not Path(self.index).is_dir():
            raise FileNotFoundError(f"retriever index folder not found: {self.index}")
        super().__init__(host, port, startup_timeout_s)
        self.topk = topk
        self.name = f"retriever (corpus {self.corpus})" if self.corpus else f"retriever (index {self.index})"

    def command(self, port: int) -> list[str]:
        source = ["--corpus", self.corpus] if self.corpus else ["--index", self.index]
        return [sys.executable, "-m", "rlfactory.envs.search.retriever", *source,
                "--host", self.host, "--port", str(port), "--topk", str(self.topk)]
