"""Running the gateway under uvicorn: `serve` blocks until Ctrl-C (what `rowgrove serve` calls);
`make_server` returns a configured `uvicorn.Server` for callers that run it in a thread
(`rowgrove.gateway.testing`) or in their own event loop.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

import uvicorn

from rowgrove.engines.base import Engine
from rowgrove.gateway.app import create_app
from rowgrove.gateway.sessions import GatewaySettings
from rowgrove.ledger import Ledger


def make_server(engine: Engine, ledger: Ledger, *, host: str = "127.0.0.1", port: int = 8000,
                settings: GatewaySettings | None = None, loop: str = "uvloop",
                log_level: str = "warning", access_log: bool = False) -> uvicorn.Server:
    """A uvicorn server (uvloop; httptools when installed, else h11) for the gateway app; not started."""
    app = create_app(engine, ledger, settings=settings)
    config = uvicorn.Config(
        app, host=host, port=port, loop=loop, http="auto", lifespan="on",
        log_level=log_level, access_log=access_log, timeout_keep_alive=30,
        timeout_graceful_shutdown=5, backlog=2048,
    )
    return uvicorn.Server(config)


def serve(engine: Engine, ledger: Ledger, *, host: str = "127.0.0.1", port: int = 8000,
          settings: GatewaySettings | None = None, log_level: str = "info") -> None:
    """Serve until interrupted; in-flight calls get a graceful few seconds. After SIGTERM it
    returns normally (so callers close the engine and ledger); after SIGINT KeyboardInterrupt
    propagates, as usual."""
    server = make_server(engine, ledger, host=host, port=port, settings=settings,
                         log_level=log_level, access_log=log_level == "debug")
    logging.getLogger("rowgrove").info("gateway on http://%s:%d, ledger %s", host, port, ledger.path)
    if threading.current_thread() is not threading.main_thread():
        server.run()
        return
    # uvicorn re-raises the signal it stopped on once it is done; for SIGTERM that would kill the
    # process before the caller's cleanup, so the re-raised SIGTERM ends serve() instead.
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        server.run()
    except _Terminated:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Terminated(Exception):
    """SIGTERM arrived: the server has shut down gracefully."""


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise _Terminated
