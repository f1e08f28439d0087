"""Starting a stand-in server in this process: `start_standin` / `launch_standin` choose the
server module by kind (`rowgrove.standins.vllm` or `.sglang`), give it an engine that samples, and
run it on a free loopback port (`common.run_app`). It sits above both server modules, which import
only `common`, so no module of this package imports one that imports it back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from rowgrove.errors import RowgroveError
from rowgrove.standins.common import StandinState, run_app


class StandinHandle:
    """A running stand-in: its URL, state and engine; `fault(...)` arms a fault."""

    def __init__(self, url: str, state: StandinState, engine: Any, server: Any, thread: threading.Thread):
        self.url = url
        self.state = state
        self.engine = engine
        self._server = server
        self._thread = thread

    def fault(self, mode: str | None, count: int = 1, delay: float | None = None) -> None:
        self.state.set_fault(mode, count, delay)

    def log(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/_standin/log", timeout=10).json()

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)


@contextmanager
def start_standin(kind: str, model: str = "tiny", **options: Any) -> Iterator[StandinHandle]:
    """A stand-in server of `kind` ("vllm" | "sglang") over `model` on a free loopback port.
    `options` go to the server's `create_app` (e.g. sglang's `incremental=True`)."""
    handle = launch_standin(kind, model, **options)
    try:
        yield handle
    finally:
        handle.close()


def launch_standin(kind: str, model: str = "tiny", *, engine: Any = None, **options: Any) -> StandinHandle:
    """Start a stand-in (see `start_standin`) and return its handle; `.close()` it when done.
    `engine`: the engine that samples (default: an hf engine on `model`)."""
    if kind == "vllm":
        from rowgrove.standins.vllm import create_app
    elif kind == "sglang":
        from rowgrove.standins.sglang import create_app  # type: ignore[assignment]
    else:
        raise RowgroveError(f"no stand-in for {kind!r}: use vllm or sglang")
    if engine is None:
        from rowgrove.engines import make_engine

        engine = make_engine("hf", model, max_batch=16)
    state = StandinState()
    app = create_app(engine, model, state, **options)
    server, thread, url = run_app(app)
    return StandinHandle(url, state, engine, server, thread)
