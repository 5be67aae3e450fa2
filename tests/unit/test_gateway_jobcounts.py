"""The gateway's job counters of the models behind it (svc.gateway.jobcounts) on a Clock and a fake agent."""

from __future__ import annotations

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from svc.gateway.catalog import Catalog, Replica, Upstream
from svc.gateway.jobcounts import JobCounts, Reading, increase, reading_of
from svc.infra.metrics import new_registry, render


def model_text(submitted: int, done: int, started: float | None = None) -> bytes:
    """A model server's metrics text; ``started``: its process_start_time_seconds line (absent: None)."""
    process = (f"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {started}\n"
               if started is not None else "")
    return (f'{process}# TYPE service_async_jobs_total counter\n'
            f'service_async_jobs_total{{state="submitted"}} {submitted}.0\n'
            f'service_async_jobs_total{{state="running"}} {submitted}.0\n'
            f'service_async_jobs_total{{state="done"}} {done}.0\n').encode()


class Response:
    def __init__(self, code: int, body: bytes) -> None:
        self.code, self.body, self.phrase = code, body, b"OK"

    def deliverBody(self, protocol):  # noqa: N802 (twisted's name)
        from twisted.python.failure import Failure
        from twisted.web.client import ResponseDone

        protocol.dataReceived(self.body)
        protocol.connectionLost(Failure(ResponseDone()))


class Agent:
    """Answers per port: a body, or never (a Deferred left pending)."""

    def __init__(self) -> None:
        self.bodies: dict[int, bytes | None] = {}
        self.asked: list[tuple[bytes, dict]] = []

    def request(self, method, uri, headers, body):
        self.asked.append((uri, dict(headers.getAllRawHeaders())))
        port = int(uri.split(b":")[2].split(b"/")[0])
        answer = self.bodies.get(port)
        return Deferred() if answer is None else succeed(Response(200, answer))


def catalog() -> Catalog:
    jobs = Upstream("GEN", 9001, "/gen/predict", True, "t0",
                    replicas=(Replica("GEN", 0, 9001, "t0"), Replica("GEN", 1, 9002, "t1")))
    sync = Upstream("CLS", 9003, "/cls/predict", False, "t3")
    return Catalog([jobs, sync])


def test_replicas_are_summed_per_model_and_a_silent_one_keeps_its_last_figures():
    clock, agent = Clock(), Agent()
    counts = JobCounts(clock=clock, agent=agent, catalog=catalog(), timeout_s=1.0)
    registry = new_registry()
    registry.register(counts)
    agent.bodies = {9001: model_text(3, 2), 9002: model_text(4, 4)}
    fired = []
    counts.refresh().addCallback(fired.append)
    assert fired  # both answered at once
    assert {uri for uri, _ in agent.asked} == {b"http://127.0.0.1:9001/metrics", b"http://127.0.0.1:9002/metrics"}
    assert all(h[b"Authorization"][0] in (b"Bearer t0", b"Bearer t1") for _, h in agent.asked)  # not CLS: no jobs
    text = render(registry).decode()
    assert 'service_async_jobs_total{model="GEN",state="submitted"} 7.0' in text
    assert 'service_async_jobs_total{model="GEN",state="done"} 6.0' in text
    assert 'service_async_jobs_total{model="GEN",state="failed"} 0.0' in text
    assert 'model="CLS"' not in text
    # Replica 1 stops answering: the scrape ends after timeout_s, with its last figures.
    agent.bodies = {9001: model_text(5, 5), 9002: None}
    fired = []
    counts.refresh().addCallback(fired.append)
    assert not fired
    clock.advance(1.0)
    assert fired
    assert 'service_async_jobs_total{model="GEN",state="submitted"} 9.0' in render(registry).decode()


def test_a_reading_is_the_model_servers_counter_and_its_process_start():
    assert reading_of(model_text(2, 1).decode()) == Reading(None, {"submitted": 2.0, "running": 2.0, "done": 1.0})
    assert reading_of(model_text(2, 1, 1700000000.5).decode()).started == 1700000000.5


def test_a_restarted_replica_never_lowers_the_sum_and_its_new_jobs_are_counted():
    """A model server's counters start again at 0 when it restarts (kill -9): the gateway's counter goes on rising."""
    clock, agent = Clock(), Agent()
    counts = JobCounts(clock=clock, agent=agent, catalog=catalog(), timeout_s=1.0)
    registry = new_registry()
    registry.register(counts)
    seen = []

    def scrape(r0: bytes | None, r1: bytes | None) -> tuple[float | None, float | None]:
        agent.bodies = {9001: r0, 9002: r1}
        counts.refresh()
        clock.advance(1.0)  # a replica left silent keeps its figures
        value = lambda state: registry.get_sample_value(  # noqa: E731
            "service_async_jobs_total", {"model": "GEN", "state": state})
        seen.append(value("submitted"))
        return value("submitted"), value("done")

    assert scrape(model_text(3, 2), model_text(4, 4)) == (7.0, 6.0)  # the first readings
    assert scrape(model_text(5, 3), model_text(6, 4)) == (11.0, 7.0)  # both rose: 2 + 2, 1 + 0
    assert scrape(model_text(5, 3), b"") == (11.0, 7.0)  # replica 1 restarted, nothing counted yet: not 5, 3
    assert scrape(None, model_text(1, 0)) == (12.0, 7.0)  # its first job after the restart
    assert scrape(model_text(2, 1), model_text(1, 1)) == (14.0, 9.0)  # replica 0 restarted and ran 2 between scrapes
    assert scrape(model_text(4, 1), model_text(1, 1)) == (16.0, 9.0)
    assert seen == sorted(seen)


def test_increase_is_the_rise_or_after_any_lower_state_the_whole_reading():
    def r(counts: dict, started: float | None = None) -> Reading:
        return Reading(started, counts)

    assert increase(None, r({"submitted": 3.0})) == {"submitted": 3.0}
    assert increase(r({"submitted": 3.0, "done": 1.0}), r({"submitted": 5.0, "done": 1.0, "failed": 1.0})) == {
        "submitted": 2.0, "done": 0.0, "failed": 1.0}
    # submitted passed its old figure, but done went down: the process is new, all of its counts are.
    assert increase(r({"submitted": 3.0, "done": 2.0}), r({"submitted": 4.0, "done": 1.0})) == {
        "submitted": 4.0, "done": 1.0}
    assert increase(r({"submitted": 3.0, "done": 2.0}), r({"submitted": 4.0})) == {"submitted": 4.0}  # done: 0
    # With start times: the same process rose; another one, however high its figures, counts whole.
    assert increase(r({"submitted": 1.0}, 100.0), r({"submitted": 4.0}, 100.0)) == {"submitted": 3.0}
    assert increase(r({"submitted": 1.0}, 100.0), r({"submitted": 4.0}, 160.0)) == {"submitted": 4.0}


def test_a_replica_restarted_past_its_old_figures_between_two_scrapes_counts_every_new_job():
    """A probe: a model restarted, 1 job, a scrape; restarted again, 4 jobs, a scrape: the gateway's sum rose by 3,
    its model server's own counter said 4. The new process's start time tells it from a rise."""
    clock, agent = Clock(), Agent()
    gen = Upstream("GEN", 9001, "/gen/predict", True, "t0", replicas=(Replica("GEN", 0, 9001, "t0"),))
    counts = JobCounts(clock=clock, agent=agent, catalog=Catalog([gen]), timeout_s=1.0)
    registry = new_registry()
    registry.register(counts)
    value = lambda: registry.get_sample_value(  # noqa: E731
        "service_async_jobs_total", {"model": "GEN", "state": "submitted"})
    agent.bodies = {9001: model_text(1, 1, started=1000.0)}
    counts.refresh()
    assert value() == 1.0
    agent.bodies = {9001: model_text(4, 4, started=1060.0)}  # restarted: 4 jobs of the new process
    counts.refresh()
    assert value() == 5.0
    agent.bodies = {9001: model_text(6, 6, started=1060.0)}  # the same process: 2 more
    counts.refresh()
    assert value() == 7.0


def test_an_answer_older_than_one_already_read_is_dropped():
    """Two scrapes of the gateway at once ask each replica twice; the older answer may come back last. Read, it
    would look lower than the newer one, like a restart, and count the whole reading again."""
    clock, agent = Clock(), Agent()
    gen = Upstream("GEN", 9001, "/gen/predict", True, "t0", replicas=(Replica("GEN", 0, 9001, "t0"),))
    counts = JobCounts(clock=clock, agent=agent, catalog=Catalog([gen]), timeout_s=1.0)
    registry = new_registry()
    registry.register(counts)
    pending: list[Deferred] = []
    agent.request = lambda method, uri, headers, body: pending.append(Deferred()) or pending[-1]  # answered below
    counts.refresh()
    counts.refresh()
    pending[1].callback(Response(200, model_text(10, 8)))  # the newer answer first
    pending[0].callback(Response(200, model_text(9, 7)))  # then the older one
    value = lambda state: registry.get_sample_value(  # noqa: E731
        "service_async_jobs_total", {"model": "GEN", "state": state})
    assert (value("submitted"), value("done")) == (10.0, 8.0)  # not 19 and 15
    agent.request = lambda method, uri, headers, body: succeed(Response(200, model_text(11, 9)))
    counts.refresh()
    assert (value("submitted"), value("done")) == (11.0, 9.0)
