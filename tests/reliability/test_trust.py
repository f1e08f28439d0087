"""Trust boundaries: base_url comes from the server's public address, never from the request's
Host header; X-Forwarded-For is believed only from configured proxies, and the loopback trust of
the control routes follows the socket peer otherwise."""

from __future__ import annotations

import httpx
import pytest

from fixtures_http import TestEngine, dump_ledger, scripted_engine
from rowgrove.errors import InputError
from rowgrove.gateway.sessions import Gateway, GatewaySettings
from rowgrove.gateway.testing import start_gateway
from rowgrove.ledger import Ledger


def test_base_url_ignores_the_host_header(tmp_path):
    with start_gateway("tiny", engine=TestEngine(scripted_engine("tiny")), ledger=tmp_path / "l.db") as gw:
        for host in ("evil.example", "evil.example:443", "127.0.0.1:1", "[::1]:9"):
            r = httpx.post(gw.url + "/v1/rollouts", json={"group_id": "g"},
                           headers={"host": host, "x-forwarded-host": "evil.example",
                                    "x-forwarded-proto": "https", "forwarded": "host=evil.example"})
            assert r.status_code == 201
            rid = r.json()["rollout_id"]
            assert r.json()["base_url"] == f"{gw.url}/rollouts/{rid}/v1"  # the bound port


def test_base_url_uses_the_configured_public_url(tmp_path):
    with start_gateway("tiny", engine=TestEngine(scripted_engine("tiny")), ledger=tmp_path / "l.db",
                       public_url="https://gw.example/rowgrove/") as gw:
        r = httpx.post(gw.url + "/v1/rollouts", json={"group_id": "g"}, headers={"host": "evil.example"})
        rid = r.json()["rollout_id"]
        assert r.json()["base_url"] == f"https://gw.example/rowgrove/rollouts/{rid}/v1"


def test_a_bad_public_url_is_refused_up_front():
    for bad in ("gw.example:8000", "ftp://x", "http://", ""):
        with pytest.raises(InputError, match="--public-url"):
            GatewaySettings(public_url=bad)


def test_without_trusted_proxies_x_forwarded_for_is_ignored(tmp_path):
    with start_gateway("tiny", engine=TestEngine(scripted_engine("tiny")), ledger=tmp_path / "l.db") as gw:
        # a loopback peer is trusted whatever it claims to forward for
        r = httpx.post(gw.url + "/v1/rollouts", json={"group_id": "g"}, headers={"x-forwarded-for": "203.0.113.9"})
        assert r.status_code == 201
        # and request.client is the socket peer (uvicorn's proxy-header rewriting is off)
        assert gw.server.config.proxy_headers is False


def test_a_trusted_proxy_forwards_the_client_address(tmp_path):
    with start_gateway("tiny", engine=TestEngine(scripted_engine("tiny")), ledger=tmp_path / "l.db",
                       trusted_proxies=("127.0.0.1",)) as gw:
        before = dump_ledger(gw.ledger_path)
        for headers in ({"x-forwarded-for": "203.0.113.9"},            # a remote client behind the proxy
                        {"x-forwarded-for": "127.0.0.1, 203.0.113.9"},  # spoofed first hop: the proxy's own entry counts
                        {}):                                          # the proxy sent no address: not trusted
            r = httpx.post(gw.url + "/v1/rollouts", json={"group_id": "g"}, headers=headers)
            assert r.status_code == 401, headers
            assert r.json()["error"]["type"] == "authentication_error"
        assert dump_ledger(gw.ledger_path) == before
        # a loopback client behind the proxy is trusted
        r = httpx.post(gw.url + "/v1/rollouts", json={"group_id": "g"}, headers={"x-forwarded-for": "127.0.0.1"})
        assert r.status_code == 201
        # and the rollout's own key works whatever the address
        ro = r.json()
        r = httpx.get(f"{gw.url}/v1/rollouts/{ro['rollout_id']}",
                      headers={"x-forwarded-for": "203.0.113.9", "authorization": f"Bearer {ro['api_key']}"})
        assert r.status_code == 200


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "g.db") as led:
        yield led


def _gateway(ledger, **kw) -> Gateway:
    return Gateway(TestEngine(scripted_engine("tiny")), ledger, GatewaySettings(**kw))


def test_client_host_rules(ledger):
    plain = _gateway(ledger)
    assert plain.client_host("127.0.0.1", "203.0.113.9") == "127.0.0.1"
    assert plain.client_host("10.0.0.5", None) == "10.0.0.5"
    gw = _gateway(ledger, trusted_proxies=("10.0.0.0/24", "::1"))
    assert gw.client_host("10.0.0.5", "203.0.113.9") == "203.0.113.9"
    assert gw.client_host("10.0.0.5", "203.0.113.9, 10.0.0.7") == "203.0.113.9"   # proxies chained
    assert gw.client_host("10.0.0.5", "198.51.100.1, 203.0.113.9") == "203.0.113.9"  # nearest untrusted hop
    assert gw.client_host("10.0.0.5", "127.0.0.1") == "127.0.0.1"
    assert gw.client_host("10.0.0.5", "10.0.0.8, 10.0.0.9") == "10.0.0.8"       # all proxies: the first
    assert gw.client_host("10.0.0.5", None) is None
    assert gw.client_host("10.0.0.5", " , ") is None
    assert gw.client_host("::1", "[::1]") == "::1"
    assert gw.client_host("::ffff:10.0.0.5", "203.0.113.9") == "203.0.113.9"   # IPv4-mapped peer
    assert gw.client_host("192.0.2.1", "127.0.0.1") == "192.0.2.1"             # not a proxy: its own address
    assert gw.client_host("10.0.0.5", "not-an-ip") == "not-an-ip"              # not loopback: refused later


def test_a_bad_trusted_proxy_is_refused_up_front():
    with pytest.raises(InputError, match="--trusted-proxy"):
        GatewaySettings(trusted_proxies=("gw.example",))
