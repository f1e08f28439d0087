"""Hosted tools left out of the prompt by default (Responses `web_search`, `file_search`, ...;
Anthropic's server tools) are recorded on the call (its stored response and its entry in
GET /v1/rollouts/{id} say which, by type) and counted in the metrics,
`rowgrove_hosted_tools_dropped_total{type=...}`; a call without them records nothing."""

from __future__ import annotations

import anthropic
import httpx
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from rowgrove.gateway.testing import start_gateway

FN = {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}


def _dropped(gw) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(httpx.get(gw.url + "/metrics").text):
        for s in fam.samples:
            if s.name == "rowgrove_hosted_tools_dropped_total":
                out[s.labels["type"]] = s.value
    return out


def test_dropped_hosted_tools_are_recorded_on_the_call_and_counted():
    with start_gateway("tiny", engine="scripted") as gw:
        ro = gw.create_rollout("g")
        client = OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
        hosted = [{"type": "web_search"}, {"type": "file_search", "vector_store_ids": ["vs_1"]},
                  {"type": "web_search"}]
        client.responses.create(model="m", input="hi", tools=[FN, *hosted], extra_body={"script": "a"})
        client.responses.create(model="m", input="hi again", tools=[FN], extra_body={"script": "b"})
        ant = anthropic.Anthropic(base_url=ro["base_url"].removesuffix("/v1"), api_key=ro["api_key"], max_retries=0)
        ant.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "hey"}],
                            tools=[{"type": "web_search_20250305", "name": "web_search"},
                                   {"name": "Bash", "input_schema": {"type": "object"}}],
                            extra_body={"script": "c"})
        c1, c2, c3 = gw.ledger.calls(ro["rollout_id"])
        assert c1.response["hosted_tools_dropped"] == ["web_search", "file_search", "web_search"]
        assert "hosted_tools_dropped" not in c2.response
        assert c3.response["hosted_tools_dropped"] == ["web_search_20250305"]
        lineage = httpx.get(f"{gw.url}/v1/rollouts/{ro['rollout_id']}").json()["calls"]
        assert [c.get("hosted_tools_dropped") for c in lineage] == [
            ["web_search", "file_search", "web_search"], None, ["web_search_20250305"]]
        assert _dropped(gw) == {"web_search": 2.0, "file_search": 1.0, "web_search_20250305": 1.0}
        # count_tokens generates nothing: it counts no call
        ant.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hey"}],
                                  tools=[{"type": "web_search_20250305", "name": "web_search"}])
        assert _dropped(gw)["web_search_20250305"] == 1.0


def test_refused_hosted_tools_count_nothing():
    with start_gateway("tiny", engine="scripted", hosted_tools="refuse") as gw:
        ro = gw.create_rollout("g")
        r = httpx.post(ro["base_url"] + "/responses", headers={"authorization": f"Bearer {ro['api_key']}"},
                       json={"model": "m", "input": "hi", "tools": [{"type": "web_search"}]})
        assert r.status_code == 400 and "'web_search'" in r.text
        assert _dropped(gw) == {} and gw.ledger.calls(ro["rollout_id"]) == []
