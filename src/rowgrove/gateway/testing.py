"""A real gateway for tests and scripts: uvicorn in a background thread on a free loopback port.

    with start_gateway("tiny", engine="scripted", ledger=tmp_path / "ledger.db") as gw:
        ro = gw.create_rollout("prompt-0")
        client = OpenAI(base_url=ro["base_url"], api_key=ro["api_key"])
        ...
        gw.finish(ro["rollout_id"], messages=[...], reward=1.0)

Everything goes over real HTTP on 127.0.0.1, so what a test sees is what a harness would see.
`engine` may be an `Engine` instance (e.g. an HF engine shared with a trainer); the handle then
does not close it. The engine is used from the server thread's event loop.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from rowgrove.engines.base import Engine
from rowgrove.errors import RowgroveError
from rowgrove.gateway.server import make_server
from rowgrove.gateway.sessions import Gateway, GatewaySettings
from rowgrove.ledger import Ledger


class GatewayError(RowgroveError):
    """A control route answered with an error status; `.status` and `.body` say which."""

    def __init__(self, status: int, body: Any):
        super().__init__(f"gateway answered {status}: {body}")
        self.status = status
        self.body = body


class GatewayHandle:
    """A running gateway: its URL, its ledger, its `server`, and helpers for the control routes."""

    def __init__(self, *, url: str, ledger: Ledger, gateway: Gateway, engine: Engine,
                 server: Any, thread: threading.Thread, own_engine: bool, admin_key: str | None):
        self.url = url
        self.ledger = ledger
        self.ledger_path = Path(ledger.path)
        self.gateway = gateway
        self.engine = engine
        self._server = server
        self.server = server  # the GatewayServer (uvicorn.Server): `.drain()` is what SIGTERM does
        self._thread = thread
        self._own_engine = own_engine
        headers = {"authorization": f"Bearer {admin_key}"} if admin_key else {}
        self._http = httpx.Client(base_url=url, headers=headers, timeout=60.0)
        self._closed = False

    def _check(self, r: httpx.Response) -> dict[str, Any]:
        body = r.json()
        if r.status_code >= 400:
            raise GatewayError(r.status_code, body)
        return body

    def get(self, path: str) -> dict[str, Any]:
        """GET a route (e.g. `/v1/rollouts/ro_x`) and return its JSON; GatewayError on 4xx/5xx."""
        return self._check(self._http.get(path))

    def create_rollout(self, group_id: str, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        """POST /v1/rollouts → {rollout_id, group_id, base_url, api_key}."""
        return self._check(self._http.post("/v1/rollouts", json={"group_id": group_id, "metadata": metadata or {}}))

    def finish(self, rollout_id: str, *, messages: list[dict] | None = None,
               conversations: list[list[dict]] | None = None, reward: float,
               valid: bool | None = None, accepted_call_ids: list[str] | None = None,
               format: str | None = None) -> dict[str, Any]:
        """POST /v1/rollouts/{id}/finish with the accepted conversation(s) and the reward (and the
        ids of calls the harness kept whose turns it rewrote, `accepted_call_ids`); `format` is
        the dialect the conversations are in ("chat", "responses", "anthropic"; default chat)."""
        body: dict[str, Any] = {"reward": reward}
        if format is not None:
            body["format"] = format
        if accepted_call_ids is not None:
            body["accepted_call_ids"] = accepted_call_ids
        if messages is not None:
            body["messages"] = messages
        if conversations is not None:
            body["conversations"] = conversations
        if valid is not None:
            body["valid"] = valid
        return self._check(self._http.post(f"/v1/rollouts/{rollout_id}/finish", json=body))

    def lineage(self, rollout_id: str) -> dict[str, Any]:
        """GET /v1/rollouts/{id}: the rollout's calls with parents."""
        return self.get(f"/v1/rollouts/{rollout_id}")

    def rows(self, rollout_id: str) -> dict[str, Any]:
        """GET /v1/rollouts/{id}/rows: the finished rollout's training rows."""
        return self.get(f"/v1/rollouts/{rollout_id}/rows")

    def close(self) -> None:
        """Stop the server (in-flight calls get a few seconds), then close the ledger and, if the
        handle made it, the engine."""
        if self._closed:
            return
        self._closed = True
        self._http.close()
        self._server.should_exit = True
        self._thread.join(timeout=30)
        if self._own_engine:
            asyncio.run(self.engine.aclose())
        self.ledger.close()

    def __enter__(self) -> GatewayHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def launch_gateway(model: str = "tiny", engine: str | Engine = "scripted", ledger: str | Path | None = None,
                   *, loop: str = "uvloop", **settings: Any) -> GatewayHandle:
    """Start a gateway and return its handle once /health answers; call `.close()` when done.

    `settings` are `GatewaySettings` fields (admin_key, max_body_bytes, max_queue, engine_timeout,
    retry_after, default_max_tokens, max_json_depth, body_timeout, max_open_uploads, public_url,
    trusted_proxies, model_name). With `ledger=None` a fresh file in a temporary directory; a
    `durability` setting ("normal" | "full") is the ledger's. base_urls name the bound port
    unless `public_url` is given.
    """
    own = isinstance(engine, str)
    durability = settings.pop("durability", "normal")
    if own:
        settings.setdefault("model_name", model)
    cfg = GatewaySettings(**settings)
    if own:
        from rowgrove.engines import make_engine

        engine_obj: Engine = make_engine(engine, model)
    else:
        engine_obj = engine
    if ledger is None:
        ledger = Path(tempfile.mkdtemp(prefix="rowgrove-gw-")) / "ledger.db"
    led = Ledger(ledger, durability=durability)
    server = make_server(engine_obj, led, host="127.0.0.1", port=0, settings=cfg, loop=loop)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            server.run()
        except BaseException as e:  # surfaced by the waiting thread below
            failure.append(e)

    thread = threading.Thread(target=run, name="rowgrove-gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if failure or not thread.is_alive() or time.monotonic() > deadline:
            led.close()
            raise RowgroveError(f"gateway did not start: {failure[0] if failure else 'timed out'}")
        time.sleep(0.005)
    port = server.servers[0].sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    gateway: Gateway = server.config.app.state.gateway
    handle = GatewayHandle(url=url, ledger=led, gateway=gateway, engine=engine_obj, server=server,
                           thread=thread, own_engine=own, admin_key=cfg.admin_key)
    handle._check(handle._http.get("/health"))
    return handle


@contextmanager
def start_gateway(model: str = "tiny", engine: str | Engine = "scripted", ledger: str | Path | None = None,
                  **settings: Any) -> Iterator[GatewayHandle]:
    """Context manager around `launch_gateway`: yields the running gateway, stops it on exit."""
    handle = launch_gateway(model, engine, ledger, **settings)
    try:
        yield handle
    finally:
        handle.close()
