"""HTTP routes of asynchronous jobs on a model server (only when ``async_enabled``).

    POST /jobs                      202 {job_id, state, poll_url, result_url, ...} + Location
    GET  /jobs/{job}                200 status body
    GET  /jobs/{job}/wait?timeout=N 200 status body, when terminal or after N ms
    GET  /jobs/{job}/result         200 envelope (done), 409 otherwise

Choices beyond docs/contract.md, Jobs, documented in the OpenAPI document: the status
body also carries ``task_id``, ``model``, ``poll_url``, ``result_url`` and
``progress`` (``{"step", "steps"}`` of the batch running the job's items as
the model last reported it, at most 100 ms old; null when the model has
reported nothing);
error replies are the process-level envelope with ``error`` (plus ``job_id``
and ``state`` when a job is known); a full queue answers ``Retry-After`` =
the mean job duration divided by the workers, clamped to 1..60 s; ``wait``
takes N in milliseconds, default 30000: above 300000 it is clamped to
300000, 0 answers at once, anything but 1 to 18 ASCII digits (a sign, a
fraction, another script's digits, a longer number) is 422 (pointer
``/timeout``), by the rules of svc.contract.query.

The routes are declared once in the class body; the model server mounts
them (``ModelServerApp.enable_jobs``) only when jobs are enabled, and its
error handlers answer what these raise.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from klein import Klein
from twisted.internet.interfaces import IReactorTime

from svc.contract import status as st
from svc.contract.envelope import ModelIdentity, rejection
from svc.contract.errors import ApiError, FieldError
from svc.contract.jobs import DONE, FAILED, TIMEOUT
from svc.contract.protocol import JOB, JOB_RESULT, JOB_WAIT, JOBS, SERVICE_REQUEST_HEADERS, job_urls, klein_rule
from svc.contract.query import MAX_DIGITS, WAIT_MAX_MS, query_value, shown, wait_budget_ms
from svc.modelserver.jobs import AsyncQueueFull, Job, JobTable
from svc.web import declare
from svc.web.replies import content_type, dumps, envelope_headers, header, send_encoded, send_json


def parse_wait_timeout(raw: bytes | None) -> float:
    """The wait budget in seconds from ``?timeout=N`` (milliseconds); 422 for anything but a number.

    The rules are svc.contract.query's, shared with the gateway, which predicts this
    budget before forwarding a wait.
    """
    budget = wait_budget_ms(raw)
    if budget is None:
        raise ApiError(
            st.INVALID_REQUEST,
            f"timeout must be a whole number of milliseconds (0 answers at once; above {WAIT_MAX_MS} it is "
            f"{WAIT_MAX_MS})",
            [FieldError("/timeout", f"must be a non-negative integer (milliseconds, at most {MAX_DIGITS} "
                                    f"ASCII digits), got {shown(raw or b'')}")],
        )
    return budget / 1000.0


class JobRoutes:
    """The /jobs routes over one job table, with what they need of the server passed in.

    ``identity()``: the model's current identity (its version is known once
    loaded); ``task_id(request)``: the id of a request that names no job;
    ``authenticate(request)``: the server's bearer token and per-IP limit
    (raises ApiError); ``check_admitting()``: 503 while loading or stopping;
    ``draining()``: whether the server is stopping (a wait then answers at
    once); ``parse``: the server's request validation
    (svc.modelserver.inference.Inference.parse).  ``waiting`` counts the
    requests parked in a wait.
    """

    app = Klein()

    def __init__(
        self,
        jobs: JobTable,
        *,
        clock: IReactorTime,
        identity: Callable[[], ModelIdentity],
        task_id: Callable[[Any], str],
        authenticate: Callable[..., None],
        check_admitting: Callable[[], None],
        draining: Callable[[], bool],
        parse: Callable[..., Awaitable[Any]],
        headers: dict[str, str] | None = None,
    ) -> None:
        self.jobs = jobs
        self.clock = clock
        self.identity = identity
        self.task_id = task_id
        self.authenticate = authenticate
        self.check_admitting = check_admitting
        self.draining = draining
        self.parse = parse
        self.headers = dict(headers or {})  # on every reply about a job (X-Service-Weights)
        self.waiting = 0

    # -- bodies ------------------------------------------------------------------------

    def status_body(self, job: Job) -> dict:
        body = {
            "job_id": job.id,
            "state": job.state,
            "elapsed_ms": job.elapsed_ms(self.clock.seconds()),
            "task_id": job.task_id,
            "model": self.identity().to_json(),
            **job_urls(job.id),
            "progress": job.progress.to_json(),
        }
        if job.state in (FAILED, TIMEOUT):
            body["error"] = job.error
        return body

    def reply(self, request: Any, code: int, body: dict, job: Job, extra: dict[str, str] | None = None) -> bytes:
        return self.reply_encoded(request, code, dumps(body), job, extra)

    def reply_encoded(self, request: Any, code: int, body: bytes, job: Job, extra: dict[str, str] | None = None) -> bytes:
        """A reply about ``job`` whose body is already encoded (a done job's stored envelope)."""
        return send_encoded(request, code, body, {**envelope_headers(job.task_id), **self.headers, **(extra or {})})

    def job_error(self, request: Any, status: st.Status, message: str, job: Job | None = None, headers: dict | None = None,
                  task_id: str | None = None) -> bytes:
        """The envelope of a job route's refusal, named by ``job``'s task id, else ``task_id`` (a submit's valid
        ``req_id``), else a new one."""
        task_id = job.task_id if job is not None else task_id or self.task_id(request)
        body = rejection(status, message, task_id=task_id, model=self.identity())
        if job is not None:
            body["job_id"] = job.id
            body["state"] = job.state
        # As on every reply about a job (reply_encoded): the job routes' 409 and 429 too.
        return send_json(request, status.http, body, {**envelope_headers(task_id), **self.headers, **(headers or {})})

    def admit_submit(self, request: Any) -> None:
        """What a submission passes first: the server's credential and limit, then a model that admits work."""
        self.authenticate(request)
        self.check_admitting()

    def find(self, request: Any, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise ApiError(st.NOT_FOUND, f"job not found: {job_id[:80]}")
        request.service_task_id = job.task_id  # the access line's rid, also of a wait its client abandons (499)
        return job

    # -- routes ------------------------------------------------------------------------

    @declare.route(app, JOBS, methods=["POST"], name="jobs_submit", admit="admit_submit")
    async def submit(self, request: Any) -> bytes:
        media_type, type_params = content_type(request)
        headers = {name: header(request, name.encode()) for name in SERVICE_REQUEST_HEADERS}
        parsed = await self.parse(request.content.getvalue(), media_type, type_params, headers)
        try:
            job = self.jobs.submit(parsed)
        except AsyncQueueFull as e:  # named by its req_id, as its 422 and 413 are (it had a new id: a probe)
            return self.job_error(request, st.RATE_LIMITED, str(e), headers={"Retry-After": str(e.retry_after)},
                                  task_id=parsed.req_id)
        body: dict[str, Any] = {"job_id": job.id, "state": job.state, **job_urls(job.id), "task_id": job.task_id,
                "model": self.identity().to_json()}
        return self.reply(request, 202, body, job, {"Location": body["poll_url"]})

    @declare.route(app, klein_rule(JOB), methods=["GET"], name="jobs_status", admit="authenticate")
    def status(self, request: Any, job_id: str) -> bytes:
        job = self.find(request, job_id)
        return self.reply(request, 200, self.status_body(job), job)

    @declare.route(app, klein_rule(JOB_WAIT), methods=["GET"], name="jobs_wait", admit="authenticate")
    async def wait(self, request: Any, job_id: str) -> bytes:
        job = self.find(request, job_id)
        budget = parse_wait_timeout(query_value(request.uri, b"timeout"))
        if self.draining():
            budget = 0.0
        self.waiting += 1
        try:
            await self.jobs.wait(job, budget)
        finally:
            self.waiting -= 1
        return self.reply(request, 200, self.status_body(job), job)

    @declare.route(app, klein_rule(JOB_RESULT), methods=["GET"], name="jobs_result", admit="authenticate")
    def result(self, request: Any, job_id: str) -> bytes:
        job = self.find(request, job_id)
        if job.state != DONE:
            reason = f" ({job.error})" if job.error else ""
            return self.job_error(request, st.JOB_NOT_DONE, f"job is {job.state}: no result{reason}", job)
        assert job.result is not None  # a done job holds its result
        code, body = job.result
        return self.reply_encoded(request, code, body, job)
