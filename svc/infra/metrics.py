"""Prometheus metrics: one registry per process, text format by prometheus-client.

The model server's metric set is defined here once, so the names of
docs/contract.md, Metrics, are spelled in one place.
"""

from __future__ import annotations

import gc

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from svc.contract.jobs import COUNTED

disable_created_metrics()

#: Buckets in milliseconds, from sub-millisecond proxying to long diffusion jobs.
MS_BUCKETS = (0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 600000)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024)

CONTENT_TYPE = CONTENT_TYPE_LATEST


def new_registry() -> CollectorRegistry:
    """A process registry with the standard process and garbage-collector metrics.

    ``python_gc_collections_total{generation="2"}`` counts the full
    collections, which stop the reactor for as long as they walk the heap;
    ``service_gc_frozen_objects`` is what :func:`svc.infra.process.freeze_heap`
    took out of their reach at startup.
    """
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    GCCollector(registry=registry)
    frozen = Gauge("service_gc_frozen_objects", "Objects exempted from garbage collection after startup (gc.freeze).",
                   registry=registry)
    frozen.set_function(gc.get_freeze_count)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The registry in the Prometheus text exposition format."""
    return generate_latest(registry)


class HttpMetrics:
    """Request counters shared by every process that speaks HTTP (the supervisor has these alone)."""

    #: Labels after the common ones (the gateway's ``protocol``).
    extra_labels: tuple[str, ...] = ()

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "service_http_requests",
            "HTTP replies by route, method and status code (every reply, async ones included).",
            ("route", "method", "code", *self.extra_labels),
            registry=registry,
        )


class InferenceHttpMetrics(HttpMetrics):
    """The request counters plus the duration of inference requests: the processes that serve inference."""

    duration_help = "Duration of synchronous inference requests in ms (async replies add no sample)."

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.duration = Histogram(
            "service_http_request_duration_ms",
            self.duration_help,
            ("route", *self.extra_labels),
            buckets=MS_BUCKETS,
            registry=registry,
        )


class ModelServerMetrics(InferenceHttpMetrics):
    """Everything a model server exports."""

    def __init__(self, registry: CollectorRegistry, model: str) -> None:
        super().__init__(registry)
        self.queue_rejected = Counter(
            "service_queue_rejected", "Requests rejected by a full sync wait queue.", registry=registry
        )
        self.batch_size = Histogram(
            "service_batch_size", "Items per batch run.", buckets=BATCH_BUCKETS, registry=registry
        )
        self.batch_window_wait = Histogram(
            "service_batch_window_wait_ms",
            "How long the first item of a batch waited before the batch started, in ms.",
            buckets=MS_BUCKETS,
            registry=registry,
        )
        self.stage = Histogram(
            "service_stage_duration_ms",
            "Per-stage time in ms: parse (body to request), decode (per request; per batch with "
            "backend.decode_in_worker), "
            "queue_wait (per item), inference (per batch forward pass, one that raised or was stopped included), "
            "postprocess (per batch).",
            ("stage",),
            buckets=MS_BUCKETS,
            registry=registry,
        )
        self.items = Counter(
            "service_items", "Image items answered, by item status text.", ("status",), registry=registry
        )
        self.items_abandoned = Counter(
            "service_items_abandoned", "Image items of synchronous requests whose client went away before their "
            "answer: they left the queue unrun, or their batch stopped at its next step once nobody waited for it.",
            registry=registry,
        )
        self.queue_depth = Gauge(
            "service_queue_depth", "Image items waiting for a worker (admitted, not yet running).", registry=registry
        )
        self.ready = Gauge("service_model_ready", "1 when the model is loaded and warmed up.", registry=registry)
        self.async_jobs = Counter(
            "service_async_jobs",
            "Job transitions by state: a successful job increments submitted, running, done in turn.",
            ("state",),
            registry=registry,
        )
        for state in COUNTED:  # every state at 0 from the start, as the gateway's sum shows them
            self.async_jobs.labels(state)
        self.async_duration = Histogram(
            "service_async_job_duration_ms",
            "Job duration from submission to its terminal state, in ms.",
            buckets=MS_BUCKETS,
            registry=registry,
        )
        self.async_depth = Gauge("service_async_queue_depth", "Pending + running jobs.", registry=registry)
        self.async_running = Gauge("service_async_running_jobs", "Running jobs (of service_async_queue_depth).",
                                   registry=registry)
        self.async_waiters = Gauge(
            "service_async_waiters", "Requests parked in GET /jobs/{job}/wait.", registry=registry
        )
        self.info = Gauge(
            "service_model_info", "Model identity (value 1); replica: the process's SERVICE_REPLICA index; optimize: the "
            "execution mode in use (backend.optimize, what auto chose), loading until the model is ready.",
            ("model", "version", "device", "replica", "optimize"), registry=registry
        )


class GatewayMetrics(InferenceHttpMetrics):
    """Everything the gateway exports: its own requests, per-key counters, upstream errors.

    Key names are labels: they come only from the key file and the fixed
    static-token names, never from a request, so the label set stays bounded.
    The request counter and the duration histogram have a ``protocol``
    label: ``oip`` for the Open Inference Protocol's ``/v2`` routes,
    ``contract`` for everything else.
    """

    extra_labels = ("protocol",)
    duration_help = ("Duration of inference requests through the gateway in ms, its own 502 and 503 included "
                     "(job routes add no sample).")

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.key_requests = Counter(
            "service_gateway_key_requests",
            "Requests that authenticated, by key name (static tokens have fixed names).",
            ("key",),
            registry=registry,
        )
        self.key_rejections = Counter(
            "service_gateway_key_rejections",
            "Requests of a known key that were refused: reason rate_limited, in_flight (key_max_in_flight) or disabled.",
            ("key", "reason"),
            registry=registry,
        )
        self.auth_failures = Counter(
            "service_gateway_auth_failures",
            "Requests refused with 401: reason missing (no credential) or wrong (not one this route takes).",
            ("reason",),
            registry=registry,
        )
        self.upstream_errors = Counter(
            "service_gateway_upstream_errors",
            "Failed exchanges with model servers: kind unreachable (503, or tried on another replica), "
            "transport or timeout (502).",
            ("model", "replica", "kind"),
            registry=registry,
        )
        self.upstream_duration = Histogram(
            "service_gateway_upstream_duration_ms",
            "Time from forwarding a request to having the model server's whole reply, in ms.",
            ("model", "replica", "route"),
            buckets=MS_BUCKETS,
            registry=registry,
        )
        self.upstream_retries = Counter(
            "service_gateway_upstream_retries",
            "Requests sent to another replica because the first did not take them: reason refused (connection "
            "refused), not_admitted (503 status 65 with no results: loading, stopping or full) or busy (429: its "
            "wait or job queue full).",
            ("model", "reason"),
            registry=registry,
        )
        self.ratelimit_store_up = Gauge(
            "service_gateway_ratelimit_store_up",
            "1 while per-key rate limits are checked in the configured store (always, for local buckets); "
            "0 while Redis is unreachable and this gateway's local buckets stand in at each key's full rate.",
            registry=registry,
        )
        self.ratelimit_store_up.set(1)
        self.forwarded = Counter(
            "service_gateway_forwarded",
            "Job requests forwarded to the gateway of the host that owns the job, by peer host id and outcome: "
            "answered, or unreachable, timeout, transport (those three answered 404 job not found here), "
            "refused (the peer refused the cluster token: 502).",
            ("peer", "outcome"),
            registry=registry,
        )
