"""Running the gateway under uvicorn: `serve` blocks until Ctrl-C (what `rowgrove serve` calls);
`make_server` returns a configured `uvicorn.Server` for callers that run it in a thread
(`rowgrove.gateway.testing`) or in their own event loop.
"""

from __future__ import annotations

import logging

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
    """Serve until interrupted (SIGINT/SIGTERM); in-flight calls get a graceful few seconds."""
    server = make_server(engine, ledger, host=host, port=port, settings=settings,
                         log_level=log_level, access_log=log_level == "debug")
    logging.getLogger("rowgrove").info("gateway on http://%s:%d, ledger %s", host, port, ledger.path)
    server.run()
