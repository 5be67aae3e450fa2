"""Live figures of every child for the web UI's charts, from the children's own ``/metrics``.

An operator would rather look at a chart than read Prometheus text, and the
supervisor already knows every child's port and credential: every
``interval`` seconds (5) it scrapes the gateway's ``/metrics`` (with
``SERVICE_METRICS_TOKEN`` from its environment) and every running model
server's (with the ``SERVICE_AUTH_TOKEN`` it generated for it), turns the
counters into rates against the previous scrape, and keeps the last
``window`` seconds (600, so at most 120 samples per child) in a bounded ring.

Scrapes run on the reactor (the supervisor's treq client, one deadline per
scrape) and never block it.  A scrape that fails, or a child that is not
running, leaves a gap: a sample whose figures are all null.  The first sample
after a gap (or after a counter went backwards: the child restarted) has
gauges but null rates, since a rate needs two scrapes of the same process.

The text is parsed with prometheus_client's parser; nothing is added to the
children, which export these series anyway (svc.infra.metrics).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from svc.contract.protocol import METRICS_PATH
from svc.infra.reactors import wall_time

log = Logger()

INTERVAL_S = 5.0
WINDOW_S = 600.0

#: Routes of a model server whose requests are work asked for: synchronous inference and job submissions
#: (not probes, scrapes, job polls or waits).
TRAFFIC = frozenset({"infer", "jobs_submit"})
#: The histograms of a model's latency chart: synchronous requests, and jobs from submission to their end.
LATENCY = ("service_http_request_duration_ms", "service_async_job_duration_ms")

#: Figures of a model server, in the order the UI draws them.
MODEL_FIGURES = ("rps", "p50_ms", "p99_ms", "batch_mean", "queue_depth", "jobs_pending", "jobs_running")

#: Labelled figures of the gateway (each a {label: [values]} map) and its plain ones.
GATEWAY_LABELLED = ("rps_by_route", "rejections_by_reason")
GATEWAY_FIGURES = ("upstream_errors",)

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse(text: str) -> Samples:
    """Prometheus text to ``{sample name: [(labels, value)]}`` (``_total``, ``_bucket`` ... kept in the name)."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


def total(samples: Samples, name: str, keep: Callable[[dict[str, str]], bool] = lambda labels: True) -> float | None:
    """The sum of ``name``'s samples whose labels ``keep`` accepts; None when the series is absent."""
    if name not in samples:
        return None
    return sum(value for labels, value in samples[name] if keep(labels))


def by_label(samples: Samples, name: str, label: str, skip: Iterable[str] = ()) -> dict[str, float]:
    """``name`` summed per value of ``label`` (values in ``skip`` left out)."""
    out: dict[str, float] = {}
    skipped = set(skip)
    for labels, value in samples.get(name, []):
        key = labels.get(label, "")
        if key not in skipped:
            out[key] = out.get(key, 0.0) + value
    return out


def buckets(samples: Samples, *names: str) -> dict[float, float]:
    """Cumulative histogram buckets ``{le: count}`` of one or more histograms with the same bounds, summed."""
    out: dict[float, float] = {}
    for name in names:
        for labels, value in samples.get(f"{name}_bucket", []):
            le = float(labels["le"])
            out[le] = out.get(le, 0.0) + value
    return out


def quantile(q: float, cumulative: dict[float, float]) -> float | None:
    """Prometheus' ``histogram_quantile``: linear within the bucket that holds rank ``q``; None when empty.

    A rank in the ``+Inf`` bucket gives the highest finite bound (as Prometheus does).
    """
    bounds = sorted(cumulative)
    if not bounds or cumulative[bounds[-1]] <= 0:
        return None
    rank = q * cumulative[bounds[-1]]
    lower, below = 0.0, 0.0
    for le in bounds:
        count = cumulative[le]
        if count >= rank:
            if le == float("inf"):
                return lower
            if count == below:
                return le
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return lower


def _delta(now: float | None, before: float | None) -> float | None:
    """A counter's increase; None when unknown or when it went backwards (the process restarted)."""
    if now is None or before is None or now < before:
        return None
    return now - before


@dataclass
class _Raw:
    """What one scrape gave, kept until the next one to make rates."""

    at: float
    counters: dict[str, float | None]
    labelled: dict[str, dict[str, float]] = field(default_factory=dict)
    histogram: dict[float, float] = field(default_factory=dict)
    latency_sum: float = 0.0  # the histograms' _sum: what the window's observations add up to


def model_raw(samples: Samples, at: float) -> _Raw:
    """The counters and histogram of a model server's scrape."""
    return _Raw(
        at=at,
        counters={
            # A labelled counter has no sample before its first increment: absent is zero.
            "requests": total(samples, "service_http_requests_total",
                              lambda labels: labels.get("route") in TRAFFIC) or 0.0,
            "batch_sum": total(samples, "service_batch_size_sum"),
            "batch_count": total(samples, "service_batch_size_count"),
            "queue_depth": total(samples, "service_queue_depth"),
            "async_depth": total(samples, "service_async_queue_depth"),
            "async_running": total(samples, "service_async_running_jobs"),
        },
        # Inference latency as a client sees it: synchronous requests, and jobs from submission to their end.
        histogram=buckets(samples, *LATENCY),
        latency_sum=sum(total(samples, f"{name}_sum") or 0.0 for name in LATENCY),
    )


def model_figures(now: _Raw, before: _Raw | None) -> dict[str, float | None]:
    """One sample of a model's figures: rates over the time since ``before``, gauges as they are."""
    c = now.counters
    figures: dict[str, float | None] = {name: None for name in MODEL_FIGURES}
    figures["queue_depth"] = c["queue_depth"]
    if c["async_depth"] is not None:
        running = c["async_running"] or 0.0
        figures["jobs_running"] = running
        figures["jobs_pending"] = max(0.0, c["async_depth"] - running)
    if before is None or now.at <= before.at:
        return figures
    dt = now.at - before.at
    requests = _delta(c["requests"], before.counters["requests"])
    if requests is None:
        return figures  # restarted: no rate from two different processes
    figures["rps"] = requests / dt
    batches = _delta(c["batch_count"], before.counters["batch_count"])
    items = _delta(c["batch_sum"], before.counters["batch_sum"])
    if batches and items is not None:
        figures["batch_mean"] = items / batches
    window = {le: count - before.histogram.get(le, 0.0) for le, count in now.histogram.items()}
    if window and all(v >= 0 for v in window.values()):
        figures["p50_ms"] = quantile(0.5, window)
        figures["p99_ms"] = quantile(0.99, window)
        if one_bucket(window):
            # The buckets cannot tell values within one bucket apart, and interpolating put a lone 13.8 s job
            # at 20 s (the middle of 10-30 s): the window's mean, exact for one observation, says more.
            figures["p50_ms"] = figures["p99_ms"] = (now.latency_sum - before.latency_sum) / window[max(window)]
    return figures


def one_bucket(cumulative: dict[float, float]) -> bool:
    """True when every observation of a non-empty cumulative histogram lies in a single bucket."""
    bounds = sorted(cumulative)
    if not bounds or cumulative[bounds[-1]] <= 0:
        return False
    counts = [cumulative[le] - (cumulative[bounds[i - 1]] if i else 0.0) for i, le in enumerate(bounds)]
    return sum(1 for c in counts if c > 0) == 1


#: The gateway's routes that the supervisor itself calls (its scrape and its probe): not traffic.
SUPERVISOR_ROUTES = ("metrics", "healthz")


def gateway_raw(samples: Samples, at: float) -> _Raw:
    """The per-route, per-reason and upstream-error counters of the gateway's scrape.

    Per route, not per key: the contract keeps the key list and the keys' usage off the supervisor (the
    gateway's access log and ``/metrics`` have them).
    """
    reasons = by_label(samples, "service_gateway_key_rejections_total", "reason")
    for reason, value in by_label(samples, "service_gateway_auth_failures_total", "reason").items():
        reasons[reason] = reasons.get(reason, 0.0) + value
    return _Raw(
        at=at,
        counters={"upstream_errors": total(samples, "service_gateway_upstream_errors_total") or 0.0},
        labelled={
            "rps_by_route": by_label(samples, "service_http_requests_total", "route", skip=SUPERVISOR_ROUTES),
            "rejections_by_reason": reasons,
        },
    )


def gateway_figures(now: _Raw, before: _Raw | None) -> dict[str, Any]:
    """One sample of the gateway's figures: per-second rates (labelled ones as ``{label: rate}``)."""
    figures: dict[str, Any] = {"upstream_errors": None, "rps_by_route": {}, "rejections_by_reason": {}}
    if before is None or now.at <= before.at:
        return figures
    dt = now.at - before.at
    errors = _delta(now.counters["upstream_errors"], before.counters["upstream_errors"])
    if errors is None:
        return figures
    rates: dict[str, dict[str, float]] = {}
    for name in GATEWAY_LABELLED:
        if not before.labelled[name].keys() <= now.labelled[name].keys():
            return figures  # a series the gateway had is gone: it restarted, and the rate is unknown
        rates[name] = {}
        for label, value in now.labelled[name].items():
            d = _delta(value, before.labelled[name].get(label, 0.0))
            if d is None:
                return figures  # went backwards: a restart, not "no traffic"
            rates[name][label] = d / dt
    figures["upstream_errors"] = errors / dt
    figures.update(rates)
    return figures


class _Ring:
    """One child's samples: ``(time, figures)`` newest last, bounded, plus the last scrape for rates."""

    def __init__(self, size: int) -> None:
        self.samples: deque[tuple[float, dict[str, Any] | None]] = deque(maxlen=size)
        self.last: _Raw | None = None
        self.info: dict[str, str] = {}


class SeriesCollector:
    """Scrapes every child on a timer and keeps their recent figures.

    ``fetch(port, path, token) -> Deferred[bytes | None]`` is the
    supervisor's client (svc.supervisor.probe.HttpProbe.fetch); ``tokens``
    maps a child's name to the Bearer its ``/metrics`` needs.
    """

    def __init__(self, *, reactor: IReactorTime, children: Callable[[], dict[str, Any]],
                 tokens: Callable[[str], str | None], fetch: Callable[[int, str, str | None], Deferred],
                 gateway: str, interval: float = INTERVAL_S, window: float = WINDOW_S) -> None:
        self.reactor = reactor
        self.children = children
        self.tokens = tokens
        self.fetch = fetch
        self.gateway = gateway
        self.interval = interval
        self.window = window
        self.size = max(2, int(window / interval))
        self.rings: dict[str, _Ring] = {}
        self._loop: LoopingCall | None = None
        self._in_flight: Deferred | None = None

    def start(self) -> None:
        """Scrape now and every ``interval`` seconds (reactor time)."""
        self._loop = LoopingCall(self.tick)
        self._loop.clock = self.reactor
        self._loop.start(self.interval, now=True)

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()

    def tick(self) -> Deferred | None:
        """One round of scrapes, all started at once; every child gets one sample (a gap if it failed).

        A round that is still running when the next is due (every scrape has
        the client's deadline, shorter than the interval) is not doubled.
        """
        if self._in_flight is not None:
            return None
        at = self.reactor.seconds()
        rounds = []
        for name, child in self.children().items():
            ring = self.rings.setdefault(name, _Ring(self.size))
            if child.snapshot()["state"] != "running":
                self._record(name, ring, at, None)
                continue
            d = self.fetch(child.spec.port, METRICS_PATH, self.tokens(name))
            d.addCallback(self._scraped, name, ring, at)
            d.addErrback(self._failed, name, ring, at)
            rounds.append(d)
        self._in_flight = DeferredList(rounds, consumeErrors=True)
        self._in_flight.addBoth(self._round_done)
        return self._in_flight

    def _round_done(self, result: Any) -> Any:
        self._in_flight = None
        return result

    def _scraped(self, body: bytes | None, name: str, ring: _Ring, at: float) -> None:
        if body is None:
            self._record(name, ring, at, None)
            return
        try:
            samples = parse(body.decode("utf-8", "replace"))
        except Exception as e:  # noqa: BLE001 - a garbled scrape is a gap, not a crash of the supervisor
            log.debug("{name}: unreadable /metrics: {error}", name=name, error=e)
            self._record(name, ring, at, None)
            return
        self._record(name, ring, at, samples)

    def _failed(self, failure: Any, name: str, ring: _Ring, at: float) -> None:
        log.debug("{name}: scrape failed: {error}", name=name, error=failure.getErrorMessage())
        self._record(name, ring, at, None)

    def _record(self, name: str, ring: _Ring, at: float, samples: Samples | None) -> None:
        if samples is None:
            ring.last = None
            ring.samples.append((at, None))
            return
        if name == self.gateway:
            raw = gateway_raw(samples, at)
            figures = gateway_figures(raw, ring.last)
        else:
            raw = model_raw(samples, at)
            figures = model_figures(raw, ring.last)
            info = [labels for labels, _ in samples.get("service_model_info", [])]
            if info:
                ring.info = {k: info[0][k] for k in ("version", "device", "optimize") if k in info[0]}
        ring.last = raw
        ring.samples.append((at, figures))

    # -- views ------------------------------------------------------------------------------

    def view(self) -> dict[str, Any]:
        """Every child's series, column-wise (see :meth:`child_view`)."""
        shift = self.shift()  # one for the whole view: a clock stepped meanwhile moves none of it apart
        return {
            "interval_s": self.interval,
            "window_s": self.window,
            "now": self.now(shift),
            "gateway": self.child_view(self.gateway, shift),
            "servers": {name: self.child_view(name, shift) for name in self.rings if name != self.gateway},
        }

    def shift(self) -> float:
        """What turns the process's clock into a date: samples are taken on its monotonic clock (a clock step
        neither stops the scrapes nor bends the rates) and shown as dates, all by the same shift."""
        return wall_time(self.reactor, 0.0)

    def now(self, shift: float) -> float:
        """The time of a view made with ``shift``, in seconds since the epoch as its ``t`` are."""
        return round(self.reactor.seconds() + shift, 3)

    def mode_of(self, name: str) -> str | None:
        """Child ``name``'s execution mode at its last good scrape (None before one, or while it loaded)."""
        mode = (self.rings[name].info if name in self.rings else {}).get("optimize")
        return mode if mode != "loading" else None

    def child_view(self, name: str, shift: float) -> dict[str, Any]:
        """``{t: [...], <figure>: [...]}``, one column per figure, null where a sample is a gap.

        Model servers also say ``version``, ``device`` and ``optimize`` (the
        execution mode; from ``service_model_info``, null before the first good
        scrape); the
        gateway's labelled figures are ``{label: [...]}``, one column per label
        seen in the window.
        """
        ring = self.rings.get(name) or _Ring(self.size)
        times = [round(at + shift, 3) for at, _ in ring.samples]
        rows = [figures for _, figures in ring.samples]
        if name == self.gateway:
            out: dict[str, Any] = {"t": times}
            for figure in GATEWAY_FIGURES:
                out[figure] = [_round(row[figure]) if row else None for row in rows]
            for figure in GATEWAY_LABELLED:
                labels = sorted({label for row in rows if row for label in row[figure]})
                # A sample with rates has every label: 0 where the label had no traffic.
                out[figure] = {label: [_round(row[figure].get(label, 0.0)) if row and row["upstream_errors"] is not None
                                       else None for row in rows] for label in labels}
            return out
        out = {"t": times, **{k: ring.info.get(k) for k in ("version", "device", "optimize")}}
        for figure in MODEL_FIGURES:
            out[figure] = [_round(row[figure]) if row else None for row in rows]
        return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
