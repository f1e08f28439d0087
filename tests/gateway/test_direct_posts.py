"""The calls' own routes are dispatched by a dict lookup ahead of Starlette's route table
(`rowgrove.gateway.app.direct_posts`). The promise: nothing a client can send tells the two
apart. Each request below goes to one running gateway twice, once with the shortcut and once
through the route table alone, and gets the same status, the same error body, the same kind of
answer; the shortcut takes only what it should (wrong methods, trailing slashes, empty ids and
unknown routes still meet the route table's 404/405/redirect)."""

from __future__ import annotations

import re

import httpx
import pytest

from fixtures_http import TestEngine, scripted_engine
from rowgrove.gateway.testing import start_gateway

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
RESPONSES = {"model": "m", "input": "hi", "max_output_tokens": 3}
MESSAGES = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    with start_gateway("tiny", engine=TestEngine(scripted_engine("tiny")),
                       ledger=tmp_path_factory.mktemp("direct") / "ledger.db") as handle:
        yield handle


def _cases(ro: dict, other: dict) -> list[tuple[str, str, object, str | None]]:
    """(method, path, json body, api key) of requests on and around the direct routes."""
    rid, key = ro["rollout_id"], ro["api_key"]
    base = f"/rollouts/{rid}"
    return [
        ("POST", f"{base}/v1/chat/completions", CHAT, key),
        ("POST", f"{base}/v1/responses", RESPONSES, key),
        ("POST", f"{base}/v1/messages", MESSAGES, key),
        ("POST", f"{base}/v1/chat/completions", {"model": "m"}, key),          # 400
        ("POST", f"{base}/v1/messages", {"model": "m"}, key),                  # 400, Anthropic's shape
        ("POST", f"{base}/v1/chat/completions", CHAT, "rk_wrong"),             # 401
        ("POST", f"{base}/v1/chat/completions", CHAT, other["api_key"]),       # another rollout's key
        ("POST", "/rollouts/ro_nope/v1/chat/completions", CHAT, key),          # 404 rollout
        ("POST", "/rollouts/ro_nope/v1/messages", MESSAGES, key),
        ("POST", "/rollouts//v1/chat/completions", CHAT, key),                 # empty id: the table's 404
        ("POST", f"{base}/v1/chat/completions/", CHAT, key),                   # trailing slash
        ("POST", f"{base}/v1/chat/completion", CHAT, key),                     # unknown route
        ("POST", f"{base}/v1/models", CHAT, key),                              # GET-only route: 405
        ("GET", f"{base}/v1/chat/completions", None, key),                     # 405
        ("POST", f"/rollouts/{rid}/x/v1/chat/completions", CHAT, key),       # id with a slash
        ("POST", "/v1/chat/completions", CHAT, key),                           # no rollout
    ]


def _answer(http: httpx.Client, method: str, path: str, body: object, key: str | None) -> tuple:
    r = http.request(method, path, json=body, headers={"authorization": f"Bearer {key}"})
    try:
        data = r.json()
    except ValueError:
        data = r.text
    if r.status_code == 200:  # ids and times differ between two answers: compare their kind
        data = sorted(data) if isinstance(data, dict) else data
    return r.status_code, r.headers.get("location"), r.headers.get("allow"), data


def _direct(app):
    """The app's middleware stack as Starlette built it on its first request: the direct dispatch."""
    if app.middleware_stack is None:
        app.middleware_stack = app.build_middleware_stack()
    direct = app.middleware_stack
    assert hasattr(direct, "routed"), "create_app no longer installs the direct dispatch"
    return direct


def test_the_shortcut_answers_every_request_as_the_route_table_does(gw):
    app = gw.server.config.app
    direct = _direct(app)
    got: dict[str, list] = {}
    with httpx.Client(base_url=gw.url, timeout=60, follow_redirects=False) as http:
        for label, stack in (("direct", direct), ("table", direct.routed)):
            app.middleware_stack = stack
            try:
                ro, other = gw.create_rollout("g"), gw.create_rollout("g")
                got[label] = [_answer(http, *case) for case in _cases(ro, other)]
            finally:
                app.middleware_stack = direct
    statuses = [a[0] for a in got["direct"]]
    assert statuses[:3] == [200, 200, 200] and 404 in statuses and 405 in statuses
    for case, d, t in zip(_cases({"rollout_id": "ID", "api_key": "K"}, {"api_key": "O"}), got["direct"], got["table"]):
        d, t = _strip_ids(d), _strip_ids(t)
        assert d == t, case[:2]


def _strip_ids(x: object) -> object:
    """`x` with rollout ids masked (each pass made its own rollouts)."""
    if isinstance(x, tuple | list):
        return type(x)(_strip_ids(v) for v in x)
    if isinstance(x, dict):
        return {k: _strip_ids(v) for k, v in x.items()}
    return re.sub(r"ro_[0-9a-f]+", "ro_ID", x) if isinstance(x, str) else x


def test_the_shortcut_serves_the_three_call_routes_without_the_route_table(gw):
    """With the route table emptied, a rollout's chat, responses and messages POSTs still answer
    (the shortcut took them), while any other route finds nothing."""
    app = gw.server.config.app
    _direct(app)
    ro = gw.create_rollout("g")
    routes = list(app.router.routes)
    app.router.routes.clear()
    try:
        with httpx.Client(base_url=gw.url, timeout=60) as http:
            got = [_answer(http, *case)[0] for case in _cases(ro, ro)[:3]]
            other = http.get(f"/rollouts/{ro['rollout_id']}/v1/models").status_code
    finally:
        app.router.routes.extend(routes)
    assert got == [200, 200, 200] and other == 404


def test_middleware_added_to_the_app_sees_the_call_routes_too(tmp_path):
    """A middleware a user adds to the app before it serves (CORS, auth, logging) must see the
    calls' routes as well: the shortcut is not installed past it."""
    from starlette.middleware.base import BaseHTTPMiddleware

    from rowgrove.gateway.app import create_app
    from rowgrove.ledger import Ledger

    seen: list[str] = []

    async def record(request, call_next):
        seen.append(request.url.path)
        return await call_next(request)

    with Ledger(tmp_path / "l.db") as ledger:
        app = create_app(TestEngine(scripted_engine("tiny")), ledger)
        app.add_middleware(BaseHTTPMiddleware, dispatch=record)
        transport = httpx.ASGITransport(app=app)

        async def go():
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
                ro = (await http.post("/v1/rollouts", json={"group_id": "g"})).json()
                r = await http.post(f"/rollouts/{ro['rollout_id']}/v1/chat/completions", json=CHAT,
                                    headers={"authorization": f"Bearer {ro['api_key']}"})
                return ro, r

        import asyncio

        ro, r = asyncio.run(go())
    assert r.status_code == 200, r.text
    assert seen == ["/v1/rollouts", f"/rollouts/{ro['rollout_id']}/v1/chat/completions"]
    assert not hasattr(app.middleware_stack, "routed")
