"""The site of every process's listener: the limits of svc.web.limits and one access-log line per request.

:class:`JsonSite` replaces twisted's access log with one structured line
per request.  The supervisor's own polling (its readiness probe every 2 s and
its metrics scrape every 5 s, :func:`is_supervisor_probe`) is logged at debug
level, below the default level of every process, so a model's log holds the
requests people made rather than 90 % probes; the probes are still counted
in ``service_http_requests_total`` (routes ``ready``, ``healthz``, ``metrics``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Protocol, Self
from urllib.parse import unquote

from twisted.internet import reactor as _default_reactor
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web import server

from svc.contract.errors import ApiError
from svc.contract.request import REQ_ID_RE
from svc.web.bodylimits import CLIENT_CLOSED, LimitedRequest
from svc.web.httplimits import HttpLimits
from svc.web.idle import IdleConnections
from svc.web.limits import LimitedChannel
from svc.web.replies import dumps

#: The User-Agent of the supervisor's readiness probe and metrics scrape (svc.supervisor.probe).
SUPERVISOR_USER_AGENT = "service-supervisor-probe"

#: The only paths the supervisor polls; anything else is a real request, whatever its User-Agent.
PROBE_PATHS = frozenset({b"/healthz", b"/ready", b"/metrics"})

#: The quick start's once-a-second poll of the supervisor's status (svc.cli.quickstart): its access-log lines
#: were most of the first start's terminal, so they are written at debug level too.
QUICKSTART_USER_AGENT = "service-quickstart-poll"
QUICKSTART_PATHS = frozenset({b"/api/v1/status"})

#: The User-Agent of a load balancer's health check of a gateway (deploy/haproxy.cfg sends it): a ``GET /healthz``
#: every second from each balancer was a line a second in the gateway's log.  From any address (the balancer's
#: host), answered 200, such a check is logged at debug level (:func:`is_balancer_check`).
BALANCER_USER_AGENT = "service-balancer-check"

#: Every path any poller logged at debug level polls.
ANY_PROBE_PATH = PROBE_PATHS | QUICKSTART_PATHS

#: The web UI's timed reads of the management API (its status every 2 s, a model's log every 1.5 s, the series
#: every 5 s) carry this header (ui/api.js): with a tab open they were a line every second or so in the
#: supervisor's output, the quick start's terminal.  Answered below 400, they are logged at debug level.
UI_POLL_HEADER, UI_POLL_VALUE = b"x-service-poll", b"ui"
UI_POLL_PREFIX = b"/api/v1/"

#: Client addresses the supervisor polls from: its children listen on loopback only.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "::ffff:127.0.0.1"})

log = Logger(namespace="svc.access")


class SiteApp(Protocol):
    """What a site needs of the app it serves (every app of svc.web.routes.JsonApp provides it)."""

    def oversize_reply(self, request: LimitedRequest) -> tuple[int, dict[str, str], bytes]: ...

    def busy_reply(self) -> tuple[int, dict[str, str], bytes]: ...

    def limit_reply(self, request: Any, error: ApiError, method: str = "-",
                    path: bytes | None = None) -> tuple[int, dict[str, str], bytes]: ...

    def count(self, request: Any) -> None: ...

    def count_refused(self, method: str, code: int) -> None: ...

    def bare_headers(self, request: Any | None) -> dict[str, str]: ...

    def refusal_before_body(self, request: LimitedRequest,
                            length: int | None) -> tuple[int, dict[str, str], bytes] | None: ...


def count_nothing(method: str, code: int) -> None:
    """A site built without an app (unit tests) counts its listener's bare replies nowhere."""


def no_headers(request: Any | None) -> dict[str, str]:
    """A site built without an app (unit tests) adds nothing to its bare 408."""
    return {}


def no_refusal(request: LimitedRequest, length: int | None) -> None:
    """A site built without an app (unit tests) reads every body its limits allow."""
    return None


def plain_limit_reply(request: Any, error: ApiError, method: str = "-",
                      path: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    """A listener limit's reply where no app gives its shape (sites built without one, in unit tests)."""
    return error.code, dict(error.headers), dumps({"error": error.message})


def loggable_request_id(value: str | None) -> str:
    """``value`` when it is a valid request id (the contract's 1 to 128 printable ASCII characters), else ``-``.

    The access line falls back to the client's own ``X-Request-ID`` where a
    reply carries none (a preflight, ``/metrics``, a listener's early
    answer): unchecked, any client could forge fields of the line, write
    terminal escapes into it, or fill the rotated logs with 16 KB ids."""
    return value if value is not None and REQ_ID_RE.fullmatch(value) else "-"


#: The start of a parameter (``?name=``, ``&``- or ``;``-separated, a ``;name=`` path parameter, or after a ``#``
#: a raw target may carry); its ``=`` may come percent-encoded (``?api_key%3D...``), which a lenient server or a
#: proxy reads as a parameter too.
_PARAMETER = re.compile(r"([?&;#])([^=&;#?]*?)(=|%3[dD])")
#: Where a credential's value ends in the query: the next ``&``, ``;`` or ``#``, not a ``?`` (query pairs split at
#: ``&``: a token may hold a ``?``, and its part after one was written whole); a path parameter's ends at the
#: query's ``?`` too.
_VALUE_END, _PATH_VALUE_END = re.compile(r"[&;#]"), re.compile(r"[&;#?]")
#: A parameter name that says it holds a credential (``api_key``, ``token``, ``password``, percent-encoded or
#: not): none of ours does (the service reads credentials from ``Authorization`` only), so it is a client's mistake.
_CREDENTIAL_NAME = re.compile(r"key|token|secret|passw|auth|bearer|cred|sig", re.I)


#: A control character (C0, DEL, C1; the request line's bytes read as latin-1): written as is, a DEL, a C1 CSI
#: (``\x9b``) or, in a request line too long that twisted never parsed, an ESC or CR moved or rewrote what a
#: terminal or a log viewer shows of the line.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def loggable_text(text: str) -> str:
    """``text`` (a method or path) with each control character written as ``\\xNN``, so the access line stays
    one line of visible text (``isprintable`` first: the access line of every request is made here)."""
    return text if text.isprintable() else _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


def loggable_path(path: str) -> str:
    """``path`` for the access line, with the value of any credential-like parameter replaced by ``REDACTED``:
    a client that sent its key as ``?api_key=`` had it written, whole, to a log that the management API serves
    and log shippers read."""
    if "=" not in path and "%3d" not in path.lower():
        return path
    out, pos, query = [], 0, path.find("?")
    while match := _PARAMETER.search(path, pos):
        out.append(path[pos:match.end()])
        pos = match.end()  # another parameter's value is read on: a "?token=" inside it is still found
        if _CREDENTIAL_NAME.search(unquote(match[2])):
            end = (_PATH_VALUE_END if 0 <= pos <= query else _VALUE_END).search(path, pos)
            out.append("REDACTED")
            pos = end.start() if end else len(path)
    return "".join(out) + path[pos:]


def is_ui_poll(request: Any) -> bool:
    """Whether ``request`` is one of the web UI's timed reads (:data:`UI_POLL_HEADER`): a GET of the management
    API that says so.  A client that sends the header only hides its own reads."""
    return (request.method == b"GET" and request.path.startswith(UI_POLL_PREFIX)
            and request.requestHeaders.getRawHeaders(UI_POLL_HEADER) == [UI_POLL_VALUE])


def is_balancer_check(request: Any) -> bool:
    """Whether ``request`` is a load balancer's health check (:data:`BALANCER_USER_AGENT`): a GET of ``/healthz``,
    which needs no credential and says nothing but "up"; logged at debug when answered 200."""
    return (request.method == b"GET" and request.path == b"/healthz"
            and request.requestHeaders.getRawHeaders(b"user-agent") == [BALANCER_USER_AGENT.encode()])


def is_supervisor_probe(request: Any) -> bool:
    """Whether ``request`` is the supervisor polling: a GET of a probe path, from loopback, with its User-Agent
    (or the quick start polling the supervisor's status, likewise).

    All three must hold, so a real client is never hidden by accident; a
    client that imitates all three only hides its own probe-like GET.
    """
    if request.method != b"GET" or request.path not in ANY_PROBE_PATH:  # every POST answered stops here
        return False
    agent = [a.decode("latin-1", "replace") for a in request.requestHeaders.getRawHeaders(b"user-agent") or []]
    paths = {SUPERVISOR_USER_AGENT: PROBE_PATHS, QUICKSTART_USER_AGENT: QUICKSTART_PATHS}
    if len(agent) != 1 or request.path not in paths.get(agent[0], ()):
        return False
    try:
        host = request.getClientAddress().host
    except AttributeError:
        return False
    return host in LOOPBACK_HOSTS


class JsonSite(server.Site):
    """A Site with a body limit, an early 413, connection limits and a structured access log.

    ``busy_reply() -> (code, headers, body)`` is the process's 503 for a
    connection past ``limits.max_connections``; ``limit_reply(request,
    error, method)`` its reply to a request refused by another listener
    limit before any route saw it (414 and 431 for a head too large).
    """

    # HTTP/1.1 only: the processes speak plain HTTP, never HTTP/2. twisted.web types the attribute as its own
    # HTTP/1.1-or-2 channel factory, though any channel class serves.
    protocol = LimitedChannel  # type: ignore[assignment]

    def __init__(
        self,
        resource: Any,
        *,
        max_body_bytes: int,
        oversize_reply: Callable[[LimitedRequest], tuple[int, dict[str, str], bytes]],
        busy_reply: Callable[[], tuple[int, dict[str, str], bytes]],
        limits: HttpLimits,
        timeout: float | None = None,
        reactor: IReactorTime | None = None,
        on_logged: Callable[[Any], None] | None = None,
        limit_reply: Callable[..., tuple[int, dict[str, str], bytes]] = plain_limit_reply,
        count_refused: Callable[[str, int], None] = count_nothing,
        bare_headers: Callable[[Any | None], dict[str, str]] = no_headers,
        refusal_before_body: Callable[[LimitedRequest, int | None],
                                      tuple[int, dict[str, str], bytes] | None] = no_refusal,
    ) -> None:
        kwargs = {"timeout": timeout} if timeout is not None else {}
        self.reactor = reactor or _default_reactor
        # The reactor also drives twisted's idle timeout, so that tests can use a Clock.
        super().__init__(resource, requestFactory=LimitedRequest, parsePOSTFormSubmission=False,
                         reactor=self.reactor, **kwargs)
        self.max_body_bytes = max_body_bytes
        self.oversize_reply = oversize_reply
        self.busy_reply = busy_reply
        self.limit_reply = limit_reply
        self.count_refused = count_refused
        #: The headers of the header deadline's bare 408 given the request whose head was being read, or None (the
        #: gateway's ``Vary: Origin``, the valid ``X-Request-ID`` read).
        self.bare_headers = bare_headers
        #: The reply to a request whose head alone refuses it, before its body is read (the gateway's 401), or None.
        self.refusal_before_body = refusal_before_body
        self.max_connections = limits.max_connections
        self.header_timeout_s = limits.header_timeout_ms / 1000.0
        self.body_timeout_s = limits.body_timeout_ms / 1000.0
        self.on_logged = on_logged
        self.noisy = False
        self.open_connections = 0
        #: Keep-alive connections between requests: closed oldest first to admit a new one past max_connections.
        self.idle = IdleConnections()
        #: The process is stopping: every connection closes after its reply (svc.web.limits.LimitedChannel).
        self.closing = False
        self.refused_connections = 0
        self.header_timeouts = 0
        self._last_limit_warning: float | None = None

    @classmethod
    def for_app(cls, app: SiteApp, resource: Any, *, max_body_bytes: int, limits: HttpLimits,
                reactor: IReactorTime | None, timeout: float | None = None) -> Self:
        """The site serving ``resource`` with ``app``'s 413 and 503 replies, counting every request in ``app``.

        One place for the wiring every process does the same way; ``cls`` is
        the site class (the gateway's is svc.gateway.drain.DrainingSite).
        """
        return cls(resource, max_body_bytes=max_body_bytes, oversize_reply=app.oversize_reply,
                   busy_reply=app.busy_reply, limits=limits, timeout=timeout, reactor=reactor, on_logged=app.count,
                   limit_reply=app.limit_reply, count_refused=app.count_refused, bare_headers=app.bare_headers,
                   refusal_before_body=app.refusal_before_body)

    def warn_limit(self, text: str, **fields: Any) -> None:
        """A warning about a connection limit, at most one per 10 s (they come in floods)."""
        now = self.reactor.seconds()
        if self._last_limit_warning is None or now - self._last_limit_warning >= 10.0:
            self._last_limit_warning = now
            log.warn(text, **fields)

    def log(self, request: Any) -> None:
        self._access_line(request, request.code)
        if self.on_logged is not None:
            self.on_logged(request)

    def log_abandoned(self, request: Any) -> None:
        """The access line of a request whose client closed the connection before its reply: code 499 (nginx's
        "client closed request"), the time it had been handled.  No reply went out, so none is counted."""
        self._access_line(request, CLIENT_CLOSED)

    def _access_line(self, request: Any, code: int) -> None:
        started = getattr(request, "started", None)
        duration = (self.reactor.seconds() - started) * 1000.0 if started is not None else 0.0
        # The id the reply carries; else the one its handler settled on (a 499 sends none: an abandoned job wait
        # is named by its job's task id); else the client's.
        sent = request.responseHeaders.getRawHeaders(b"x-request-id")
        rid = sent[0].decode("latin-1") if sent else getattr(request, "service_task_id", None)
        if rid is None and (asked := request.requestHeaders.getRawHeaders(b"x-request-id")):
            rid = asked[0].decode("latin-1")
        key = getattr(request, "service_key", None) or "-"
        # A refusal (401: a credential guessed) is never hidden behind a probe's User-Agent, which any loopback
        # client (every remote one behind a proxy on the host) can send; a loading model's 503 and a probe given
        # up at its timeout (499) stay probes.
        refused = 400 <= code < 500 and code != CLIENT_CLOSED
        self.log_line(request.method, request.uri, code, duration, rid, key,
                      debug=(not refused and is_supervisor_probe(request)) or (code < 400 and is_ui_poll(request))
                      or (code == 200 and is_balancer_check(request)))

    def log_line(self, method: bytes, path: bytes, code: int, duration_ms: float, request_id: str | None, key: str,
                 *, debug: bool = False) -> None:
        """One access-log line; ``debug`` for the supervisor's probes (dropped at the default info level).

        The text is rendered here, once, and the event's format only places
        it: twisted's formatter parses a format and its specs on every event,
        half of what the access line cost, which was a seventh of the
        reactor's work per job submit (bench/README.md, jobs_burst).  The
        fields stay in the event for any observer that reads them.
        """
        text_method = loggable_text(method.decode("latin-1", "replace"))
        text_path = loggable_text(loggable_path(path.decode("latin-1", "replace")[:300]))
        request_id = loggable_request_id(request_id)
        (log.debug if debug else log.info)(
            "{access_line}",
            access_line=f"{text_method} {text_path} {code} {duration_ms:.1f}ms key={key} rid={request_id}",
            method=text_method,
            path=text_path,
            code=code,
            duration_ms=duration_ms,
            key=key,
            request_id=request_id,
        )


