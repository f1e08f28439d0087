"""Against a real `vllm serve` (vLLM's CPU build): what rowgrove stores is what vLLM sampled.

- the sampled ids and logprobs of every call in the ledger and of every trained token in the rows
  equal what vLLM returned (the same request sent to vLLM directly with the same seed) and what
  vLLM re-scores for the finished row (`prompt_logprobs` over the row's ids), streamed and not;
- a continuation sends vLLM its parent's exact ids (prompt + sampled) followed by the new part;
- a client that disconnects mid-generation aborts the request inside vLLM: its /metrics shows no
  running request left.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
import urllib.parse

import httpx
import numpy as np
import pytest
from real_vllm import RecordingVLLMEngine
from openai import OpenAI

from rowgrove.gateway.testing import launch_gateway
from rowgrove.ledger import Ledger

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module", params=[True, False], ids=["stream", "whole"])
def gateway(request, servers, models, tmp_path_factory):
    engine = RecordingVLLMEngine(str(models["untied"]), servers["untied"].url, stream=request.param)
    engine.check()
    handle = launch_gateway(str(models["untied"]), engine=engine,
                            ledger=tmp_path_factory.mktemp("gw") / "ledger.db")
    yield handle, engine, servers["untied"]
    handle.close()
    asyncio.run(engine.aclose())


def _direct(url: str, body: dict) -> dict:
    """The same /v1/completions body sent to vLLM directly, not streamed, with vLLM's own
    `token_ids` asked for (the engine reads the sampled ids from the logprob tokens instead, so
    this is an independent account of what vLLM sampled)."""
    b = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    r = httpx.post(f"{url}/v1/completions", json={**b, "stream": False, "return_token_ids": True}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _rescore(url: str, model: str, ids: list[int]) -> list[float | None]:
    """vLLM's logprob of every token of `ids` after its prefix (None for the first)."""
    r = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": ids, "max_tokens": 1,
                                                  "temperature": 0, "prompt_logprobs": 0}, timeout=120)
    assert r.status_code == 200, r.text
    plp = r.json()["choices"][0]["prompt_logprobs"]
    return [None] + [d[str(t)]["logprob"] for d, t in zip(plp[1:], ids[1:], strict=True)]


def test_ledger_and_rows_hold_what_vllm_sampled_and_rescores(gateway):
    handle, engine, server = gateway
    n0 = len(engine.sent)
    ro = handle.create_rollout("g-real")
    client = OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0, timeout=120)
    messages: list[dict] = [{"role": "system", "content": "You answer briefly."},
                            {"role": "user", "content": "What is the weather in Paris?"}]
    r1 = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=24,
                                        temperature=1.0, seed=11)
    messages.append(r1.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "user", "content": "And in Rome?"})
    r2 = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=24,
                                        temperature=1.0, seed=12)
    messages.append(r2.choices[0].message.model_dump(exclude_none=True))
    handle.finish(ro["rollout_id"], messages=messages, reward=1.0)

    sent = engine.sent[n0:]
    assert len(sent) == 2
    with Ledger(handle.ledger.path, readonly=True) as led:
        calls = sorted(led.calls(ro["rollout_id"]), key=lambda c: c.ordinal)
    assert [c.status for c in calls] == ["completed", "completed"]
    c1, c2 = calls
    # each call's sampled ids and logprobs are what vLLM gives for that exact request
    for call, body in zip(calls, sent, strict=True):
        direct = _direct(server.url, body)
        assert call.sampled_ids.tolist() == direct["token_ids"]
        np.testing.assert_array_equal(call.logprobs, np.asarray(direct["logprobs"]["token_logprobs"], np.float32))
    # the continuation: vLLM got the parent's exact ids, then the new part the ledger stores
    assert c2.parent_id == c1.id and not c2.root
    parent_ids = c1.prompt_ids.tolist() + c1.sampled_ids.tolist()
    assert sent[0]["prompt"] == c1.prompt_ids.tolist()
    assert sent[1]["prompt"] == parent_ids + c2.prompt_ids.tolist()
    assert c2.prompt_len == len(sent[1]["prompt"])

    # the row: every trained token's logprob is vLLM's re-score of the row
    rows = handle.rows(ro["rollout_id"])["rows"]
    assert len(rows) == 1
    row = rows[0]
    ids, mask, lps = row["input_ids"], row["loss_mask"], row["logprobs"]
    assert ids == sent[1]["prompt"] + c2.sampled_ids.tolist()
    trained = [i for i, m in enumerate(mask) if m]
    assert [ids[i] for i in trained] == c1.sampled_ids.tolist() + c2.sampled_ids.tolist()
    theirs = _rescore(server.url, engine.served_model, ids)
    np.testing.assert_allclose([lps[i] for i in trained], [theirs[i] for i in trained], rtol=0, atol=2e-6)


def _metric(url: str, name: str, **labels: str) -> float:
    """The sum of vLLM's Prometheus samples `name` whose labels include `labels`."""
    text = httpx.get(f"{url}/metrics", timeout=60).text
    total, found = 0.0, False
    for m in re.finditer(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", text, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if all(have.get(k) == v for k, v in labels.items()):
            total, found = total + float(m.group(2)), True
    assert found or labels, f"vLLM's /metrics has no {name}"
    return total


@pytest.fixture(scope="module", params=[True, False], ids=["stream", "whole"])
def long_gateway(request, servers, models, tmp_path_factory):
    """A gateway in front of the tied model's server: a random model that rarely ends its turn,
    so a request runs until its client leaves."""
    engine = RecordingVLLMEngine(str(models["tied"]), servers["tied"].url, stream=request.param)
    handle = launch_gateway(str(models["tied"]), engine=engine, ledger=tmp_path_factory.mktemp("gw") / "l.db")
    yield handle, engine, servers["tied"]
    handle.close()
    asyncio.run(engine.aclose())


def _leave_once_vllm_runs_it(ro: dict, body: dict, vllm_url: str) -> None:
    """POST `body` to the rollout's chat route over a bare socket and close it once vLLM reports
    the request running (`vllm:num_requests_running` >= 1). Leaving after a fixed read timeout
    instead raced the gateway on a loaded machine: a client gone before the gateway had sent the
    request upstream is a correct abort that vLLM never sees, so its log names nothing."""
    url = urllib.parse.urlsplit(f"{ro['base_url']}/chat/completions")
    payload = json.dumps(body).encode()
    head = (f"POST {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer {ro['api_key']}\r\ncontent-length: {len(payload)}\r\n\r\n")
    sock = socket.create_connection((url.hostname, url.port), timeout=60)
    try:
        sock.sendall(head.encode() + payload)
        deadline = time.monotonic() + 60
        while _metric(vllm_url, "vllm:num_requests_running") < 1:
            assert time.monotonic() < deadline, "vLLM never ran the gateway's request"
            time.sleep(0.05)
    finally:
        sock.close()


def test_a_client_disconnect_aborts_the_request_inside_vllm(long_gateway):
    """The harness leaves while vLLM generates (3,000 tokens would take seconds): vLLM aborts the
    request (its log: "Aborted request(s) ..." naming the call id rowgrove sent as X-Request-Id),
    its generated-token counter stops well short of 3,000, nothing runs afterwards
    (`vllm:num_requests_running` 0), and the ledger has the call as aborted."""
    handle, engine, server = long_gateway
    tokens0 = _metric(server.url, "vllm:generation_tokens_total")
    ro = handle.create_rollout("g-abort")
    body = {"model": "m", "messages": [{"role": "user", "content": "Count to a million."}],
            "max_tokens": 3000, "temperature": 1.0, "stream": engine.stream}
    _leave_once_vllm_runs_it(ro, body, server.url)
    deadline = time.monotonic() + 60  # vLLM logs the abort late on a busy machine
    calls: list = []
    while time.monotonic() < deadline:
        with Ledger(handle.ledger.path, readonly=True) as led:
            calls = led.calls(ro["rollout_id"])
        if calls and calls[0].status != "pending" and "Aborted request" in server.log_tail(400) \
                and calls[0].id in server.log_tail(400):
            break
        time.sleep(0.2)
    assert [c.status for c in calls] == ["aborted"]
    aborted = [ln for ln in server.log_tail(400).splitlines() if "Aborted request" in ln]
    assert any(calls[0].id in ln for ln in aborted), aborted
    time.sleep(1.0)
    generated = _metric(server.url, "vllm:generation_tokens_total") - tokens0
    assert _metric(server.url, "vllm:num_requests_running") == 0
    assert generated < 3000
    time.sleep(1.0)
    assert _metric(server.url, "vllm:generation_tokens_total") - tokens0 == generated  # nothing runs on


def test_the_cpu_servers_engine_processes_run_reniced_and_its_api_server_does_not(servers):
    """start_vllm renices the engine core and worker of a CPU server (they busy-poll their shared
    memory queues between steps and otherwise starve the request path: docs/engines.md,
    bench_remote) and leaves the API server, which is on every request's path, as it was."""
    import os

    from rowgrove.engines.launch import descendants

    server = servers["untied"]
    assert len(server.engine_pids) >= 2, server.engine_pids  # engine core + worker (+ helpers)
    names = {p: open(f"/proc/{p}/comm").read().strip() for p in server.engine_pids if os.path.exists(f"/proc/{p}")}
    assert any(n.startswith("VLLM::EngineCor") for n in names.values()), names
    assert any(n.startswith("VLLM::Worker") for n in names.values()), names
    for p in descendants(server.process.pid):
        for tid in os.listdir(f"/proc/{p}/task"):
            assert os.getpriority(os.PRIO_PROCESS, int(tid)) == 19, (p, names.get(p), tid)
    assert os.getpriority(os.PRIO_PROCESS, server.process.pid) == os.getpriority(os.PRIO_PROCESS, 0)
