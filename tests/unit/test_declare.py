"""svc/web/declare.py: a route names itself before its caller is admitted, and the admission runs before its body."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from twisted.internet.defer import Deferred, ensureDeferred

from svc.contract import status as st
from svc.contract.errors import ApiError
from svc.web.declare import guarded


class App:
    """What a route method sees of its app: the admission methods a declaration names."""

    def __init__(self) -> None:
        self.admitted: list[dict] = []
        self.ran: list[str] = []
        self.later: Deferred | None = None

    def admit(self, request: Any, **route_args: Any) -> None:
        self.admitted.append(route_args)
        if request.refuse:
            raise ApiError(st.UNAUTHORIZED, "no credential")

    def admit_later(self, request: Any, **route_args: Any) -> Deferred:
        self.admitted.append(route_args)
        self.later = Deferred()
        return self.later

    @guarded("jobs_status", admit="admit")
    def status(self, request: Any, job_id: str) -> bytes:
        self.ran.append(job_id)
        return b"ok"

    @guarded("healthz")
    def open_route(self, request: Any) -> bytes:
        self.ran.append("open")
        return b"ok"

    @guarded("jobs_submit", admit="admit_later")
    async def submit(self, request: Any, model_id: str) -> bytes:
        self.ran.append(model_id)
        return b"accepted"

    @guarded("wrong", admit="admit_later")
    def sync_with_later_admission(self, request: Any) -> bytes:
        return b"never"


def request(refuse: bool = False) -> SimpleNamespace:
    return SimpleNamespace(refuse=refuse)


def test_the_route_is_named_and_its_caller_admitted_with_the_route_arguments_before_its_body():
    app, req = App(), request()
    assert app.status(req, job_id="job_1") == b"ok"
    assert req.service_route == "jobs_status" and app.admitted == [{"job_id": "job_1"}] and app.ran == ["job_1"]


def test_a_refused_caller_is_counted_under_the_route_and_the_body_never_runs():
    app, req = App(), request(refuse=True)
    with pytest.raises(ApiError) as refused:
        app.status(req, job_id="job_1")
    assert refused.value.status is st.UNAUTHORIZED
    assert req.service_route == "jobs_status" and app.ran == []


def test_an_open_route_is_named_and_admits_everyone():
    app, req = App(), request(refuse=True)
    assert app.open_route(req) == b"ok" and req.service_route == "healthz" and app.admitted == []


def test_a_coroutine_route_waits_for_an_admission_that_answers_later():
    app, req = App(), request()
    done = ensureDeferred(app.submit(req, model_id="M"))
    assert req.service_route == "jobs_submit" and app.admitted == [{"model_id": "M"}] and app.ran == []
    assert not done.called
    app.later.callback(None)
    assert app.ran == ["M"] and done.result == b"accepted"


def test_a_plain_route_whose_admission_answers_later_is_a_programming_error():
    app = App()
    with pytest.raises(TypeError, match="route wrong: admit_later answers later, so the route must be a coroutine"):
        app.sync_with_later_admission(request())
