"""The gateway against a hostile or careless client over real HTTP: JSON nested too deep, broken
content parts, template kwargs that name the tokenizer's own variables, garbage at the HTTP
level, uploads that never finish, a client gone mid-body, and what a 5xx leaves in the log.
Every refusal is a 4xx in OpenAI's shape and leaves the ledger unchanged."""

from __future__ import annotations

import json
import logging
import socket
import sqlite3
import threading
import time

import httpx
import openai
import pytest
from openai import OpenAI

from fixtures_http import TestEngine, dump_ledger, scripted_engine
from rowgrove.errors import EngineError
from rowgrove.gateway.testing import start_gateway

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    engine = TestEngine(scripted_engine("tiny"))
    with start_gateway("tiny", engine=engine, ledger=tmp_path_factory.mktemp("hostile") / "ledger.db") as handle:
        handle.test_engine = engine
        yield handle


@pytest.fixture
def ro(gw):
    return gw.create_rollout("g-hostile")


def _auth(ro) -> dict[str, str]:
    return {"authorization": f"Bearer {ro['api_key']}", "content-type": "application/json"}


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return body["error"]


def _nested(depth: int, leaf: bytes = b"1") -> bytes:
    return b"[" * depth + leaf + b"]" * depth


def _deep_value(depth: int) -> bytes:
    """A JSON array nesting `depth` arrays in all."""
    return _nested(depth)


# -- JSON depth ------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [65, 254, 255, 600, 1024, 1100])
def test_json_nested_too_deep_is_400_on_every_route(gw, ro, depth):
    before = dump_ledger(gw.ledger_path)
    deep = _deep_value(depth - 1)  # inside the body object: depth levels in all
    bodies = {
        ro["base_url"] + "/chat/completions": b'{"messages": [{"role": "user", "content": "x"}], "metadata": ' + deep + b"}",
        gw.url + "/v1/rollouts": b'{"group_id": "g", "metadata": {"x": ' + _deep_value(depth - 2) + b"}}",
        f"{gw.url}/v1/rollouts/{ro['rollout_id']}/finish": b'{"messages": ' + deep + b', "reward": 1}',
        gw.url + "/v1/weights": b'{"version": ' + deep + b"}",
    }
    for url, raw in bodies.items():
        err = _error(httpx.post(url, content=raw, headers=_auth(ro)), 400)
        assert err["code"] == "json_too_deep", (url, err)
        assert "64 levels" in err["message"]
    assert dump_ledger(gw.ledger_path) == before


def test_json_at_the_depth_limit_is_read(gw, ro):
    # 64 levels in all: the body object, "metadata" and 62 arrays (ignored by the chat route)
    raw = b'{"messages": [{"role": "user", "content": "x"}], "metadata": ' + _deep_value(63) + b"}"
    r = httpx.post(ro["base_url"] + "/chat/completions", content=raw, headers=_auth(ro))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("field", ["temperature", "messages", "stop", "tools", "stream_options",
                                   "chat_template_kwargs", "script"])
def test_a_deep_wrongly_typed_field_is_a_short_400(gw, ro, field):
    # below the limit, but deep enough to make a naive repr in the message long
    raw = b'{"messages": [{"role": "user", "content": "x"}], "' + field.encode() + b'": ' + _deep_value(60) + b"}"
    before = dump_ledger(gw.ledger_path)
    err = _error(httpx.post(ro["base_url"] + "/chat/completions", content=raw, headers=_auth(ro)), 400)
    assert len(err["message"]) < 600
    assert dump_ledger(gw.ledger_path) == before


def test_the_depth_limit_is_configurable(tmp_path):
    with start_gateway("tiny", engine=TestEngine(scripted_engine("tiny")), ledger=tmp_path / "l.db",
                       max_json_depth=5) as gw:
        ro = gw.create_rollout("g")
        # body, messages, message, content, part: 5 levels
        ok = {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}
        assert httpx.post(ro["base_url"] + "/chat/completions", json=ok, headers=_auth(ro)).status_code == 200
        deeper = {"messages": [{"role": "user", "content": "x"}], "metadata": {"a": {"b": [[1]]}}}  # 5
        assert httpx.post(ro["base_url"] + "/chat/completions", json=deeper, headers=_auth(ro)).status_code == 200
        deeper["metadata"]["a"]["b"] = [[[1]]]  # 6
        before = dump_ledger(gw.ledger_path)
        err = _error(httpx.post(ro["base_url"] + "/chat/completions", json=deeper, headers=_auth(ro)), 400)
        assert "5 levels" in err["message"] and "--max-json-depth" in err["message"]
        assert dump_ledger(gw.ledger_path) == before


# -- content parts and template kwargs ---------------------------------------------------------


BAD_PARTS = [
    pytest.param({"type": "image_url", "image_url": {"url": "data:image/png;base64,abcde"}}, "base64", id="bad-base64"),
    pytest.param({"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk"}}, "base64", id="missing-padding"),
    pytest.param({"type": "image_url", "image_url": {"url": 5}}, "image_url", id="url-not-a-string"),
    pytest.param({"type": "image_url", "image_url": {}}, "image_url", id="no-url"),
    pytest.param({"type": "image_url"}, "image_url", id="no-image"),
    pytest.param({"type": "input_image", "image_url": ["x"]}, "input_image", id="input-image-list"),
    pytest.param({"type": "input_audio", "input_audio": {"data": "a"}}, "base64", id="audio-bad-base64"),
    pytest.param({"type": "input_audio", "input_audio": 3}, "input_audio", id="audio-not-an-object"),
    pytest.param({"type": "input_audio", "input_audio": {"data": 7}}, "input_audio", id="audio-data-number"),
    pytest.param({"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}}, "text parts only",
                 id="valid-image-unsupported-by-template"),
    pytest.param({"type": "video", "video": {"url": "x"}}, "text parts only", id="unknown-part"),
    pytest.param({"type": 5}, "type", id="type-not-a-string"),
    pytest.param({"type": "text", "text": ["x"]}, "text", id="text-not-a-string"),
]


@pytest.mark.parametrize(("part", "words"), BAD_PARTS)
def test_a_bad_content_part_is_400(gw, ro, part, words):
    before = dump_ledger(gw.ledger_path)
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "look"}, part]}]}
    err = _error(httpx.post(ro["base_url"] + "/chat/completions", json=body, headers=_auth(ro)), 400)
    assert err["param"] == "messages" and words in err["message"], err
    assert dump_ledger(gw.ledger_path) == before


def test_a_bad_content_part_in_a_finish_is_400(gw, ro):
    before = dump_ledger(gw.ledger_path)
    bad = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:;base64,abcde"}}]}]
    _error(httpx.post(f"{gw.url}/v1/rollouts/{ro['rollout_id']}/finish", json={"messages": bad, "reward": 1}), 400)
    assert dump_ledger(gw.ledger_path) == before


@pytest.mark.parametrize("key", ["eos_token", "pad_token", "bos_token", "unk_token", "raise_exception",
                                 "additional_special_tokens", "messages", "tools", "add_generation_prompt"])
def test_chat_template_kwargs_naming_template_internals_are_400(gw, ro, key):
    before = dump_ledger(gw.ledger_path)
    body = {"messages": USER, "chat_template_kwargs": {key: "<|im_end|>"}}
    err = _error(httpx.post(ro["base_url"] + "/chat/completions", json=body, headers=_auth(ro)), 400)
    assert err["param"] == "chat_template_kwargs" and key in err["message"]
    # also on a continuation, where the template renders the whole request again
    first = httpx.post(ro["base_url"] + "/chat/completions", json={"messages": USER}, headers=_auth(ro)).json()
    cont = {"messages": USER + [first["choices"][0]["message"], {"role": "user", "content": "more"}],
            "chat_template_kwargs": {key: 1}}
    before = dump_ledger(gw.ledger_path)
    err = _error(httpx.post(ro["base_url"] + "/chat/completions", json=cont, headers=_auth(ro)), 400)
    assert err["param"] == "chat_template_kwargs"
    assert dump_ledger(gw.ledger_path) == before


# -- HTTP-level garbage --------------------------------------------------------------------------


def _port(gw) -> int:
    return int(gw.url.rsplit(":", 1)[1])


def _read_response(sock: socket.socket, timeout: float = 10) -> bytes:
    sock.settimeout(timeout)
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            break
        out += chunk
    return out


def _raw(gw, data: bytes, *, wait: float = 0.5) -> bytes:
    """What the server answers to `data` on a fresh connection, read until it closes (or `wait`)."""
    with socket.create_connection(("127.0.0.1", _port(gw)), timeout=5) as sock:
        sock.sendall(data)
        return _read_response(sock, timeout=wait)


GARBAGE = [
    pytest.param(b"GARBAGE\r\n\r\n", id="bad-request-line"),
    pytest.param(b"POST /v1/rollouts HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}", id="bad-content-length"),
    pytest.param(b"POST /v1/rollouts HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\n{}",
                 id="two-content-lengths"),
    pytest.param(b"POST /v1/rollouts HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
                 id="bad-chunk-size"),
    pytest.param(b"POST /v1/rollouts HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", id="bad-header-line"),
]


def _split(answer: bytes) -> tuple[bytes, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return lines[0].encode(), {k.lower(): v for k, v in headers.items()}, body


@pytest.mark.parametrize("data", GARBAGE)
def test_http_garbage_is_a_400_in_openai_shape_and_nothing_else(gw, ro, data, caplog):
    """A request the HTTP parser refuses never reaches a route: the gateway's connection protocol
    answers 400 in OpenAI's shape (code malformed_http, the parser's reason in the message) and
    closes the connection. No 5xx, nothing in the ledger, and the server goes on serving."""
    before = dump_ledger(gw.ledger_path)
    with caplog.at_level(logging.ERROR, logger="rowgrove.gateway"):
        answer = _raw(gw, data)
        time.sleep(0.1)
    status, headers, body = _split(answer)
    assert status.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)
    err = json.loads(body)["error"]
    assert err["code"] == "malformed_http" and err["type"] == "invalid_request_error"
    assert err["message"].startswith("malformed HTTP request (") and "valid HTTP/1.1" in err["message"]
    assert not [r for r in caplog.records if r.name == "rowgrove.gateway"]
    assert dump_ledger(gw.ledger_path) == before
    assert httpx.get(gw.url + "/health").status_code == 200


def _header_timeout_gateway(tmp_path, seconds: float):
    return start_gateway("tiny", engine=TestEngine(scripted_engine("tiny")), ledger=tmp_path / "l.db",
                         body_timeout=seconds)


@pytest.mark.parametrize("sent", [b"", b"POST /v1/rollouts HTTP/1.1\r\nHost: x\r\nContent-Le"],
                         ids=["nothing", "half-a-header"])
def test_a_connection_that_does_not_finish_its_headers_is_408_and_closed(tmp_path, sent):
    with _header_timeout_gateway(tmp_path, 0.5) as gw:
        sock = socket.create_connection(("127.0.0.1", _port(gw)), timeout=10)
        try:
            sock.sendall(sent)
            t0 = time.monotonic()
            answer = _read_response(sock, timeout=10)
            waited = time.monotonic() - t0
        finally:
            sock.close()
        status, headers, body = _split(answer)
        assert status.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert json.loads(body)["error"]["code"] == "request_timeout"
        assert 0.3 < waited < 8, waited
        assert httpx.get(gw.url + "/health").status_code == 200


def test_slowloris_headers_are_cut_at_the_deadline_not_reset_by_each_byte(tmp_path):
    with _header_timeout_gateway(tmp_path, 0.6) as gw:
        sock = socket.create_connection(("127.0.0.1", _port(gw)), timeout=10)
        try:
            t0 = time.monotonic()
            answer = b""
            for byte in b"GET /health HTTP/1.1\r\nHost: xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx":
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    break
                time.sleep(0.05)
                if time.monotonic() - t0 > 5:
                    break
            answer = _read_response(sock, timeout=5)
            waited = time.monotonic() - t0
        finally:
            sock.close()
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert waited < 5


def test_a_kept_alive_connection_gets_a_fresh_header_deadline_per_request(tmp_path):
    with _header_timeout_gateway(tmp_path, 0.5) as gw:
        sock = socket.create_connection(("127.0.0.1", _port(gw)), timeout=10)
        try:
            for _ in range(3):  # each request well within its own deadline, 1.2 s in all
                time.sleep(0.4)
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                sock.settimeout(5)
                assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        finally:
            sock.close()


def test_broken_chunking_mid_chat_body_is_no_5xx(gw, ro, caplog):
    """The chat route is already reading the body when the chunking breaks: uvicorn answers 400
    and drops the connection; the app sees the client gone (no answer, no 5xx, no call)."""
    before = dump_ledger(gw.ledger_path)
    path = ro["base_url"].split(str(_port(gw)), 1)[1] + "/chat/completions"
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ro['api_key']}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()
    with caplog.at_level(logging.ERROR, logger="rowgrove.gateway"):
        answer = _raw(gw, head + b"5\r\n{\"mes\r\nNOT-HEX\r\n")
        time.sleep(0.2)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert not [r for r in caplog.records if r.name == "rowgrove.gateway"]
    assert dump_ledger(gw.ledger_path) == before


# -- uploads that never finish -------------------------------------------------------------------


def _start_upload(port: int, path: str, key: str | None, declared: int, sent: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n"
                 f"Content-Length: {declared}\r\n\r\n".encode() + sent)
    return sock


def test_a_body_that_does_not_arrive_in_time_is_408(tmp_path):
    with start_gateway("tiny", engine=TestEngine(scripted_engine("tiny")), ledger=tmp_path / "l.db",
                       body_timeout=0.5) as gw:
        ro = gw.create_rollout("g")
        before = dump_ledger(gw.ledger_path)
        path = f"/rollouts/{ro['rollout_id']}/v1/chat/completions"
        t0 = time.monotonic()
        sock = _start_upload(_port(gw), path, ro["api_key"], 1000, b'{"messages": [')
        answer = _read_response(sock)  # the server closes the connection after its answer
        sock.close()
        took = time.monotonic() - t0
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), answer[:300]
        assert b"connection: close" in head.lower()
        err = httpx.Response(408, content=body).json()["error"]
        assert err["code"] == "request_timeout" and "--body-timeout" in err["message"]
        assert 0.4 < took < 5
        assert dump_ledger(gw.ledger_path) == before
        assert gw.gateway.open_uploads == 0


def test_open_uploads_are_capped_with_503(tmp_path):
    with start_gateway("tiny", engine=TestEngine(scripted_engine("tiny")), ledger=tmp_path / "l.db",
                       max_open_uploads=2, body_timeout=30) as gw:
        before = dump_ledger(gw.ledger_path)
        held = [_start_upload(_port(gw), "/v1/rollouts", None, 100, b'{"group_id"') for _ in range(2)]
        end = time.monotonic() + 5
        while gw.gateway.open_uploads < 2 and time.monotonic() < end:
            time.sleep(0.01)
        assert gw.gateway.open_uploads == 2
        r = httpx.post(gw.url + "/v1/rollouts", json={"group_id": "g"})
        err = _error(r, 503)
        assert err["code"] == "too_many_uploads" and int(r.headers["retry-after"]) >= 1
        assert dump_ledger(gw.ledger_path) == before
        # finishing one upload frees a place
        rest = b': "g-late"}'
        held[0].sendall(rest + b" " * (100 - len(b'{"group_id"') - len(rest)))
        assert _read_response(held[0], timeout=5).startswith(b"HTTP/1.1 201 ")
        for s in held:
            s.close()
        end = time.monotonic() + 5
        while gw.gateway.open_uploads and time.monotonic() < end:
            time.sleep(0.01)
        assert gw.gateway.open_uploads == 0
        assert httpx.post(gw.url + "/v1/rollouts", json={"group_id": "g"}).status_code == 201


def test_a_client_gone_mid_body_changes_nothing_and_logs_no_5xx(gw, ro, caplog):
    before = dump_ledger(gw.ledger_path)
    path = f"/rollouts/{ro['rollout_id']}/v1/chat/completions"
    with caplog.at_level(logging.ERROR, logger="rowgrove.gateway"):
        sock = _start_upload(_port(gw), path, ro["api_key"], 500, b'{"messages": [{"role": "user", ')
        time.sleep(0.2)
        sock.close()
        end = time.monotonic() + 5
        while gw.gateway.open_uploads and time.monotonic() < end:
            time.sleep(0.01)
    assert gw.gateway.open_uploads == 0
    assert not [r for r in caplog.records if r.name == "rowgrove.gateway"]
    assert dump_ledger(gw.ledger_path) == before


# -- every 5xx is logged with its cause ------------------------------------------------------------


def test_a_502_is_logged_with_the_route_and_cause(gw, ro, caplog):
    gw.test_engine.fail = EngineError("the GPU caught fire")
    try:
        with caplog.at_level(logging.ERROR, logger="rowgrove.gateway"):
            r = httpx.post(ro["base_url"] + "/chat/completions", json={"messages": USER}, headers=_auth(ro))
            time.sleep(0.05)
    finally:
        gw.test_engine.reset()
    _error(r, 502)
    (rec,) = [r for r in caplog.records if r.name == "rowgrove.gateway" and r.levelno >= logging.ERROR]
    text = rec.getMessage()
    assert "502" in text and f"/rollouts/{ro['rollout_id']}/v1/chat/completions" in text
    assert "EngineError" in text and "caught fire" in text


def test_a_storage_failure_is_a_500_logged_with_its_traceback(tmp_path, caplog):
    with start_gateway("tiny", engine=TestEngine(scripted_engine("tiny")), ledger=tmp_path / "l.db") as gw:
        ro = gw.create_rollout("g")

        async def broken(*a, **kw):
            raise sqlite3.OperationalError("disk I/O error")

        def broken_now(*a, **kw):
            raise sqlite3.OperationalError("disk I/O error")

        # the instance attributes shadow the methods: the grouped write, and the one a call served
        # alone commits at once
        gw.gateway.ledger.acomplete_call = broken
        gw.gateway.ledger.complete_call = broken_now
        with caplog.at_level(logging.ERROR, logger="rowgrove.gateway"):
            r = httpx.post(ro["base_url"] + "/chat/completions", json={"messages": USER}, headers=_auth(ro))
            time.sleep(0.05)
        err = _error(r, 500)
        assert err["type"] == "server_error" and "disk I/O error" in err["message"]
        recs = [r for r in caplog.records if r.name == "rowgrove.gateway" and r.levelno >= logging.ERROR]
        assert len(recs) == 1 and recs[0].exc_info is not None
        assert "500" in recs[0].getMessage() and "OperationalError" in recs[0].getMessage()
        (call,) = gw.ledger.calls(ro["rollout_id"])
        assert call.status == "failed" and "disk I/O error" in call.error


# -- models and the rollout-less chat route --------------------------------------------------------


def test_models_list_names_the_served_model(gw, ro):
    client = OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
    models = client.models.list()
    assert [m.id for m in models.data] == [gw.gateway.model_name]
    assert httpx.get(gw.url + "/v1/models").json()["data"][0]["id"] == gw.gateway.model_name
    # the per-rollout route wants the rollout's key
    assert httpx.get(ro["base_url"] + "/models").status_code == 401


def test_models_name_is_the_model_spec_or_the_setting(tmp_path):
    with start_gateway("tiny", engine="scripted", ledger=tmp_path / "a.db") as gw:
        assert httpx.get(gw.url + "/v1/models").json()["data"][0]["id"] == "tiny"
    with start_gateway("tiny", engine=TestEngine(scripted_engine("tiny")), ledger=tmp_path / "b.db",
                       model_name="my-policy") as gw:
        assert httpx.get(gw.url + "/v1/models").json()["data"][0]["id"] == "my-policy"


def test_chat_at_the_plain_base_url_with_no_rollouts_key_is_401_saying_what_to_do(gw):
    """The plain /v1 finds a rollout by its key alone; a key no rollout has is refused, in one
    sentence that says which key to send (or which base URL to call), and nothing is recorded."""
    before = dump_ledger(gw.ledger_path)
    client = OpenAI(base_url=gw.url + "/v1", api_key="anything", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        client.chat.completions.create(model="m", messages=USER)
    err = info.value.response.json()["error"]
    assert "POST /v1/rollouts" in err["message"] and "base_url" in err["message"]
    assert dump_ledger(gw.ledger_path) == before


def test_unknown_routes_and_methods_keep_the_error_shape(gw):
    _error(httpx.get(gw.url + "/v1/nothing"), 404)
    _error(httpx.delete(gw.url + "/v1/rollouts"), 405)
    _error(httpx.get(gw.url + "/v1/chat/completions"), 405)


def test_concurrent_hostile_bodies_keep_the_server_healthy(gw, ro):
    """Several deep and broken bodies at once: all 4xx, the server answers /health after."""
    results: list[int] = []

    def hit(raw: bytes) -> None:
        results.append(httpx.post(ro["base_url"] + "/chat/completions", content=raw, headers=_auth(ro)).status_code)

    bodies = [_nested(1000), _nested(300), b"{" * 5000, b'{"messages": ' + _nested(100) + b"}", b"\xff\xfe"]
    threads = [threading.Thread(target=hit, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [400] * len(bodies)
    assert httpx.get(gw.url + "/health").status_code == 200
