"""The access log: one line per real request; the supervisor's probes and scrapes only at debug level."""

from __future__ import annotations

import pytest
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.task import Clock
from twisted.logger import LogLevel, capturedLogs, formatEvent
from twisted.web.resource import Resource
from twisted.web.test.requesthelper import DummyRequest

from svc.web.httplimits import HttpLimits
from svc.web.site import (
    BALANCER_USER_AGENT,
    QUICKSTART_USER_AGENT,
    SUPERVISOR_USER_AGENT,
    JsonSite,
    is_supervisor_probe,
    loggable_path,
)


def request(path: bytes, *, method: bytes = b"GET", agent: str | None = SUPERVISOR_USER_AGENT,
            host: str = "127.0.0.1") -> DummyRequest:
    req = DummyRequest(path.lstrip(b"/").split(b"/"))
    req.method, req.path, req.uri, req.code = method, path, path, 200
    req.client = IPv6Address("TCP", host, 5000) if ":" in host else IPv4Address("TCP", host, 5000)
    if agent is not None:
        req.requestHeaders.setRawHeaders(b"user-agent", [agent])
    return req


def site() -> JsonSite:
    return JsonSite(Resource(), max_body_bytes=1024, oversize_reply=lambda r: (413, {}, b""),
                    busy_reply=lambda: (503, {}, b""), limits=HttpLimits(), reactor=Clock())


@pytest.mark.parametrize("path", [b"/ready", b"/healthz", b"/metrics"])
def test_the_supervisors_probes_are_logged_at_debug_level(path):
    with capturedLogs() as events:
        site().log(request(path))
    assert [(e["log_level"], e["path"]) for e in events] == [(LogLevel.debug, path.decode())]


@pytest.mark.parametrize(
    "req",
    [
        request(b"/ready", agent=None),  # a person's curl, or another monitor
        request(b"/ready", agent="curl/8.5.0"),
        request(b"/ready", host="10.1.2.3"),  # not from loopback: not the supervisor
        request(b"/mobilenetv2/predict", method=b"POST"),  # a real request never hides behind the User-Agent
        request(b"/jobs/job_1", ),
        request(b"/ready", method=b"POST"),
    ],
    ids=["no-agent", "curl", "remote", "infer", "jobs", "post"],
)
def test_every_other_request_gets_its_info_line(req):
    assert not is_supervisor_probe(req)
    with capturedLogs() as events:
        site().log(req)
    assert [e["log_level"] for e in events] == [LogLevel.info]


@pytest.mark.parametrize("path, agent, code, level", [
    (b"/metrics", SUPERVISOR_USER_AGENT, 401, LogLevel.info),  # a wrong metrics token, guessed behind the agent
    (b"/api/v1/status", QUICKSTART_USER_AGENT, 401, LogLevel.info),  # a wrong management token
    (b"/api/v1/status", QUICKSTART_USER_AGENT, 404, LogLevel.info),  # the gateway's: no such route (a valid token)
    (b"/ready", SUPERVISOR_USER_AGENT, 503, LogLevel.debug),  # a model loading: still the probe
    (b"/ready", SUPERVISOR_USER_AGENT, 499, LogLevel.debug),  # a probe given up at its timeout (a hung model)
])
def test_a_refused_request_is_never_hidden_behind_a_probes_user_agent(path, agent, code, level):
    """A security probe: any loopback client (every remote one behind a TLS proxy on the host) could send the
    supervisor's or the quick start's User-Agent and guess tokens on the probe paths with no line in any log."""
    req = request(path, agent=agent)
    req.code = code
    with capturedLogs() as events:
        site().log(req)
    assert [e["log_level"] for e in events] == [level]


@pytest.mark.parametrize("path, method, agent, code, level", [
    (b"/healthz", b"GET", BALANCER_USER_AGENT, 200, LogLevel.debug),  # deploy/haproxy.cfg's check, every second
    (b"/healthz", b"GET", BALANCER_USER_AGENT, 503, LogLevel.info),  # a gateway stopping: worth a line
    (b"/healthz", b"GET", "curl/8.5.0", 200, LogLevel.info),  # a person, or a monitor of its own
    (b"/ready", b"GET", BALANCER_USER_AGENT, 200, LogLevel.info),  # the check's path only
    (b"/v1/models/M/infer", b"POST", BALANCER_USER_AGENT, 200, LogLevel.info),  # never a request
])
def test_a_balancers_health_check_from_any_address_is_logged_at_debug(path, method, agent, code, level):
    """HAProxy's check of each gateway was an info line a second per balancer (a scaling probe)."""
    req = request(path, method=method, agent=agent, host="10.0.0.20")
    req.code = code
    with capturedLogs() as events:
        site().log(req)
    assert [e["log_level"] for e in events] == [level]


def test_the_ipv6_loopback_counts_as_loopback():
    assert is_supervisor_probe(request(b"/healthz", host="::1"))


def test_the_quick_starts_status_poll_is_logged_at_debug_level_and_nothing_else_of_it():
    """The once-a-second poll was 438 of the 581 lines of a first start's terminal."""
    with capturedLogs() as events:
        site().log(request(b"/api/v1/status", agent=QUICKSTART_USER_AGENT))
    assert [e["log_level"] for e in events] == [LogLevel.debug]
    assert not is_supervisor_probe(request(b"/api/v1/status"))  # the supervisor's agent polls no status
    assert not is_supervisor_probe(request(b"/ready", agent=QUICKSTART_USER_AGENT))
    assert not is_supervisor_probe(request(b"/api/v1/status", agent=QUICKSTART_USER_AGENT, host="10.1.2.3"))
    assert not is_supervisor_probe(request(b"/api/v1/servers/X/restart", method=b"POST", agent=QUICKSTART_USER_AGENT))


def ui_read(path: bytes, *, method: bytes = b"GET", code: int = 200, value: bytes = b"ui") -> DummyRequest:
    req = request(path, method=method, agent="Mozilla/5.0", host="10.1.2.3")  # a browser anywhere
    req.code = code
    req.requestHeaders.setRawHeaders(b"x-service-poll", [value])
    return req


def test_the_web_uis_timed_reads_are_logged_at_debug_level_and_its_actions_and_errors_at_info():
    """With a UI tab open, its status, log and series reads were a line every second or so in the supervisor's
    output (the quick start's terminal)."""
    for path in (b"/api/v1/status", b"/api/v1/series", b"/api/v1/servers/X/logs?offset=3"):
        with capturedLogs() as events:
            site().log(ui_read(path.split(b"?")[0]))
        assert [e["log_level"] for e in events] == [LogLevel.debug], path
    for req in (ui_read(b"/api/v1/servers/X/restart", method=b"POST"),  # an action is never hidden
                ui_read(b"/api/v1/status", code=401),  # a refused token is seen
                ui_read(b"/api/v1/status", code=500),
                ui_read(b"/v1/models/X/infer"),  # not the management API
                ui_read(b"/api/v1/status", value=b"yes"),
                request(b"/api/v1/status", agent="Mozilla/5.0")):  # a read without the header
        with capturedLogs() as events:
            site().log(req)
        assert [e["log_level"] for e in events] == [LogLevel.info], req.path


def test_the_line_reads_method_path_code_duration_key_and_request_id_and_keeps_the_fields():
    """The line is rendered once by JsonSite.log_line; braces in a path are text, not a format."""
    with capturedLogs() as events:
        site().log_line(b"POST", b"/jobs/{job}%7B\xff", 202, 1.25, "job_1", "tenant-{a}")
        site().log_line(b"GET", b"/x" * 200, 404, 0.04, None, "-")
    assert [formatEvent(e) for e in events] == [
        "POST /jobs/{job}%7B\xff 202 1.2ms key=tenant-{a} rid=job_1",
        f"GET {'/x' * 150} 404 0.0ms key=- rid=-",  # the path cut at 300 characters
    ]
    assert {k: events[0][k] for k in ("method", "path", "code", "duration_ms", "key", "request_id")} == {
        "method": "POST", "path": "/jobs/{job}%7B\xff", "code": 202, "duration_ms": 1.25, "key": "tenant-{a}",
        "request_id": "job_1"}


@pytest.mark.parametrize(("path", "logged"), [
    ("/v1/models/M/infer?api_key=SECRET&top_k=3", "/v1/models/M/infer?api_key=REDACTED&top_k=3"),
    # the "=" percent-encoded: a lenient server or proxy reads a parameter there too, so the line must not keep it
    ("/v1/models/M/infer?api_key%3DSECRETB3", "/v1/models/M/infer?api_key%3DREDACTED"),
    ("/v1/models/M/infer?top_k%3d3&token%3dSECRET", "/v1/models/M/infer?top_k%3d3&token%3dREDACTED"),
    ("/v1/models/M/infer?top_k=3", "/v1/models/M/infer?top_k=3"),
    # A security probe: the value ran only to a "?" or "#", and what followed was written whole.
    ("/openapi.json?access_token=abc?def&sig=xyz", "/openapi.json?access_token=REDACTED&sig=REDACTED"),
    ("/openapi.json?x=1#token=S4", "/openapi.json?x=1#token=REDACTED"),
    ("/openapi.json?x=1?token=S5&y=2", "/openapi.json?x=1?token=REDACTED&y=2"),
    ("/a;token=S6;b=1", "/a;token=REDACTED;b=1"),
    ("/healthz;api_key=S7?x=1&token=S8?9", "/healthz;api_key=REDACTED?x=1&token=REDACTED"),  # a path parameter
])
def test_a_credential_like_parameter_is_redacted_whatever_its_equals_sign(path, logged):
    assert loggable_path(path) == logged


def test_control_characters_of_a_method_or_path_are_written_escaped():
    """A DEL in the path (twisted parses it; an ESC it refuses with a 400) was written as the raw byte, a C1 CSI
    too, and a request line too long, never parsed, logged its ESC or CR: what a terminal shows of the line
    changed.  Each is ``\\xNN`` now; other latin-1 text (``\\xff``) stays as it was."""
    with capturedLogs() as events:
        site().log_line(b"GET", b"/x\x7fy\x9b31m\xff", 404, 0.5, None, "-")
        site().log_line(b"G\x1bT", b"/a\x1b[2J\r\nb\x00", 414, 0.5, None, "-")
    assert [formatEvent(e) for e in events] == ["GET /x\\x7fy\\x9b31m\xff 404 0.5ms key=- rid=-",
                                                "G\\x1bT /a\\x1b[2J\\x0d\\x0ab\\x00 414 0.5ms key=- rid=-"]
    assert (events[0]["path"], events[1]["method"]) == ("/x\\x7fy\\x9b31m\xff", "G\\x1bT")
