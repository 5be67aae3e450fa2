"""``service_async_jobs_total{model, state}`` on the gateway's ``/metrics``: the model servers' own job counters.

Aggregated, not counted here: the gateway sees a job's submit, but a job
runs and ends inside its model server whether or not a client ever asks
again, so only the model server knows how many reached ``running``,
``done``, ``failed`` or ``timeout``.  At each scrape of the gateway's
``/metrics`` this asks every replica of every model whose jobs are enabled
for its own ``/metrics`` (its upstream token, the supervisor's probe
User-Agent so the model's access log keeps it at debug level), reads its
``service_async_jobs_total{state}`` and sums the replicas of each model.
Each replica gets ``timeout_s``; one that does not answer in time (loading,
stopped, stopped by SIGSTOP) keeps its last figures, so the scrape never
waits longer than that.  A model server's counters start from zero when it
restarts, and so does its share of the sum (Prometheus reads a drop as a
counter reset).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IReactorTime
from twisted.web.client import readBody
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent

from svc.contract.protocol import METRICS_PATH
from svc.gateway.catalog import Catalog, Replica
from svc.web.site import SUPERVISOR_USER_AGENT

#: The sample read from each model server, and the name of the gateway's sum.
SAMPLE = "service_async_jobs_total"
#: The states a model server counts (svc.infra.metrics), in its order.
STATES = ("submitted", "running", "done", "failed", "timeout")


def job_counts(text: str) -> dict[str, float]:
    """``state -> count`` of ``service_async_jobs_total`` in a model server's metrics text."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == SAMPLE and "state" in sample.labels:
                counts[sample.labels["state"]] = sample.value
    return counts


class JobCounts:
    """A Prometheus collector of the gateway's registry: the job counters of the models behind it."""

    def __init__(self, *, clock: IReactorTime, agent: IAgent, catalog: Catalog, timeout_s: float = 1.0) -> None:
        self.clock = clock
        self.agent = agent
        self.timeout_s = timeout_s
        self.replicas = [r for up in catalog if up.async_enabled for r in up.replicas]
        self.last: dict[tuple[str, int], dict[str, float]] = {}

    def refresh(self) -> Deferred:
        """Ask every replica once; fires (never fails) when each answered or ran out of time."""
        return DeferredList([self._scrape(r) for r in self.replicas], consumeErrors=True)

    def _scrape(self, replica: Replica) -> Deferred:
        headers = {b"user-agent": [SUPERVISOR_USER_AGENT.encode()]}
        if replica.token:
            headers[b"authorization"] = [b"Bearer " + replica.token.encode()]
        d: Deferred[Any] = self.agent.request(b"GET", replica.url(METRICS_PATH), Headers(headers), None)
        d.addCallback(lambda response: readBody(response).addCallback(lambda body: (response.code, body)))
        d.addTimeout(self.timeout_s, self.clock)
        d.addCallback(self._read, replica)
        d.addErrback(lambda _: None)  # not answered in time, refused, cut: its last figures stay
        return d

    def _read(self, answer: tuple[int, bytes], replica: Replica) -> None:
        code, body = answer
        if code == 200:
            self.last[replica.key] = job_counts(body.decode("utf-8", "replace"))

    def describe(self) -> list:
        return [CounterMetricFamily(SAMPLE.removesuffix("_total"), "", labels=["model", "state"])]

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            SAMPLE.removesuffix("_total"),
            "Jobs of each model behind the gateway by state, summed over its replicas: the model servers' own "
            "service_async_jobs_total, read at this scrape.", labels=["model", "state"])
        totals: dict[tuple[str, str], float] = {}
        for replica in self.replicas:
            counts = self.last.get(replica.key)
            if counts is None:
                continue
            for state in STATES:
                key = (replica.model, state)
                totals[key] = totals.get(key, 0.0) + counts.get(state, 0.0)
        for (model, state), value in totals.items():
            family.add_metric([model, state], value)
        yield family
