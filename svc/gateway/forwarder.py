"""The gateway's forwarding policy: which replica gets a request, what is retried, where a job is.

:class:`~svc.gateway.app.GatewayApp` decides whether a request may pass
(authentication, the key's bucket, routing); a :class:`Forwarder` then takes
it to a model server and hands back its reply, beside
:class:`svc.gateway.balancer.Balancer`, which it asks for a replica.

A model may run as several replicas (svc.infra.replicas): inference and job
submissions go to the one the balancer picks, and are sent to a second one
only when the first did not take them: the connection was refused (nothing
was sent), or it answered 503 status 65 with no results (it admitted
nothing: loading, stopping, too many connections).  Nothing else is retried.
A job's poll, wait and result go to the replica its id names
(svc.gateway.owners, :meth:`Forwarder.to_job`), or to the gateway of the
host that holds it (svc.gateway.cluster).  The model's status, body and the
headers docs/contract.md lists pass through unchanged; job URLs are
rewritten onto ``/v1/models/<id>/jobs``.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from twisted.internet.defer import CancelledError
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web.http_headers import Headers

from svc.contract import protocol
from svc.contract import status as st
from svc.contract.errors import ApiError
from svc.contract.protocol import JOBS, model_path
from svc.gateway.balancer import Balancer
from svc.gateway.catalog import Replica, Upstream
from svc.gateway.cluster import Cluster
from svc.gateway.owners import OtherHost, locate, unreachable
from svc.gateway.proxy import (
    WAIT_MARGIN_S,
    LocalConnectFailed,
    Proxy,
    UpstreamFailed,
    UpstreamReply,
    UpstreamUnreachable,
    busy,
    not_admitted,
)
from svc.infra.metrics import GatewayMetrics
from svc.infra.ratelimit import retry_after_header
from svc.web.oip.replies import protocol_of
from svc.web.replies import connection_options, dumps

log = Logger()
#: How long a model whose job id this gateway could not find again gets its submits refused (not sent).
UNREACHABLE_S = 60.0

#: Client request headers passed to the model server; every other one is dropped.
FORWARDED_REQUEST_HEADERS = tuple(n.encode() for n in ("content-type", "content-encoding", "accept",
                                                       *protocol.SERVICE_REQUEST_HEADERS,
                                                       "inference-header-content-length"))
#: Model reply headers passed back (svc.contract.protocol); Location is rewritten.
PASSED_REPLY_HEADERS = tuple(n.encode() for n in protocol.PASSED_REPLY_HEADERS)


def job_not_found(job_id: str) -> ApiError:
    """The 404 of a job this gateway can tell is unknown, in the model servers' words."""
    return ApiError(st.NOT_FOUND, f"job not found: {job_id[:80]}")


class LabelCache:
    """The metrics' labelled children, kept: a ``labels()`` lookup costs about 1 us of the reactor (more on a busy
    one), a dict lookup 0.1; the gateway makes three or four per forwarded request.  Label values are route
    names, model ids, replicas and key names: a bounded set."""

    def __init__(self) -> None:
        self._children: dict[tuple, Any] = {}

    def __call__(self, metric: Any, *labels: str) -> Any:
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child


def rewrite_job_path(model_id: str, path: str) -> str | None:
    """A model-port job path as the gateway path of the same job (None: not a job path)."""
    if path.startswith(JOBS + "/"):
        return model_path(model_id, path)
    return None


class Forwarder:
    """Requests the gateway admitted, taken to a replica of their model, and its replies passed back."""

    def __init__(self, *, clock: IReactorTime, balancer: Balancer, proxy: Proxy, metrics: GatewayMetrics,
                 cluster: Cluster) -> None:
        self.clock = clock
        self.balancer = balancer
        self.proxy = proxy
        self.metrics = metrics
        self.cluster = cluster
        self.labelled = LabelCache()
        self._unreachable: dict[tuple[str, int], tuple[float, str]] = {}  # (model, replica) -> (until, why)

    async def forward(self, request: Any, upstream: Upstream, route: str, path: str, *, query: bytes = b"",
                      rewrite: bool = False, replica: Replica | None = None, budget_ms: int | None = None) -> bytes:
        """Send the request to ``replica``, or to the replica the balancer picks (:meth:`exchange`), and answer
        with its reply."""
        request.service_route = route
        headers = Headers()
        hop_by_hop = connection_options(request)
        for name in FORWARDED_REQUEST_HEADERS:
            if name in hop_by_hop:
                continue
            values = request.requestHeaders.getRawHeaders(name)
            if values:
                headers.setRawHeaders(name, values)
        body = request.content.getvalue() if request.method == b"POST" else None
        # A HEAD is asked upstream as the GET it stands for: its Content-Length must be the GET reply's as the
        # gateway sends it (a job's URLs rewritten), not 0; twisted.web sends no body for a HEAD.
        method = b"GET" if request.method == b"HEAD" else None
        started = self.clock.seconds()
        try:
            reply = await self.exchange(request, upstream, route, path, headers, body, query=query, replica=replica,
                                        method=method, timeout_s=self.wait_deadline_s(budget_ms))
        except CancelledError:
            raise  # the client went away (499): no reply went out, so no sample, as service_http_requests_total
        except BaseException:
            self._observe(request, route, started)  # the gateway's own 502 and 503 (a hung or dead model)
            raise
        self._observe(request, route, started)
        request.setResponseCode(reply.code)
        for name in PASSED_REPLY_HEADERS:
            values = reply.headers.getRawHeaders(name)
            if values:
                request.responseHeaders.setRawHeaders(name, values)
        location = reply.headers.getRawHeaders(b"location")
        if location:
            rewritten = rewrite_job_path(upstream.id, location[0].decode("latin-1"))
            if rewritten is not None:
                request.setHeader(b"Location", rewritten.encode("latin-1"))
        data = reply.body
        if rewrite and reply.code in (200, 202):
            data = self._rewrite_job_body(upstream.id, data)
        request.setHeader(b"Content-Length", str(len(data)).encode())
        return data

    def _observe(self, request: Any, route: str, started: float) -> None:
        """The duration sample of an inference request that got a reply, the gateway's own 502 and 503 included."""
        if route == "infer":
            self.labelled(self.metrics.duration, route, protocol_of(request)).observe(
                (self.clock.seconds() - started) * 1000.0)

    async def exchange(self, request: Any, upstream: Upstream, route: str, path: str, headers: Headers,
                       body: bytes | None, *, query: bytes = b"", replica: Replica | None = None,
                       method: bytes | None = None, timeout_s: float | None = None,
                       timeout_name: str | None = None, probe: bool = False) -> UpstreamReply:
        """The model's reply to ``body`` (a GET without one) sent to ``replica`` or to the replica the balancer picks.

        Picked (``replica`` None): the request counts as outstanding on its
        replica while it is out; a replica that refuses the connection or does
        not admit the request (:func:`not_admitted`) is marked not ready and
        the request goes to another replica not tried yet; so does one that
        answers 429 (:func:`busy`: its wait or job queue is full), without
        being marked.  With no replica left, a refusal is 503 status 65 and a
        not-admitted or busy reply is returned as it is, as with one process.
        Once a replica answered so, only ready replicas are tried, and the last
        such answer is the reply when none is left: a full replica's 429 beside
        a stopped one became 503 "not running", and beside a hung one a 502
        after ``upstream_recv_timeout_ms`` (a replicas probe).

        ``probe``: the question is whether the model runs (the readiness
        routes), so a model server not running or not answering is its
        answer, not a failed exchange: ``upstream_errors_total`` is not
        counted, nor a failure logged (a load balancer's probe of a stopped
        or hung model raised it every few seconds).
        """
        method = method or request.method
        submit = route == "jobs_submit" and replica is None
        tried: list[Replica] = self._blocked(upstream) if submit else []  # see _minted
        held: UpstreamReply | None = None  # a replica's busy or not-admitted answer, given when no other takes it
        several = replica is None and len(upstream.replicas) > 1
        while True:
            target = replica if replica is not None else self.balancer.pick(upstream, tried, held is not None)
            if target is None:  # only after a held answer: without one the last attempt ends the loop
                assert held is not None
                return held
            tried.append(target)
            more = several and len(tried) < len(upstream.replicas)
            reply = await self._exchange(method, upstream, target, route, path, query, headers, body,
                                         counted=replica is None, last=not more and held is None, timeout_s=timeout_s,
                                         timeout_name=timeout_name, probe=probe)
            if reply is None:
                self.metrics.upstream_retries.labels(upstream.id, "refused").inc()
                continue
            if submit and reply.code == 202 and self._minted(upstream, target, reply.body, last=not more):
                continue  # another replica takes the submit
            if several and not_admitted(reply):
                self._take_out(upstream, target, "did not admit a request (503 status 65)")
                if more:
                    self.metrics.upstream_retries.labels(upstream.id, "not_admitted").inc()
                    held = reply
                    continue
            if more and busy(reply):  # its queue is full; it stays up, another may have room
                self.metrics.upstream_retries.labels(upstream.id, "busy").inc()
                held = reply
                continue
            return reply

    def _take_out(self, upstream: Upstream, target: Replica, why: str) -> None:
        """Skip ``target`` until its probe says ready, with one line when it was in and has a probe (its model runs
        several replicas): the probe's "is ready" had no counterpart when a request took a replica out (a scaling
        probe)."""
        if len(upstream.replicas) > 1 and self.balancer.is_ready(target):
            log.info("{model} replica {index} (port {port}) is not ready: it {why}; skipped until its /ready answers "
                     "200", model=target.model, index=target.index, port=target.port, why=why)
        self.balancer.mark_down(target)

    async def _exchange(self, method: bytes, upstream: Upstream, target: Replica, route: str, path: str,
                        query: bytes, headers: Headers, body: bytes | None, *, counted: bool,
                        last: bool, timeout_s: float | None = None,
                        timeout_name: str | None = None, probe: bool = False) -> UpstreamReply | None:
        """One attempt on ``target``: its reply, None when it refused and another replica may be tried, or the
        gateway's own error (503 refused, 502 transport failure or timeout) as an ApiError."""
        attempt = headers.copy()
        if target.token:
            attempt.setRawHeaders(b"authorization", [b"Bearer " + target.token.encode("latin-1")])
        replica = str(target.index)
        if counted:
            self.balancer.started(target)
        started = self.clock.seconds()
        try:
            reply = await self.proxy.forward(method, target.url(path, query), attempt, body, timeout_s, timeout_name)
        except UpstreamUnreachable as e:
            self._take_out(upstream, target, "refused a connection")
            if not probe:
                self.metrics.upstream_errors.labels(upstream.id, replica, "unreachable").inc()
            if not last:
                return None
            what = (upstream.id if len(upstream.replicas) == 1 else f"{upstream.id} (no replica took the request)"
                    if counted else f"{upstream.id} replica {target.index}, which holds the job,")
            raise ApiError(st.NOT_READY, f"model server {what} is not reachable ({e}): it is not running") from None
        except LocalConnectFailed as e:
            self.metrics.upstream_errors.labels(upstream.id, replica, "local").inc()  # counted, not logged: a flood
            raise ApiError(st.NOT_READY, f"the gateway cannot open a connection to model server {upstream.id} now "
                                         f"({e}): it is out of file descriptors or local ports; try again",
                           headers={"Retry-After": "1"}) from None
        except UpstreamFailed as e:
            if not probe:  # a probe's failure (a hung replica, each time it is asked) is its answer: not ready
                self.metrics.upstream_errors.labels(upstream.id, replica, e.kind).inc()
                log.warn("{model} replica {replica}: upstream failure on {path}: {error}", model=upstream.id,
                         replica=replica, path=path, error=str(e))
            which = f" replica {target.index}" if len(upstream.replicas) > 1 else ""  # which one failed (a probe)
            raise ApiError(st.BAD_GATEWAY, f"model server {upstream.id}{which}: {e}") from None
        finally:
            if counted:
                self.balancer.finished(target)
        self.labelled(self.metrics.upstream_duration, upstream.id, replica, route).observe(
            (self.clock.seconds() - started) * 1000.0)
        if reply.code == 401:  # the credential refused is the gateway's own: passed on, it told a client its key was
            self.metrics.upstream_errors.labels(upstream.id, replica, "unauthorized").inc()  # wrong (config probe)
            log.error("{model} replica {replica} refused the gateway's token: is SERVICE_UPSTREAM_TOKENS right?",
                      model=upstream.id, replica=replica)
            raise ApiError(st.BAD_GATEWAY, f"model server {upstream.id} refused the gateway's own credential: its "
                                           "upstream token (SERVICE_UPSTREAM_TOKENS) is missing or wrong, which the "
                                           "operator must fix")
        return reply

    async def to_job(self, request: Any, upstream: Upstream, route: str, job_id: str, template: str, *,
                     query: bytes = b"", budget_ms: int | None = None, rewrite: bool = True) -> bytes:
        """A poll, wait or result, answered by the process that holds the job.

        The one place that decides where a job is (svc.gateway.owners): a
        replica of this host, another host's gateway (svc.gateway.cluster;
        ``budget_ms``, a wait's budget, lengthens its deadline), or 404 "job
        not found" (an id that does not verify, a replica that is gone).
        A model with jobs off is asked as it is: the contract passes its own
        404 through unchanged, whatever the id.  An id that verifies goes to
        its owner whatever this gateway read at its start: a model restarted
        with ``async_enabled`` turned on takes jobs before the gateway's next
        restart (an operator probe: its polls went to any replica, 404).
        """
        path = template.format(job_id=quote(job_id, safe=""))
        where = locate(upstream, job_id, secret=self.cluster.secret, host=self.cluster.host_id)
        if where is None and not upstream.async_enabled:
            return await self.forward(request, upstream, route, path, query=query, rewrite=rewrite)
        if isinstance(where, OtherHost):
            host = self.cluster.peer_for(request, job_id, where.host)
            return await self.cluster.forward(request, host, job_id, route, model_path(upstream.id, path), query,
                                              budget_ms)
        if where is None:
            self.cluster.unverified(job_id)
            raise job_not_found(job_id)
        return await self.forward(request, upstream, route, path, query=query, rewrite=rewrite, replica=where,
                                  budget_ms=budget_ms)

    def wait_deadline_s(self, budget_ms: int | None) -> float | None:
        """A job wait's upstream deadline: at least its budget plus :data:`WAIT_MARGIN_S` (None: the receive
        timeout, for every other request)."""
        if budget_ms is None:
            return None
        return max(self.proxy.recv_timeout_s, budget_ms / 1000.0 + WAIT_MARGIN_S)

    def check_job(self, upstream: Upstream, job_id: str) -> None:
        """404 "job not found" now for an id that no process of this service made (it does not verify, or names
        a replica that is gone), before any other check of the request: so it is 404 whatever else it asks."""
        if locate(upstream, job_id, secret=self.cluster.secret, host=self.cluster.host_id) is None:
            self.cluster.unverified(job_id)
            raise job_not_found(job_id)

    def _minted(self, upstream: Upstream, target: Replica, data: bytes, *, last: bool) -> bool:
        """Whether ``target``'s 202 carries a job id this gateway would not find again (every poll of it would be
        404 "job not found": a model server started by hand with another ``SERVICE_JOB_SECRET``, host id or
        ``SERVICE_REPLICA`` than the gateway knows); then another replica is tried, or, ``last``, the submit is a
        502.  The job runs there and nothing can cancel it, so for :data:`UNREACHABLE_S` that replica gets no
        submit: clients retrying the 502 do not fill its job queue, and the others take the submits."""
        try:
            job_id = json.loads(data).get("job_id")
        except (ValueError, AttributeError):
            return False
        why = isinstance(job_id, str) and unreachable(upstream, job_id, secret=self.cluster.secret,
                                                        host=self.cluster.host_id, made_by=target)
        if not why:
            return False
        which = f" replica {target.index}" if len(upstream.replicas) > 1 else ""
        log.error("model server {model}{which} made job id {job_id}, which this gateway would not find again: {why}; "
                  "it gets no submit for {s:g} s", model=upstream.id, which=which, job_id=job_id[:80], why=why,
                  s=UNREACHABLE_S)
        self._unreachable[(upstream.id, target.index)] = (self.clock.seconds() + UNREACHABLE_S, why)
        if last:
            raise ApiError(st.BAD_GATEWAY, f"model server {upstream.id}{which} makes job ids this gateway would not "
                                           f"find again ({why}): the job runs there, but cannot be polled")
        return True

    def _blocked(self, upstream: Upstream) -> list[Replica]:
        """The replicas of ``upstream`` that get no submit now (:meth:`_minted`); a 502 when that is every one."""
        now = self.clock.seconds()
        blocked = [r for r in upstream.replicas if self._unreachable.get((upstream.id, r.index), (0.0, ""))[0] > now]
        if len(blocked) == len(upstream.replicas):
            until, why = max(self._unreachable[(upstream.id, r.index)] for r in blocked)
            raise ApiError(st.BAD_GATEWAY, f"model server {upstream.id} makes job ids this gateway would not find "
                                           f"again ({why}): not sent", headers={"Retry-After": retry_after_header(until - now)})
        return blocked

    @staticmethod
    def _rewrite_job_body(model_id: str, data: bytes) -> bytes:
        """``poll_url`` and ``result_url`` of a job body onto the gateway prefix."""
        try:
            body = json.loads(data)
        except ValueError:
            return data
        if not isinstance(body, dict):
            return data
        for field in ("poll_url", "result_url"):
            value = body.get(field)
            if isinstance(value, str):
                rewritten = rewrite_job_path(model_id, value)
                if rewritten is None:
                    body.pop(field)  # never hand out a model-port path
                else:
                    body[field] = rewritten
        return dumps(body)
