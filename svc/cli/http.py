"""svcctl's HTTP client: one request under one deadline, and how a command's exit status comes of it.

Why it is its own module: the client commands (``infer``, ``jobs ...``,
``jobs run``, the gateway restart of ``keys add|disable``) all make their
requests through a :class:`Client`, which they take as an argument.  The real
one, :class:`HttpClient`, is treq on the global reactor run once with
``task.react``; tests give the commands an in-memory client and a clock
instead, so they run in-process without a server.

One deadline covers the request and the body read (treq's own timeout ends
when the headers arrive, so a slow body could outlive it).  Twisted and treq
are imported only when a request is made, so ``svcctl --version``,
``keygen`` and ``hash`` start fast.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol
from urllib.parse import urlsplit, urlunsplit

from svc import __version__
from svc.cli.output import StdoutError
from svc.contract.protocol import LOOPBACK, WEIGHTS_HEADER
from svc.infra.reactors import IClientReactor, use_monotonic_clock

EXIT_OK, EXIT_HTTP, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class CliError(Exception):
    """A failure reported as one line on stderr and exit status 2."""


#: Characters a terminal acts on rather than shows (C0, DEL, C1) and the Unicode line breaks.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def visible(text: str) -> str:
    """``text`` with its control characters written as ``\\xNN`` (``\\uNNNN``): a line that quotes what a server
    sent (its reason phrase, ``Location``, ``error``) set a terminal's title or cleared its screen (a probe)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


def fail(message: str) -> None:
    """One ``svcctl: ...`` line on stderr, one line of visible text whatever a server's words in it hold."""
    print(f"svcctl: {visible(message)}", file=sys.stderr)


@dataclass(frozen=True)
class HttpCall:
    """One request, decided before the reactor starts."""

    method: str
    url: str
    body: bytes | None
    timeout: float


class Reply(NamedTuple):
    """What came back: the status, its reason phrase, the whole body, the ``Retry-After`` header if any, the
    ``X-Service-Weights`` header (``demo``, ``pretrained``, ``file``) if any, and a redirect's ``Location``."""

    status: int
    phrase: str
    content: bytes
    retry_after: str | None
    weights: str | None = None
    location: str | None = None


#: The one stderr line of a command whose reply came from demo weights.
DEMO_NOTE = ("note: this reply came from demo weights (random init: the outputs are noise); docs/models.md, "
             "\"Real models in three commands\", serves the official ones")


def note_weights(reply: Reply, stderr: Any = None) -> None:
    """Say on stderr (one line) that ``reply`` came from demo weights; nothing for any other."""
    if reply.weights == "demo":
        print(f"svcctl: {DEMO_NOTE}", file=stderr or sys.stderr)


class Client(Protocol):
    """How a command reaches HTTP: the reactor it runs on and the exchange of one request."""

    def react(self, main: Callable[[IClientReactor], Coroutine[Any, Any, None]]) -> None:
        """Run ``main(reactor)`` to its end (``task.react`` raises SystemExit when done)."""

    def exchange(self, reactor: IClientReactor, call: HttpCall, token: str) -> Coroutine[Any, Any, Reply]:
        """Make ``call`` with the Bearer ``token``; the reply, or the transport's exception."""


class HttpClient:
    """The real client: treq over a non-persistent pool, on the global reactor."""

    def react(self, main: Callable[[IClientReactor], Coroutine[Any, Any, None]]) -> None:
        # What the request needs is imported before task.react: it starts ``main`` before the reactor runs and
        # installs its signal handlers, so a Ctrl-C during an import inside ``main`` failed the coroutine
        # ("main function encountered error", exit 1) instead of stopping the reactor (react below).
        import treq.client  # noqa: F401
        import twisted.web.client  # noqa: F401
        from twisted.internet import reactor, task

        import svc.web.client  # noqa: F401

        use_monotonic_clock(reactor)  # --timeout-s and the waits hold across a clock step, as in the processes
        task.react(main)

    async def exchange(self, reactor: IClientReactor, call: HttpCall, token: str) -> Reply:
        from treq.client import HTTPClient
        from twisted.web.client import Agent, HTTPConnectionPool

        from svc.web.client import AddressByPort

        pool = HTTPConnectionPool(reactor, persistent=False)
        headers: dict[bytes | str, bytes | str] = {"Authorization": f"Bearer {token}", "Accept": "application/json",
                   "User-Agent": f"svcctl/{__version__}"}
        url, ipv6 = loopback_stand_in(call.url)
        if ipv6 is None:
            agent = Agent(reactor, connectTimeout=call.timeout, pool=pool)
        else:  # treq cannot take the IPv6 literal: the URL names loopback, the endpoint connects to the address
            port, host = ipv6
            agent = Agent.usingEndpointFactory(reactor, AddressByPort(reactor, {port: host}, call.timeout), pool=pool)
            headers["Host"] = urlsplit(call.url).netloc.rpartition("@")[2]
        client = HTTPClient(agent)
        if call.body is not None:
            headers["Content-Type"] = "application/json"
        # treq's timeout ends when the headers arrive; the caller's deadline also covers the body.  Redirects are
        # not followed: treq followed a GET's without the token (and took a POST's for a failed connection).
        response = await client.request(call.method, url, headers=headers, data=call.body, timeout=call.timeout,
                                        allow_redirects=False)
        content = await response.content()
        retry_after = response.headers.getRawHeaders("retry-after", [None])[0]
        weights = response.headers.getRawHeaders(WEIGHTS_HEADER, [None])[0]
        location = response.headers.getRawHeaders("location", [None])[0]
        phrase = response.phrase.decode("latin-1") if isinstance(response.phrase, bytes) else str(response.phrase)
        return Reply(response.code, phrase, content, retry_after, weights, location)


def loopback_stand_in(url: str) -> tuple[str, tuple[int, str] | None]:
    """``url`` as treq can take it, and ``(port, IPv6 address)`` when its host is an IPv6 literal.

    treq (hyperlink) refuses an IPv6 literal host (``InvalidCodepoint: Codepoint U+003A``): such a URL
    names loopback and its port instead, and :class:`svc.web.client.AddressByPort` connects to the
    address, as the supervisor's probes of a gateway on ``::1`` do.  Any other URL is unchanged.
    """
    parts = urlsplit(url)
    host = parts.hostname
    if not host or ":" not in host:
        return url, None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return urlunsplit(parts._replace(netloc=f"{LOOPBACK}:{port}")), (port, host)


def react(client: Client, main: Callable[[IClientReactor], Awaitable[int]]) -> tuple[int | None, int]:
    """Run ``main`` on the client's reactor: ``(its exit status, the reactor's)``.

    The first is None when the reactor stopped before ``main`` ended (Ctrl-C
    before the request began); the second is the status ``task.react``
    exited with (0 when it stopped cleanly, 130 when interrupted).  Ctrl-C
    before the reactor's own handler is installed (the imports, ``main``'s
    start: ``task.react`` runs it before the reactor) is a KeyboardInterrupt,
    here or in ``main``: it is the same interrupt, so the caller says so in
    its own words.  An exception of ``main`` (stdout that cannot be written,
    :mod:`svc.cli.output`) is raised again here, once the reactor has
    stopped, for the entry to report: left in the coroutine, ``task.react``
    logged it as "main function encountered error" and exited 1, which the
    commands took for an interrupt.
    """
    codes: list[int] = []
    errors: list[Exception] = []
    interrupted: list[bool] = []

    async def run(reactor: IClientReactor) -> None:
        try:
            codes.append(await main(reactor))
        except KeyboardInterrupt:
            interrupted.append(True)
        except Exception as e:
            errors.append(e)

    stopped = 0
    try:
        client.react(run)
    except SystemExit as e:
        stopped = e.code if isinstance(e.code, int) else 0
    except KeyboardInterrupt:
        interrupted.append(True)
    if errors:
        raise errors[0]
    if interrupted:
        return None, EXIT_INTERRUPTED
    return (codes[0] if codes else None), stopped


def with_deadline(start: Callable[[], Any], timeout: float, reactor: IClientReactor) -> Any:
    """The Deferred that ``start()`` returns, cancelled after ``timeout`` seconds, failing then with
    ``TimeoutError`` whatever the cancellation raised.

    Cancelled while it connects or resolves the name, the agent fails with
    ``ConnectingCancelledError`` or a DNS error (``RequestGenerationFailed``
    while it sends the body), which ``addTimeout`` passes through as they
    are: the user would read a cause other than the deadline.  The same
    errors come when treq's own timeout or the agent's connect timeout,
    both of ``timeout`` and started first, cancel the request at the same
    moment: so any failure once the deadline is due is the deadline's
    (``--timeout-s 0.005`` read "cannot resolve the host name" for an IP
    address).  The deadline is taken before ``start`` runs, so that it is
    never later than those timers.
    """
    from twisted.internet.defer import TimeoutError as DeadlineError

    due = reactor.seconds() + timeout

    def passed(_result: Any, seconds: float) -> Any:
        raise DeadlineError(seconds, "request")

    def at_deadline(failure: Any) -> Any:
        if reactor.seconds() >= due and not failure.check(DeadlineError):
            raise DeadlineError(timeout, "request")
        return failure

    d = start().addTimeout(timeout, reactor, onTimeoutCancel=passed)
    return d.addErrback(at_deadline)


def _wrapped(error: BaseException) -> Any:
    """``error`` when it is the agent's failure that carries the reasons it failed, else None."""
    from twisted.web.client import (
        RequestGenerationFailed,
        RequestTransmissionFailed,
        ResponseFailed,
        ResponseNeverReceived,
    )

    wrappers = ResponseFailed | ResponseNeverReceived | RequestTransmissionFailed | RequestGenerationFailed
    return error if isinstance(error, wrappers) else None


def is_timeout(error: BaseException) -> bool:
    """Whether a request failed because its deadline passed: its own, or treq's timeout, which cancels the
    request, so that the agent reports the cancellation as the reason."""
    from twisted.internet import defer
    from twisted.internet import error as net

    timeouts = (defer.TimeoutError, defer.CancelledError, net.TimeoutError)
    wrapped = _wrapped(error)
    return isinstance(error, timeouts) or bool(wrapped and any(r.check(*timeouts) for r in wrapped.reasons))


def describe_failure(error: BaseException, call: HttpCall) -> str:
    """One line for a request that could not be made or completed."""
    from twisted.internet import error as net

    where = f"{call.method} {call.url}"
    wrapped = _wrapped(error)
    if is_timeout(error):
        return f"{where}: no complete reply within {call.timeout:g} s"
    if isinstance(error, net.ConnectionRefusedError):
        return f"{where}: connection refused (is the gateway running?)"
    if isinstance(error, net.DNSLookupError):
        return f"{where}: cannot resolve the host name"
    if wrapped:
        reasons = "; ".join(r.getErrorMessage() or r.type.__name__ for r in wrapped.reasons) or "connection lost"
        return f"{where}: the connection failed ({reasons})"
    return f"{where}: {type(error).__name__}: {error}"


def print_reply(content: bytes) -> bool:
    """A reply body on stdout: JSON indented by 2, anything else as text; whether it was JSON, as every reply of
    the gateway's routes is (a proxy's login page is not).

    A reader that went away (``svcctl infer ... | head -1``) is not an error
    of the request: the rest of the output is dropped quietly, and the exit
    status still says how the request went when it went wrong (1 for an HTTP
    error; a 0 becomes 141 at the entry, :mod:`svc.cli.output`).  Any other
    failure of stdout (a full device) is raised, for the entry to report.
    """
    if not content:
        return False
    try:
        text, parsed = json.dumps(json.loads(content), indent=2) + "\n", True
    except ValueError:
        text, parsed = content.decode("utf-8", errors="replace"), False
        text += "" if text.endswith("\n") else "\n"
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except StdoutError as e:
        if not e.gone:
            raise
    return parsed


class Interrupted(Exception):
    """Ctrl-C or SIGTERM stopped the request (exit 130), whatever the cancelled transfer raised."""


async def exchange_once(client: Client, reactor: IClientReactor, call: HttpCall, token: str) -> Reply:
    """The reply to ``call`` within its deadline (``call.timeout`` covers connecting, the headers and the body).

    Raises :class:`Interrupted` when the reactor shuts down first (Ctrl-C:
    say so, not "connection lost"), else :class:`CliError` with one line.
    """
    from twisted.internet.defer import ensureDeferred

    d = with_deadline(lambda: ensureDeferred(client.exchange(reactor, call, token)), call.timeout, reactor)
    interrupted: list[bool] = []

    def on_shutdown() -> None:
        if not d.called:
            interrupted.append(True)
            d.cancel()

    trigger = reactor.addSystemEventTrigger("before", "shutdown", on_shutdown)
    try:
        return await d
    except Exception as e:
        if interrupted:
            raise Interrupted() from None
        raise CliError(describe_failure(e, call)) from None
    finally:
        reactor.removeSystemEventTrigger(trigger)


async def call_gateway(client: Client, reactor: IClientReactor, call: HttpCall, token: str) -> int:
    """Make ``call`` with the Bearer token, print the reply; the exit status.

    The reply body is printed to stdout (JSON indented by 2); a non-2xx
    status also gets one line on stderr.
    """
    try:
        reply = await exchange_once(client, reactor, call, token)
    except Interrupted:
        fail("interrupted")
        return EXIT_INTERRUPTED
    except CliError as e:
        fail(str(e))
        return EXIT_USAGE
    status, content = reply.status, reply.content
    printed_json = print_reply(content)
    note_weights(reply)
    if 200 <= status < 300 and printed_json:
        return EXIT_OK
    fail(http_error_line(reply, call.method, call.url))
    return EXIT_HTTP


def http_error_line(reply: Reply, method: str, url: str, wanted: str = "a JSON reply",
                    server: str = "gateway") -> str:
    """The line of an error reply, with its ``Retry-After`` when it has one (a 429 says when to ask again), where a
    redirect points, or what a 2xx lacked (``wanted``): one wording for ``infer``, ``jobs ...``, ``jobs run`` and
    the ``keys`` commands' restart, which asks the supervisor (``server``: its option is ``--supervisor``)."""
    more = f" (Retry-After: {reply.retry_after})" if reply.retry_after else ""
    line = f"HTTP {reply.status} {reply.phrase}{more} from {method} {url}"
    if 300 <= reply.status < 400:
        return (f"{line}: redirected to {reply.location or '(no Location given)'}; svcctl follows no redirect (it "
                f"would carry the token elsewhere): give --{server} the address that answers")
    if 200 <= reply.status < 300:
        return f"{line}, but not {wanted}: not the {server}'s reply (a proxy's page?)"
    return line
