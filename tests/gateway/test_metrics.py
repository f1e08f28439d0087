"""GET /metrics: Prometheus text from the gateway's own registry, parsed back with
prometheus_client's parser and compared with what the test made happen."""

from __future__ import annotations

import re
import threading
import time

import httpx
import openai
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from fixtures_http import TestEngine, scripted_engine
from rowgrove.errors import EngineError
from rowgrove.gateway.metrics import GatewayMetrics
from rowgrove.gateway.testing import start_gateway

USER = [{"role": "user", "content": "hello"}]


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _get(s: dict, name: str, **labels) -> float:
    return s.get((name, tuple(sorted(labels.items()))), 0.0)


def _client(ro) -> OpenAI:
    return OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)


def test_metrics_count_calls_latency_rejections_and_rollouts(tmp_path):
    engine = TestEngine(scripted_engine("tiny-qwen3"))
    with start_gateway("tiny-qwen3", engine=engine, ledger=tmp_path / "l.db") as gw:
        ro = gw.create_rollout("g-metrics")
        gw.create_rollout("g-open")
        c = _client(ro)
        r1 = c.chat.completions.create(model="m", messages=USER)
        # a continuation (Qwen3 drops earlier reasoning: history drift when there is some)
        msgs = USER + [r1.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
        r2 = c.chat.completions.create(model="m", messages=msgs)
        drift_msgs = [{"role": "user", "content": "think"}]
        r3 = c.chat.completions.create(model="m", messages=drift_msgs,
                                       extra_body={"script": "<think>\nhmm\n</think>\n\nok"})
        c.chat.completions.create(model="m", messages=drift_msgs + [
            r3.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}])
        engine.fail = EngineError("boom")
        try:
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "fail"}])
        except openai.InternalServerError:
            pass
        finally:
            engine.reset()
        try:
            OpenAI(base_url=ro["base_url"], api_key="rk_wrong", max_retries=0).chat.completions.create(
                model="m", messages=USER)
        except openai.AuthenticationError:
            pass
        httpx.post(ro["base_url"] + "/chat/completions", content=b"{", headers={"authorization": f"Bearer {ro['api_key']}"})
        httpx.get(gw.url + "/no/such/route")
        gw.finish(ro["rollout_id"], messages=msgs + [r2.choices[0].message.model_dump(exclude_none=True)], reward=1.0)

        r = httpx.get(gw.url + "/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        s = _samples(r.text)
        kinds = {(k[1]): v for k, v in s.items() if k[0] == "rowgrove_calls_total"}
        assert _get(s, "rowgrove_calls_total", status="completed", kind="root") == 2
        assert _get(s, "rowgrove_calls_total", status="completed", kind="continuation") == 1
        assert _get(s, "rowgrove_calls_total", status="completed", kind="history_drift") == 1, kinds
        assert _get(s, "rowgrove_calls_total", status="failed", kind="root") == 1
        assert _get(s, "rowgrove_engine_latency_seconds_count") == 5
        assert _get(s, "rowgrove_gateway_latency_seconds_count") == 4  # answered calls
        assert _get(s, "rowgrove_rejected_requests_total", status="502") == 1
        assert _get(s, "rowgrove_rejected_requests_total", status="401") == 1
        assert _get(s, "rowgrove_rejected_requests_total", status="400") == 1
        assert _get(s, "rowgrove_rejected_requests_total", status="404") == 1
        assert _get(s, "rowgrove_rollouts", status="open") == 1
        assert _get(s, "rowgrove_rollouts", status="finished") == 1
        assert _get(s, "rowgrove_generations_in_flight") == 0
        assert _get(s, "rowgrove_queue_capacity") == 256
        assert _get(s, "rowgrove_open_uploads") == 0
        assert _get(s, "rowgrove_requests_in_progress") == 1  # the scrape itself


def test_in_flight_and_requests_in_progress_while_a_call_runs(tmp_path):
    engine = TestEngine(scripted_engine("tiny"))
    with start_gateway("tiny", engine=engine, ledger=tmp_path / "l.db", max_queue=7) as gw:
        ro = gw.create_rollout("g")
        engine.delay = 1.0
        t = threading.Thread(target=lambda: _client(ro).chat.completions.create(model="m", messages=USER))
        t.start()
        end = time.monotonic() + 5
        while gw.gateway.in_flight == 0 and time.monotonic() < end:
            time.sleep(0.01)
        s = _samples(httpx.get(gw.url + "/metrics").text)
        assert _get(s, "rowgrove_generations_in_flight") == 1
        assert _get(s, "rowgrove_requests_in_progress") == 2
        assert _get(s, "rowgrove_queue_capacity") == 7
        t.join()
        s = _samples(httpx.get(gw.url + "/metrics").text)
        assert _get(s, "rowgrove_generations_in_flight") == 0
        assert _get(s, "rowgrove_engine_latency_seconds_bucket", le="0.5") == 0  # it took a second
        assert _get(s, "rowgrove_engine_latency_seconds_bucket", le="2.5") == 1


def test_two_gateways_in_one_process_keep_their_own_metrics(tmp_path):
    with start_gateway("tiny", engine=TestEngine(scripted_engine("tiny")), ledger=tmp_path / "a.db") as a, \
            start_gateway("tiny", engine=TestEngine(scripted_engine("tiny")), ledger=tmp_path / "b.db") as b:
        ro = a.create_rollout("g")
        _client(ro).chat.completions.create(model="m", messages=USER)
        sa = _samples(httpx.get(a.url + "/metrics").text)
        sb = _samples(httpx.get(b.url + "/metrics").text)
        assert _get(sa, "rowgrove_calls_total", status="completed", kind="root") == 1
        assert _get(sb, "rowgrove_calls_total", status="completed", kind="root") == 0
        assert _get(sa, "rowgrove_rollouts", status="open") == 1
        assert _get(sb, "rowgrove_rollouts", status="open") == 0
    # and nothing went into the process-wide default registry
    from prometheus_client import REGISTRY

    assert not [m for m in REGISTRY.collect() if m.name.startswith("rowgrove_")]
    GatewayMetrics(in_flight=lambda: 0, open_uploads=lambda: 0, queue_capacity=1, rollouts=lambda s: 0)


def test_metrics_are_a_control_route(tmp_path):
    with start_gateway("tiny", engine=TestEngine(scripted_engine("tiny")), ledger=tmp_path / "l.db",
                       admin_key="adm") as gw:
        assert httpx.get(gw.url + "/metrics").status_code == 401
        r = httpx.get(gw.url + "/metrics", headers={"authorization": "Bearer adm"})
        assert r.status_code == 200 and "rowgrove_calls" in r.text


def test_a_closed_ledger_does_not_break_a_scrape():
    m = GatewayMetrics(in_flight=lambda: 0, open_uploads=lambda: 0, queue_capacity=1,
                       rollouts=lambda s: (_ for _ in ()).throw(RuntimeError("closed")))
    s = _samples(m.render().decode())
    assert _get(s, "rowgrove_rollouts", status="open") != _get(s, "rowgrove_rollouts", status="open")  # NaN


def _masked(text: bytes) -> str:
    """The exposition with the `_created` timestamps masked (they differ between two registries)."""
    return re.sub(r"(_created(\{[^}]*\})?) \S+", r"\1 T", text.decode())


@settings(max_examples=50, deadline=None)
@given(engine=st.lists(st.floats(0, 1000, allow_nan=False) | st.sampled_from([0.001, 0.0025, 600.0, 1e9])),
       gateway=st.lists(st.floats(0, 1000, allow_nan=False)),
       ended=st.lists(st.tuples(st.sampled_from(["completed", "failed", "aborted", "undelivered"]),
                                st.sampled_from(["root", "continuation", "history_drift"]))),
       in_progress=st.integers(0, 5))
def test_the_loop_metrics_expose_what_prometheus_clients_own_would(engine, gateway, ended, in_progress):
    """The gateway keeps its per-call figures as plain numbers (metrics.LoopHistogram, ...): the
    scrape must read exactly as prometheus_client's Histogram, Counter and Gauge would."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    from rowgrove.gateway.metrics import _LATENCY_BUCKETS

    ours = GatewayMetrics(in_flight=lambda: 2, open_uploads=lambda: 0, queue_capacity=8, rollouts=lambda s: 1)
    ref = CollectorRegistry(auto_describe=True)
    calls = Counter("rowgrove_calls", "Calls by how they ended and their kind", ("status", "kind"), registry=ref)
    hosted = Counter("rowgrove_hosted_tools_dropped",
                     "Hosted tools left out of a call's prompt (the provider runs them), by type", ("type",),
                     registry=ref)
    eng = Histogram("rowgrove_engine_latency_seconds", "Time in the engine per call", buckets=_LATENCY_BUCKETS,
                    registry=ref)
    gw = Histogram("rowgrove_gateway_latency_seconds", "Chat completion time in the gateway, request to committed "
                   "answer (engine included)", buckets=_LATENCY_BUCKETS, registry=ref)
    rejected = Counter("rowgrove_rejected_requests", "Requests answered with an error status", ("status",),
                       registry=ref)
    Gauge("rowgrove_generations_in_flight", "Generations being sampled (bounded by --max-queue)",
          registry=ref).set_function(lambda: 2)
    Gauge("rowgrove_queue_capacity", "The most generations in flight at once (--max-queue)", registry=ref).set(8)
    progress = Gauge("rowgrove_requests_in_progress", "HTTP requests being handled", registry=ref)
    Gauge("rowgrove_open_uploads", "Requests whose body is still being read (--max-open-uploads)",
          registry=ref).set_function(lambda: 0)
    rollouts = Gauge("rowgrove_rollouts", "Rollouts in the ledger by status", ("status",), registry=ref)
    for status in ("open", "finished"):
        rollouts.labels(status=status).set_function(lambda: 1.0)
    for x in engine:
        ours.engine_latency.observe(x)
        eng.observe(x)
    for x in gateway:
        ours.gateway_latency.observe(x)
        gw.observe(x)
    for status, kind in ended:
        ours.call_ended(status, kind)
        calls.labels(status=status, kind=kind).inc()
    for _ in range(in_progress):
        ours.requests_in_progress += 1
        progress.inc()
    ours.rejected.labels(status="400").inc()
    rejected.labels(status="400").inc()
    for kind in ("web_search", "web_search", "file_search"):
        ours.hosted_dropped.inc(kind)
        hosted.labels(type=kind).inc()
    assert _masked(ours.render()) == _masked(generate_latest(ref))
