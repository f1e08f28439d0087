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

Built on `prometheus_client`; `render()` gives the text exposition format.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE", "GatewayMetrics", "call_kind"]

CONTENT_TYPE = CONTENT_TYPE_LATEST

# seconds: the gateway's own work is sub-millisecond to tens of milliseconds, a generation
# milliseconds (scripted) to minutes (long agent turns on a large model)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0, 60.0, 120.0, 300.0, 600.0)


class GatewayMetrics:
    """The metrics of one gateway, in their own `CollectorRegistry` (`.registry`)."""

    def __init__(self, *, in_flight: Callable[[], float], open_uploads: Callable[[], float],
                 queue_capacity: int, rollouts: Callable[[str], int]):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.calls = Counter("rowgrove_calls", "Calls by how they ended and their kind",
                             ("status", "kind"), registry=r)
        self._ended: dict[tuple[str, str], Any] = {}
        self.engine_latency = Histogram("rowgrove_engine_latency_seconds",
                                        "Time in the engine per call", buckets=_LATENCY_BUCKETS, registry=r)
        self.gateway_latency = Histogram("rowgrove_gateway_latency_seconds",
                                         "Chat completion time in the gateway, request to committed answer "
                                         "(engine included)", buckets=_LATENCY_BUCKETS, registry=r)
        self.rejected = Counter("rowgrove_rejected_requests", "Requests answered with an error status",
                                ("status",), registry=r)
        Gauge("rowgrove_generations_in_flight", "Generations being sampled (bounded by --max-queue)",
              registry=r).set_function(in_flight)
        Gauge("rowgrove_queue_capacity", "The most generations in flight at once (--max-queue)",
              registry=r).set(queue_capacity)
        self.requests_in_progress = Gauge("rowgrove_requests_in_progress",
                                          "HTTP requests being handled", registry=r)
        Gauge("rowgrove_open_uploads", "Requests whose body is still being read (--max-open-uploads)",
              registry=r).set_function(open_uploads)
        self._rollouts = Gauge("rowgrove_rollouts", "Rollouts in the ledger by status", ("status",), registry=r)
        for status in ("open", "finished"):
            self._rollouts.labels(status=status).set_function(_counter_of(rollouts, status))

    def call_ended(self, status: str, kind: str) -> None:
        child = self._ended.get((status, kind))
        if child is None:  # labels() checks and locks on every call; the few children are kept
            child = self._ended[(status, kind)] = self.calls.labels(status=status, kind=kind)
        child.inc()

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
