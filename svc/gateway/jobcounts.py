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
waits longer than that.

The sum is a counter, so it never goes down.  A model server's counters
start from zero when it restarts; summed as read, its replica's share
would drop, and with several replicas Prometheus's ``rate()`` reads a
partial drop as a reset of the whole sum and counts it all again.  So the
gateway counts across a restart: per replica it keeps the last reading,
and adds what each counter rose by since; a reading from another process
(its ``process_start_time_seconds`` changed) is a new process, whose whole
reading is its increase.  Without a start time (a platform where
prometheus_client reports none) a reading where any state is lower than
before (or gone, as a restarted server has no line for a state it has not
counted yet) is taken for a new process, as Prometheus takes a reset; a
restarted server that passed its old figures between two scrapes was then
seen as risen, and the jobs up to its old figures were lost (a probe: 4
jobs after a restart counted 3).  The gateway's value is the replicas'
first readings plus every increase since, from this gateway's start.  Two scrapes of the
gateway at once (Prometheus and the supervisor) ask each replica twice, on
two connections, and the answers may come back in either order: an answer
older than one already read is dropped, since read as a reading it would
look lower, like a restart, and count the whole reading again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from prometheus_client.core import CounterMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IReactorTime
from twisted.web.client import readBody
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent

from svc.contract.jobs import COUNTED
from svc.contract.protocol import METRICS_PATH
from svc.gateway.catalog import Catalog, Replica
from svc.web.site import SUPERVISOR_USER_AGENT

#: The sample read from each model server, and the name of the gateway's sum.
SAMPLE = "service_async_jobs_total"
#: The states a model server counts (svc.infra.metrics), in its order.
STATES = COUNTED
#: The start of the model server's process (prometheus_client's process collector, in every registry of ours).
STARTED = "process_start_time_seconds"


class Reading(NamedTuple):
    """A model server's answer: its process's start time (None where it reports none) and ``state -> count``."""

    started: float | None
    counts: dict[str, float]


def reading_of(text: str) -> Reading:
    """``service_async_jobs_total`` by state, and ``process_start_time_seconds``, of a model server's metrics."""
    counts: dict[str, float] = {}
    started = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == SAMPLE and "state" in sample.labels:
                counts[sample.labels["state"]] = sample.value
            elif sample.name == STARTED:
                started = sample.value
    return Reading(started, counts)


def increase(last: Reading | None, reading: Reading) -> dict[str, float]:
    """``state -> rise`` of a replica's counters from its ``last`` reading to ``reading``.

    Another process (its start time changed; where there is none, any state
    lower than before) counted from zero: everything it counted is new, its
    whole reading.  The first reading is new too.
    """
    before, now = (last.counts, reading.counts) if last is not None else ({}, reading.counts)
    if last is None or (last.started is not None and reading.started is not None and last.started != reading.started) \
            or any(now.get(state, 0.0) < value for state, value in before.items()):
        return dict(now)
    return {state: value - before.get(state, 0.0) for state, value in now.items()}


class JobCounts:
    """A Prometheus collector of the gateway's registry: the job counters of the models behind it."""

    def __init__(self, *, clock: IReactorTime, agent: IAgent, catalog: Catalog, timeout_s: float = 1.0) -> None:
        self.clock = clock
        self.agent = agent
        self.timeout_s = timeout_s
        self.replicas = [r for up in catalog if up.async_enabled for r in up.replicas]
        #: Each replica's last reading, to tell a rise from a restart.
        self.last: dict[tuple[str, int], Reading] = {}
        #: Each replica's ``state -> total``: its first reading plus every rise since (:func:`increase`).
        self.counted: dict[tuple[str, int], dict[str, float]] = {}
        #: Per replica: the number of the last request sent, and of the one whose answer was read last.
        self.sent: dict[tuple[str, int], int] = {}
        self.read: dict[tuple[str, int], int] = {}

    def refresh(self) -> Deferred:
        """Ask every replica once; fires (never fails) when each answered or ran out of time."""
        return DeferredList([self._scrape(r) for r in self.replicas], consumeErrors=True)

    def _scrape(self, replica: Replica) -> Deferred:
        headers = {b"user-agent": [SUPERVISOR_USER_AGENT.encode()]}
        if replica.token:
            headers[b"authorization"] = [b"Bearer " + replica.token.encode()]
        number = self.sent[replica.key] = self.sent.get(replica.key, 0) + 1
        d: Deferred[Any] = self.agent.request(b"GET", replica.url(METRICS_PATH), Headers(headers), None)
        d.addCallback(lambda response: readBody(response).addCallback(lambda body: (response.code, body)))
        d.addTimeout(self.timeout_s, self.clock)
        d.addCallback(self._read, replica, number)
        d.addErrback(lambda _: None)  # not answered in time, refused, cut: its last figures stay
        return d

    def _read(self, answer: tuple[int, bytes], replica: Replica, number: int) -> None:
        code, body = answer
        if code == 200 and number > self.read.get(replica.key, 0):  # else older than a reading already counted
            self.read[replica.key] = number
            self.add(replica.key, reading_of(body.decode("utf-8", "replace")))

    def add(self, key: tuple[str, int], reading: Reading) -> None:
        """Count replica ``key``'s rise since its last reading, and keep ``reading`` as its last."""
        counted = self.counted.setdefault(key, {})
        for state, rise in increase(self.last.get(key), reading).items():
            counted[state] = counted.get(state, 0.0) + rise
        self.last[key] = reading

    def describe(self) -> list:
        return [CounterMetricFamily(SAMPLE.removesuffix("_total"), "", labels=["model", "state"])]

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            SAMPLE.removesuffix("_total"),
            "Jobs of each model behind the gateway by state, summed over its replicas: the model servers' own "
            "service_async_jobs_total, read at this scrape; a model server's restart lowers nothing.",
            labels=["model", "state"])
        totals: dict[tuple[str, str], float] = {}
        for replica in self.replicas:
            counts = self.counted.get(replica.key)
            if counts is None:
                continue
            for state in STATES:
                key = (replica.model, state)
                totals[key] = totals.get(key, 0.0) + counts.get(state, 0.0)
        for (model, state), value in totals.items():
            family.add_metric([model, state], value)
        yield family
