"""The gateway's Prometheus metrics (`GET /metrics`), one registry per `Gateway`, so several
gateways in one process (tests, a trainer with two servers) never share or clash.

    rowgrove_calls_total{status, kind}        calls by how they ended (completed | failed | aborted
                                              | undelivered) and kind (root | continuation |
                                              history_drift). `undelivered` counts completed calls
                                              whose response did not reach the client (the ledger
                                              moves them to aborted): they are also in `completed`
    rowgrove_engine_latency_seconds           time in engine.generate per call (histogram)
    rowgrove_gateway_latency_seconds          a chat completion from request to committed answer,
                                              engine time included (histogram)
    rowgrove_generations_in_flight            generations being sampled (the queue --max-queue bounds)
    rowgrove_queue_capacity                   --max-queue
    rowgrove_requests_in_progress             HTTP requests being handled (body read and waits included)
    rowgrove_open_uploads                     requests whose body is still being read (--max-open-uploads)
    rowgrove_rejected_requests_total{status}  requests answered with an error status (4xx and 5xx)
    rowgrove_rollouts{status}                 rollouts in the ledger by status (open | finished),
                                              counted at scrape time

Built on `prometheus_client`; `render()` gives the text exposition format. The figures every
call moves (the two latency histograms, the calls counter, the requests in progress) are kept
as plain numbers and handed to the registry when it is scraped, with the samples
`prometheus_client`'s own Histogram, Counter and Gauge give: those take a lock per bucket and
per change, 1-2% of a call's CPU at load, and only the server's event loop changes these.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client import metrics as _prometheus_metrics
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

__all__ = ["CONTENT_TYPE", "GatewayMetrics", "call_kind"]

CONTENT_TYPE = CONTENT_TYPE_LATEST

# seconds: the gateway's own work is sub-millisecond to tens of milliseconds, a generation
# milliseconds (scripted) to minutes (long agent turns on a large model)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0, 60.0, 120.0, 300.0, 600.0)


def _created_series() -> bool:
    # prometheus_client's switch (PROMETHEUS_DISABLE_CREATED_SERIES, disable_created_metrics())
    return bool(getattr(_prometheus_metrics, "_use_created", True))


class LoopHistogram:
    """A histogram changed only on the event loop: `observe` is a bisect and two additions."""

    def __init__(self, name: str, documentation: str, buckets: Iterable[float]):
        self.name, self.documentation = name, documentation
        self.bounds = [float(b) for b in buckets] + [float("inf")]
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        i = bisect_left(self.bounds, amount)
        if i < len(self.counts):  # NaN lands nowhere, as in prometheus_client
            self.counts[i] += 1
        self.sum += amount

    def collect(self) -> list[Metric]:
        m = Metric(self.name, self.documentation, "histogram")
        acc = 0.0
        for bound, n in zip(self.bounds, self.counts):
            acc += n
            m.add_sample(self.name + "_bucket", {"le": floatToGoString(bound)}, acc)
        m.add_sample(self.name + "_count", {}, acc)
        m.add_sample(self.name + "_sum", {}, self.sum)
        if _created_series():
            m.add_sample(self.name + "_created", {}, self.created)
        return [m]

    describe = collect


class LoopCounter:
    """A labelled counter changed only on the event loop: `inc(*label values)`."""

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...]):
        self.name, self.documentation, self.labelnames = name, documentation, labelnames
        self.values: dict[tuple[str, ...], list[float]] = {}  # label values -> [count, created]

    def inc(self, *labels: str) -> None:
        v = self.values.get(labels)
        if v is None:
            v = self.values[labels] = [0.0, time.time()]
        v[0] += 1

    def collect(self) -> list[Metric]:
        m = Metric(self.name, self.documentation, "counter")
        created = _created_series()
        for labels, (count, at) in list(self.values.items()):
            named = dict(zip(self.labelnames, labels))
            m.add_sample(self.name + "_total", named, count)
            if created:
                m.add_sample(self.name + "_created", named, at)
        return [m]

    describe = collect


class GatewayMetrics:
    """The metrics of one gateway, in their own `CollectorRegistry` (`.registry`)."""

    def __init__(self, *, in_flight: Callable[[], float], open_uploads: Callable[[], float],
                 queue_capacity: int, rollouts: Callable[[str], int]):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.calls = LoopCounter("rowgrove_calls", "Calls by how they ended and their kind", ("status", "kind"))
        r.register(self.calls)
        self.hosted_dropped = LoopCounter("rowgrove_hosted_tools_dropped",
                                          "Hosted tools left out of a call's prompt (the provider runs them), by type",
                                          ("type",))
        r.register(self.hosted_dropped)
        self.engine_latency = LoopHistogram("rowgrove_engine_latency_seconds", "Time in the engine per call",
                                            _LATENCY_BUCKETS)
        r.register(self.engine_latency)
        self.gateway_latency = LoopHistogram("rowgrove_gateway_latency_seconds",
                                             "Chat completion time in the gateway, request to committed answer "
                                             "(engine included)", _LATENCY_BUCKETS)
        r.register(self.gateway_latency)
        self.rejected = Counter("rowgrove_rejected_requests", "Requests answered with an error status",
                                ("status",), registry=r)
        Gauge("rowgrove_generations_in_flight", "Generations being sampled (bounded by --max-queue)",
              registry=r).set_function(in_flight)
        Gauge("rowgrove_queue_capacity", "The most generations in flight at once (--max-queue)",
              registry=r).set(queue_capacity)
        self.requests_in_progress = 0  # HTTP requests being handled: the app counts them on the loop
        Gauge("rowgrove_requests_in_progress", "HTTP requests being handled",
              registry=r).set_function(lambda: self.requests_in_progress)
        Gauge("rowgrove_open_uploads", "Requests whose body is still being read (--max-open-uploads)",
              registry=r).set_function(open_uploads)
        self._rollouts = Gauge("rowgrove_rollouts", "Rollouts in the ledger by status", ("status",), registry=r)
        for status in ("open", "finished"):
            self._rollouts.labels(status=status).set_function(_counter_of(rollouts, status))

    def call_ended(self, status: str, kind: str) -> None:
        self.calls.inc(status, kind)

    def render(self) -> bytes:
        """The registry in Prometheus' text exposition format."""
        return generate_latest(self.registry)


def _counter_of(rollouts: Callable[[str], int], status: str) -> Callable[[], float]:
    def read() -> float:
        try:
            return float(rollouts(status))
        except Exception:  # noqa: BLE001 - a closed ledger must not break the scrape
            return float("nan")

    return read


def call_kind(parent_id: Any, drift: bool) -> str:
    """root | continuation | history_drift (a continuation whose history the template re-renders
    differently)."""
    if parent_id is None:
        return "root"
    return "history_drift" if drift else "continuation"
