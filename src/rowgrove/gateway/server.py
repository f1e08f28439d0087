"""Running the gateway under uvicorn: `serve` blocks until Ctrl-C or SIGTERM (what `rowgrove
serve` calls); `make_server` returns a configured `uvicorn.Server` for callers that run it in a
thread (`rowgrove.gateway.testing`) or in their own event loop.

Shutdown on SIGTERM (`GatewayServer.drain`): the socket stays open while the calls in flight
finish; meanwhile new calls (and new rollouts) get 503 with Retry-After and /health says
"closing". Once no generation is in flight (or after `engine_timeout` + 5 s), uvicorn closes the
socket and gives responses still being written a few seconds. A second SIGTERM, or SIGINT
(Ctrl-C), shuts down at once (in-flight calls get those few seconds only).

Addresses: uvicorn's proxy-header rewriting is off (`proxy_headers=False`), so `request.client`
is the socket peer; the gateway itself believes X-Forwarded-For only from the peers in
`GatewaySettings.trusted_proxies`. Once the socket is bound, `gateway.public_url` (the base of
every base_url) is set from the bound host and port unless `GatewaySettings.public_url` gave one.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time
from types import FrameType

import uvicorn

from rowgrove.engines.base import Engine
from rowgrove.gateway.app import create_app
from rowgrove.gateway.protocol import protocol_class
from rowgrove.gateway.sessions import Gateway, GatewaySettings
from rowgrove.ledger import Ledger

log = logging.getLogger("rowgrove.gateway")

_WILDCARD = ("", "0.0.0.0", "::", "[::]")


class GatewayServer(uvicorn.Server):
    """uvicorn's server with the gateway's shutdown (drain on SIGTERM) and public address."""

    def __init__(self, config: uvicorn.Config, gateway: Gateway):
        super().__init__(config)
        self.gateway = gateway
        self.draining = False
        self._drain_deadline = 0.0

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        gw = self.gateway
        if gw.public_url is None and self.started:
            url = bound_url(self.config.host, self.servers)
            if url is not None:
                gw.public_url = url

    def drain(self) -> None:
        """Stop taking new calls (503 with Retry-After) and exit once the calls in flight are
        done; callable from any thread."""
        if self.draining or self.should_exit:
            return
        self.draining = True
        self.gateway.closing = True
        self._drain_deadline = time.monotonic() + self.gateway.settings.engine_timeout + 5.0
        log.info("SIGTERM: draining %d call(s) in flight; new calls get 503", self.gateway.in_flight)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and not self.draining and not self.should_exit:
            self._captured_signals.append(sig)  # re-raised after shutdown, as uvicorn does
            self.drain()
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if await super().on_tick(counter):
            return True
        if self.draining and (self.gateway.in_flight == 0 or time.monotonic() > self._drain_deadline):
            self.should_exit = True
            return True
        return False


def bound_url(host: str, servers: list[asyncio.base_events.Server]) -> str | None:
    """http://HOST:PORT of the first bound socket; None when bound to a wildcard address (then
    each base_url names the local address the caller's connection reached)."""
    if host in _WILDCARD or not servers or not servers[0].sockets:
        return None
    port = servers[0].sockets[0].getsockname()[1]
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}"


def make_server(engine: Engine, ledger: Ledger, *, host: str = "127.0.0.1", port: int = 8000,
                settings: GatewaySettings | None = None, loop: str = "uvloop",
                log_level: str = "warning", access_log: bool = False) -> GatewayServer:
    """A uvicorn server (uvloop, httptools via `GatewayHttpProtocol`) for the gateway app; not started."""
    app = create_app(engine, ledger, settings=settings)
    config = uvicorn.Config(
        app, host=host, port=port, loop=loop, lifespan="on",
        # unparseable requests get OpenAI's error shape; headers must arrive within body_timeout
        http=protocol_class(app.state.gateway.settings.body_timeout),
        log_level=log_level, access_log=access_log, timeout_keep_alive=30,
        timeout_graceful_shutdown=5, backlog=2048,
        # request.client is the socket peer: X-Forwarded-For is judged by the gateway, and only
        # from GatewaySettings.trusted_proxies (uvicorn would believe it from any loopback peer)
        proxy_headers=False,
    )
    return GatewayServer(config, app.state.gateway)


def hold_freed_memory() -> bool:
    """Have glibc's malloc keep freed large blocks for reuse instead of handing them back to the
    kernel (True when it took the settings; False off glibc, where nothing changes).

    A long rollout's request body, its prompt's JSON and its token lists are a few hundred KB
    each and a little larger every call. glibc serves a block above its mmap threshold with fresh
    pages and unmaps it when freed; the threshold follows the largest block freed so far, so a
    conversation that keeps growing stays above it and every call pays for its pages again: 150
    page faults per call at 51k prompt tokens, a fifth of the gateway's CPU on such a call
    (docs/gateway.md, "Long conversations"). With a fixed threshold of 32 MB (glibc's largest) and
    a trim threshold of 128 MB, those blocks come from the heap and are reused: a gateway holds at
    most 128 MB freed that the kernel could otherwise reclaim."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None)
        if mallopt is None or not hasattr(libc, "gnu_get_libc_version"):
            return False
        m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
        return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 128 << 20))
    except OSError:
        return False


def serve(engine: Engine, ledger: Ledger, *, host: str = "127.0.0.1", port: int = 8000,
          settings: GatewaySettings | None = None, log_level: str = "info") -> None:
    """Serve until interrupted. SIGTERM drains first (see the module docstring) and then returns
    normally (so callers close the engine and ledger); after SIGINT KeyboardInterrupt propagates,
    as usual. The process is the gateway's: with `settings.hold_freed_memory` (the default) its
    allocator keeps freed large blocks (`hold_freed_memory`)."""
    if (settings or GatewaySettings()).hold_freed_memory:
        hold_freed_memory()
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
