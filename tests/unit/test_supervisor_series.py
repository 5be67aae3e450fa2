"""The supervisor's series collector on a fake clock, fed the real metrics text of svc.infra.metrics' registries."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock

from svc.infra.metrics import GatewayMetrics, ModelServerMetrics, render
from svc.supervisor.series import SeriesCollector, parse, quantile
from svc.supervisor.series import buckets as histogram_buckets

GATEWAY = "__gateway"


class FakeChild:
    def __init__(self, port: int, state: str = "running") -> None:
        self.spec = SimpleNamespace(port=port)
        self.state = state

    def snapshot(self) -> dict:
        return {"state": self.state}


class Stage:
    """Children with real registries, and a fetch that answers from them (or fails, or hangs)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry

        self.model_registry = CollectorRegistry()
        self.model = ModelServerMetrics(self.model_registry, "M")
        self.model.info.labels("M", "random-init-seed0", "cpu", "0", "openvino").set(1)
        self.gateway_registry = CollectorRegistry()
        self.gateway = GatewayMetrics(self.gateway_registry)
        self.children = {GATEWAY: FakeChild(8080), "M": FakeChild(9001)}
        self.calls: list[tuple[int, str, str | None]] = []
        self.broken: set[int] = set()
        self.hanging: Deferred | None = None

    def fetch(self, port: int, path: str, token: str | None) -> Deferred:
        self.calls.append((port, path, token))
        if self.hanging is not None:
            return self.hanging
        if port in self.broken:
            return succeed(None)  # the client's answer to a refused connection, a timeout, a non-200
        registry = self.gateway_registry if port == 8080 else self.model_registry
        return succeed(render(registry))

    def collector(self, clock: Clock) -> SeriesCollector:
        tokens = {GATEWAY: "metrics-token", "M": "model-token"}
        return SeriesCollector(reactor=clock, children=lambda: self.children, tokens=tokens.get, fetch=self.fetch,
                               gateway=GATEWAY, interval=5.0, window=600.0)


def model_traffic(stage: Stage, requests: int, latency_ms: float, batches: list[int]) -> None:
    for _ in range(requests):
        stage.model.requests.labels("infer", "POST", "200").inc()
        stage.model.duration.labels("infer").observe(latency_ms)
    for size in batches:
        stage.model.batch_size.observe(size)
    for _ in range(50):  # probes, scrapes and job polls: not traffic
        stage.model.requests.labels("ready", "GET", "200").inc()
        stage.model.requests.labels("metrics", "GET", "200").inc()
        stage.model.requests.labels("jobs_wait", "GET", "200").inc()


def test_rates_quantiles_and_gauges_of_a_model_every_interval():
    clock, stage = Clock(), Stage()
    collector = stage.collector(clock)
    collector.start()  # the first round at once
    assert stage.calls == [(8080, "/metrics", "metrics-token"), (9001, "/metrics", "model-token")]
    model_traffic(stage, requests=10, latency_ms=30.0, batches=[2, 4, 4])
    stage.model.queue_depth.set(3)
    clock.advance(5)
    view = collector.view()["servers"]["M"]
    assert view["t"] == [0.0, 5.0]
    assert (view["version"], view["device"], view["optimize"]) == ("random-init-seed0", "cpu", "openvino")
    # The first sample has no rate (one scrape), the second: 10 requests in 5 s, all in the (25, 50] bucket:
    # their mean, not a point interpolated in the bucket (37.5 and 49.75 then).
    assert view["rps"] == [None, 2.0]
    assert view["p50_ms"] == [None, 30.0]
    assert view["p99_ms"] == [None, 30.0]
    assert view["batch_mean"] == [None, round(10 / 3, 4)]
    assert view["queue_depth"] == [0.0, 3.0]
    assert view["jobs_pending"] == [0.0, 0.0] and view["jobs_running"] == [0.0, 0.0]
    clock.advance(5)  # no traffic: zero rate, no latency, no batch
    view = collector.view()["servers"]["M"]
    assert view["rps"][-1] == 0.0 and view["p50_ms"][-1] is None and view["batch_mean"][-1] is None


def test_jobs_pending_and_running_come_from_the_async_gauges():
    clock, stage = Clock(), Stage()
    collector = stage.collector(clock)
    collector.start()
    for _ in range(5):
        stage.model.requests.labels("jobs_submit", "POST", "202").inc()
    stage.model.requests.labels("jobs_submit", "POST", "429").inc()  # refused, but asked for: traffic too
    stage.model.async_depth.set(5)
    stage.model.async_running.set(2)
    for _ in range(4):
        stage.model.async_duration.observe(700.0)  # jobs count in the latency too: (500, 1000]
    clock.advance(5)
    view = collector.view()["servers"]["M"]
    assert view["jobs_pending"][-1] == 3.0 and view["jobs_running"][-1] == 2.0
    assert view["rps"][-1] == 6 / 5
    assert view["p50_ms"][-1] == 700.0


def test_a_lone_13_8_s_job_is_charted_at_13_8_s_not_20():
    """One job of 13.8 s fell in the (10 s, 30 s] bucket, and interpolating put its p50 at 20 s and its p99 at
    29.8 s; with every observation of the window in one bucket the chart shows their mean."""
    clock, stage = Clock(), Stage()
    collector = stage.collector(clock)
    collector.start()
    stage.model.requests.labels("jobs_submit", "POST", "202").inc()
    stage.model.async_duration.observe(13_800.0)
    clock.advance(5)
    view = collector.view()["servers"]["M"]
    assert (view["p50_ms"][-1], view["p99_ms"][-1]) == (13_800.0, 13_800.0)
    # Spread over buckets, the quantiles interpolate as Prometheus does.
    stage.model.duration.labels("infer").observe(30.0)
    stage.model.async_duration.observe(13_800.0)
    clock.advance(5)
    view = collector.view()["servers"]["M"]
    assert view["p50_ms"][-1] == 50.0 and view["p99_ms"][-1] == 29_600.0


def test_a_failed_scrape_is_a_gap_and_the_next_rate_waits_for_two_good_scrapes():
    clock, stage = Clock(), Stage()
    collector = stage.collector(clock)
    collector.start()
    stage.broken.add(9001)
    clock.advance(5)
    stage.broken.clear()
    clock.advance(5)
    model_traffic(stage, requests=5, latency_ms=3.0, batches=[1])
    clock.advance(5)
    view = collector.view()["servers"]["M"]
    assert view["t"] == [0.0, 5.0, 10.0, 15.0]
    assert view["queue_depth"] == [0.0, None, 0.0, 0.0]
    assert view["rps"] == [None, None, None, 1.0]
    assert collector.view()["gateway"]["upstream_errors"] == [None, 0.0, 0.0, 0.0]  # the gateway was fine


def test_an_error_from_the_client_is_a_gap_too():
    clock, stage = Clock(), Stage()
    stage.fetch = lambda port, path, token: fail(ConnectionRefusedError())  # type: ignore[method-assign]
    collector = stage.collector(clock)
    collector.start()
    assert collector.view()["servers"]["M"]["rps"] == [None]
    assert collector.view()["servers"]["M"]["queue_depth"] == [None]


def test_a_counter_that_went_back_gives_no_rate():
    clock, stage = Clock(), Stage()
    collector = stage.collector(clock)
    model_traffic(stage, requests=10, latency_ms=3.0, batches=[])
    collector.start()
    stage.__init__()  # type: ignore[misc]  # the model server restarted: its counters start from zero
    collector.fetch = stage.fetch
    model_traffic(stage, requests=2, latency_ms=3.0, batches=[])
    clock.advance(5)
    model_traffic(stage, requests=5, latency_ms=3.0, batches=[])
    clock.advance(5)
    assert collector.view()["servers"]["M"]["rps"] == [None, None, 1.0]


def test_a_child_that_is_not_running_is_not_scraped_and_leaves_a_gap():
    clock, stage = Clock(), Stage()
    stage.children["M"].state = "stopped"
    collector = stage.collector(clock)
    collector.start()
    assert stage.calls == [(8080, "/metrics", "metrics-token")]
    assert collector.view()["servers"]["M"]["queue_depth"] == [None]


def test_the_ring_keeps_ten_minutes():
    clock, stage = Clock(), Stage()
    collector = stage.collector(clock)
    collector.start()
    clock.pump([5.0] * 150)
    view = collector.view()["servers"]["M"]
    assert len(view["t"]) == 120
    assert view["t"][0] == 155.0 and view["t"][-1] == 750.0


def test_a_round_still_in_flight_is_not_doubled():
    clock, stage = Clock(), Stage()
    stage.hanging = Deferred()
    collector = stage.collector(clock)
    collector.start()
    clock.advance(5)
    assert len(stage.calls) == 2  # one per child, the second round skipped
    stage.hanging.callback(None)
    clock.advance(5)
    assert len(stage.calls) == 4
    collector.stop()
    clock.advance(5)
    assert len(stage.calls) == 4


def test_gateway_rates_by_route_rejections_by_reason_and_upstream_errors():
    """Per route, never per key: the contract keeps the key list and the keys' usage off the supervisor."""
    clock, stage = Clock(), Stage()
    collector = stage.collector(clock)
    stage.gateway.requests.labels("infer", "POST", "200", "contract").inc(3)
    collector.start()
    stage.gateway.requests.labels("infer", "POST", "200", "contract").inc(6)
    stage.gateway.requests.labels("infer", "POST", "429", "contract").inc(4)
    stage.gateway.requests.labels("jobs_submit", "POST", "202", "contract").inc(5)
    stage.gateway.requests.labels("metrics", "GET", "200", "contract").inc(1)  # the supervisor's own scrape
    stage.gateway.requests.labels("healthz", "GET", "200", "contract").inc(1)  # and its probe
    stage.gateway.key_requests.labels("tenant-a").inc(10)
    stage.gateway.key_rejections.labels("tenant-a", "rate_limited").inc(20)
    stage.gateway.auth_failures.labels("wrong").inc(5)
    stage.gateway.upstream_errors.labels("M", "0", "unreachable").inc(2)
    stage.gateway.upstream_errors.labels("M", "1", "transport").inc(3)
    clock.advance(5)
    clock.advance(5)
    view = collector.view()["gateway"]
    assert view["t"] == [0.0, 5.0, 10.0]
    assert view["rps_by_route"] == {"infer": [None, 2.0, 0.0], "jobs_submit": [None, 1.0, 0.0]}
    assert "tenant-a" not in json.dumps(collector.view())
    assert view["rejections_by_reason"] == {"rate_limited": [None, 4.0, 0.0], "wrong": [None, 1.0, 0.0]}
    assert view["upstream_errors"] == [None, 1.0, 0.0]


def test_a_gateway_restart_is_a_gap_not_zero_traffic():
    """A restart resets the gateway's counters while its upstream_errors stay 0: the rates of that interval are
    unknown (null), not 0 req/s; the next interval has rates again, rounded as the other figures."""
    from prometheus_client import CollectorRegistry

    clock, stage = Clock(), Stage()
    collector = stage.collector(clock)
    stage.gateway.requests.labels("infer", "POST", "200", "contract").inc(100)
    collector.start()
    stage.gateway.requests.labels("infer", "POST", "200", "contract").inc(50)
    clock.advance(5)
    stage.gateway_registry = CollectorRegistry()  # the gateway restarted: its counters start again
    stage.gateway = GatewayMetrics(stage.gateway_registry)
    stage.gateway.requests.labels("infer", "POST", "200", "contract").inc(20)
    clock.advance(5)
    stage.gateway.requests.labels("infer", "POST", "200", "contract").inc(31)
    clock.advance(5)
    view = collector.view()["gateway"]
    assert view["rps_by_route"]["infer"] == [None, 10.0, None, 6.2]
    assert view["upstream_errors"] == [None, 0.0, None, 0.0]


def test_a_series_gone_after_a_restart_is_a_gap_too():
    from prometheus_client import CollectorRegistry

    clock, stage = Clock(), Stage()
    collector = stage.collector(clock)
    stage.gateway.requests.labels("infer", "POST", "200", "contract").inc(5)
    stage.gateway.requests.labels("jobs_submit", "POST", "202", "contract").inc(5)
    collector.start()
    clock.advance(5)
    stage.gateway_registry = CollectorRegistry()
    stage.gateway = GatewayMetrics(stage.gateway_registry)
    stage.gateway.requests.labels("infer", "POST", "200", "contract").inc(30)  # above 5: no counter went back
    clock.advance(5)
    view = collector.view()["gateway"]
    assert view["rps_by_route"] == {"infer": [None, 0.0, None], "jobs_submit": [None, 0.0, None]}


def test_one_child_view_and_the_interval():
    clock, stage = Clock(), Stage()
    collector = stage.collector(clock)
    collector.start()
    view = collector.view()
    assert (view["interval_s"], view["window_s"], view["now"]) == (5.0, 600.0, 0.0)
    assert collector.child_view("unknown", 0.0) == {"t": [], "version": None, "device": None, "optimize": None,
                                               "rps": [], "p50_ms": [],
                                               "p99_ms": [], "batch_mean": [], "queue_depth": [], "jobs_pending": [],
                                               "jobs_running": []}


@pytest.mark.parametrize(("q", "expected"), [(0.5, 12.5), (0.9, 35.0), (0.25, 6.25), (1.0, 50.0)])
def test_quantile_interpolates_within_the_bucket_as_prometheus_does(q, expected):
    # 4 samples <= 10, 4 in (10, 20], 2 in (20, 50]; none above.
    assert quantile(q, {10.0: 4, 20.0: 8, 50.0: 10, float("inf"): 10}) == expected


def test_quantile_in_the_overflow_bucket_is_the_highest_bound_and_empty_is_none():
    assert quantile(0.99, {10.0: 1, float("inf"): 10}) == 10.0
    assert quantile(0.5, {10.0: 0, float("inf"): 0}) is None
    assert quantile(0.5, {}) is None


def test_parse_reads_prometheus_text():
    text = ('# TYPE service_batch_size histogram\nservice_batch_size_bucket{le="1.0"} 2.0\n'
            'service_batch_size_bucket{le="+Inf"} 3.0\nservice_batch_size_sum 7.0\nservice_batch_size_count 3.0\n')
    samples = parse(text)
    assert samples["service_batch_size_sum"] == [({}, 7.0)]
    assert histogram_buckets(samples, "service_batch_size") == {1.0: 2.0, float("inf"): 3.0}
