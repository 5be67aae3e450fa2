"""Connection limits of svc.web (header deadline, connection cap, pipelining), in memory.

A JsonSite on a task.Clock serves a tiny resource; connections are
StringTransports, so every byte written and every pause of reading is seen.
"""

from __future__ import annotations

import json
import re

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.web import resource, server

from svc.config import MODEL_SERVER_KEYS, ConfigError, load_model_server_config
from svc.gateway.config import GATEWAY_KEYS, load_gateway_config
from svc.supervisor.config import SUPERVISOR_KEYS, load_supervisor_config
from svc.web.httplimits import HttpLimits
from svc.web.limits import PIPELINE_BURST
from svc.web.replies import dumps
from svc.web.site import JsonSite

REQUEST = b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"


class Ok(resource.Resource):
    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[Deferred] = []
        self.posted: list[bytes] = []

    def render_POST(self, request):  # noqa: N802 (twisted's name)
        self.posted.append(request.content.read())
        return b"ok"

    def render_GET(self, request):  # noqa: N802 (twisted's name)
        if request.path == b"/slow":
            d = Deferred()
            d.addCallback(lambda _: (request.write(b"slow"), request.finish()))
            self.pending.append(d)
            return server.NOT_DONE_YET
        return b"ok"


class FullingTransport(StringTransport):
    """A transport whose send buffer is full past ``limit`` bytes until ``drain()``: like a client that does not read."""

    def __init__(self, limit: int = 10**9) -> None:
        super().__init__(peerAddress=IPv4Address("TCP", "127.0.0.1", 50000))
        self.limit = limit
        self.full = False

    def write(self, data: bytes) -> None:
        super().write(data)
        if not self.full and len(self.value()) > self.limit and self.producer is not None:
            self.full = True
            self.producer.pauseProducing()

    def drain(self) -> bytes:
        data = self.value()
        self.clear()
        if self.full:
            self.full = False
            self.producer.resumeProducing()
        return data


def busy() -> tuple[int, dict[str, str], bytes]:
    return 503, {"Retry-After": "1"}, dumps({"ok": False, "error": "busy"})


def make_site(clock: Clock, **limits: int) -> tuple[JsonSite, Ok]:
    res = Ok()
    site = JsonSite(res, max_body_bytes=1024, oversize_reply=lambda r: (413, {}, b"{}"), busy_reply=busy,
                    limits=HttpLimits(**limits), timeout=660, reactor=clock)
    return site, res


def connect(site: JsonSite, transport: StringTransport | None = None) -> tuple[object, StringTransport]:
    transport = transport or FullingTransport()
    channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 50000))
    channel.makeConnection(transport)
    return channel, transport


def lose(channel, transport) -> None:
    from twisted.internet.error import ConnectionDone
    from twisted.python.failure import Failure

    channel.connectionLost(Failure(ConnectionDone()))


def test_headers_incomplete_after_the_deadline_get_408_and_close_even_while_bytes_trickle():
    """A request's headers must be complete header_timeout_ms after its first byte, however slowly bytes keep coming."""
    clock = Clock()
    site, _ = make_site(clock, header_timeout_ms=10000)
    channel, transport = connect(site)
    channel.dataReceived(b"GET /ok HTTP/1.1\r\n")
    for _ in range(9):  # one header byte a second resets twisted's idle timeout, not this deadline
        clock.advance(1)
        channel.dataReceived(b"X")
    assert not transport.disconnecting
    clock.advance(1.001)
    assert re.fullmatch(rb"HTTP/1\.1 408 Request Timeout\r\nDate: [A-Z][a-z]{2}, \d\d [A-Z][a-z]{2} \d{4} [0-9:]{8} GMT"
                        rb"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", transport.value()), transport.value()
    assert transport.disconnecting
    assert site.header_timeouts == 1


def test_the_bare_408_carries_the_sites_bare_headers():
    """The header deadline's 408 has the headers the app gives every reply before a request (the gateway's
    ``Vary: Origin``), and a ``Date``."""
    clock = Clock()
    site = JsonSite(Ok(), max_body_bytes=1024, oversize_reply=lambda r: (413, {}, b"{}"), busy_reply=busy,
                    limits=HttpLimits(header_timeout_ms=1000), timeout=660, reactor=clock,
                    bare_headers=lambda request: {"Vary": "Origin"})
    channel, transport = connect(site)
    clock.advance(1.001)
    assert re.fullmatch(rb"HTTP/1\.1 408 Request Timeout\r\nDate: [^\r]+ GMT\r\nVary: Origin\r\n"
                        rb"Content-Length: 0\r\nConnection: close\r\n\r\n", transport.value()), transport.value()


def envelope_site(clock: Clock) -> JsonSite:
    """A site with a data-plane app's listener replies (the envelope, the client's valid X-Request-ID echoed)."""
    from svc.contract.envelope import ModelIdentity
    from svc.web.routes import EnvelopeReplies, JsonApp, task_id_of

    app = JsonApp()
    app.replies = EnvelopeReplies(lambda: ModelIdentity("M", "v1"), task_id_of)
    app.count_as = lambda *labels: None  # type: ignore[method-assign]
    return JsonSite(Ok(), max_body_bytes=1024, oversize_reply=app.oversize_reply, busy_reply=app.busy_reply,
                    limits=HttpLimits(header_timeout_ms=1000), timeout=660, reactor=clock,
                    limit_reply=app.limit_reply, bare_headers=app.bare_headers)


@pytest.mark.parametrize("after", [b"X-A: 1\r\n", b""])
def test_the_bare_408_echoes_a_valid_request_id_read_and_logs_it(after):
    """api.md: a listener's reply written once the X-Request-ID line was read echoes it; the header deadline's
    408 had none and its access line said ``rid=-``.  Also as the last line read, which twisted holds back (to
    join a folded line) until the next starts."""
    from twisted.logger import capturedLogs

    clock = Clock()
    channel, transport = connect(envelope_site(clock))
    channel.dataReceived(b"GET /healthz HTTP/1.1\r\nX-Request-ID: lim-408b\r\n" + after)
    with capturedLogs() as events:
        clock.advance(1.001)
    assert re.fullmatch(rb"HTTP/1\.1 408 Request Timeout\r\nDate: [^\r]+ GMT\r\nX-Request-ID: lim-408b\r\n"
                        rb"Content-Length: 0\r\nConnection: close\r\n\r\n", transport.value()), transport.value()
    assert [e["access_line"] for e in events if "access_line" in e] == ["GET /healthz 408 1001.0ms key=- rid=lim-408b"]
    channel, transport = connect(envelope_site(clock))  # one not valid is not echoed
    channel.dataReceived(b"GET /healthz HTTP/1.1\r\nX-Request-ID: a b\r\n" + after)
    clock.advance(1.001)
    assert b"X-Request-ID" not in transport.value() and transport.value().startswith(b"HTTP/1.1 408 ")
    channel, transport = connect(envelope_site(clock))  # a held line that is no header: the 408 alone, no 400
    channel.dataReceived(b"GET /healthz HTTP/1.1\r\nX-Request-ID: lim-408c\r\nno colon\r\n")
    clock.advance(1.001)
    assert transport.value().count(b"HTTP/1.1 ") == 1 and b"\r\nX-Request-ID: lim-408c\r\n" in transport.value()


def test_the_431_of_a_line_too_long_reads_the_line_held_before_it():
    """twisted holds a header line back until the next starts (to join a folded one): the 431 of that next line
    ignored it, so an X-Request-ID right before the line too long got a generated id, in its access line too."""
    from twisted.logger import capturedLogs

    clock = Clock()
    channel, transport = connect(envelope_site(clock))
    with capturedLogs() as events:
        channel.dataReceived(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Request-ID: lim-431a\r\nX-Big: "
                             + b"b" * 17000 + b"\r\n\r\n")
    reply = transport.value()
    assert reply.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), reply
    assert b"\r\nX-Request-ID: lim-431a\r\n" in reply and b'"task_id":"lim-431a"' in reply, reply
    assert [e["access_line"] for e in events if "access_line" in e] == ["GET /healthz 431 0.0ms key=- rid=lim-431a"]


def test_a_connection_that_sends_nothing_is_closed_after_the_header_deadline():
    """The first request's deadline runs from the connection's opening."""
    clock = Clock()
    site, _ = make_site(clock, header_timeout_ms=2000)
    channel, transport = connect(site)
    clock.advance(1.9)
    assert not transport.disconnecting
    clock.advance(0.2)
    assert transport.value().startswith(b"HTTP/1.1 408 ")
    assert transport.disconnecting


def test_idle_keep_alive_between_requests_is_not_cut_by_the_header_deadline():
    """After a reply, the idle time before the next request is governed by the idle timeout, not the header deadline;
    the next request gets its own full deadline from its first byte."""
    clock = Clock()
    site, _ = make_site(clock, header_timeout_ms=2000)
    channel, transport = connect(site)
    channel.dataReceived(REQUEST)
    assert transport.value().startswith(b"HTTP/1.1 200 OK")
    transport.clear()
    clock.advance(100)  # idle keep-alive, well past the header deadline, below the 660 s idle timeout
    assert not transport.disconnecting
    channel.dataReceived(b"GET /ok HTTP/1.1\r\n")
    clock.advance(1.5)
    channel.dataReceived(b"Host: x\r\n\r\n")
    assert transport.value().startswith(b"HTTP/1.1 200 OK")
    clock.advance(1.0)  # past the first deadline: it was cancelled by the complete headers
    assert not transport.disconnecting
    clock.advance(660)
    assert transport.disconnecting  # twisted's idle timeout still applies


def test_connections_past_max_connections_get_503_with_connection_close():
    """Past max_connections a new connection gets the process's 503 and is closed; a freed slot serves again."""
    clock = Clock()
    site, _ = make_site(clock, max_connections=2)
    first = connect(site)
    connect(site)
    channel, transport = connect(site)
    head, _, body = transport.value().partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 503 Service Unavailable"
    assert b"Connection: close" in lines and b"Retry-After: 1" in lines
    assert b"Content-Type: application/json; charset=utf-8" in lines
    assert json.loads(body) == {"ok": False, "error": "busy"}
    assert transport.disconnecting
    channel.dataReceived(REQUEST)  # read and dropped
    assert transport.value().count(b"HTTP/1.1") == 1
    assert (site.open_connections, site.refused_connections) == (2, 1)
    lose(channel, transport)
    assert site.open_connections == 2  # a refused connection never counted
    lose(*first)
    again, transport = connect(site)
    again.dataReceived(REQUEST)
    assert transport.value().startswith(b"HTTP/1.1 200 OK")


def test_past_max_connections_the_connection_idle_longest_is_closed_for_the_new_one():
    """Connections idle between requests held every slot for the idle timeout, and every new client got 503, the
    supervisor's /healthz probe included (a security probe: 50 keep-alive connections after one request each).
    The one idle longest is closed for the new one; one in the middle of a request is not, unless its head has been
    coming for a second (svc.web.idle.STALLED_S), and with none idle or stalled the new one gets the 503."""
    clock = Clock()
    site, _ = make_site(clock, max_connections=3)
    older, newer, busy_one = connect(site), connect(site), connect(site)
    for channel, transport in (older, newer):
        channel.dataReceived(REQUEST)
        assert transport.value().startswith(b"HTTP/1.1 200 OK")
        clock.advance(1)
    busy_one[0].dataReceived(b"GET /ok HTTP/1.1\r\n")  # a request whose head is still coming
    newer[0].dataReceived(b"GET /ok HTTP/1.1\r\n")  # its next request began: not idle any more
    newer[0].dataReceived(b"Host: x\r\n\r\n")  # answered: idle again, later than `older`
    assert newer[1].value().count(b"HTTP/1.1 200 OK") == 2

    channel, transport = connect(site)
    assert older[1].disconnecting and not newer[1].disconnecting and not busy_one[1].disconnecting
    assert older[1].value().count(b"HTTP/1.1 200 OK") == 1  # its reply was sent whole before it was closed
    channel.dataReceived(REQUEST)
    assert transport.value().startswith(b"HTTP/1.1 200 OK")
    lose(*older)  # the closed connection's end frees no slot twice
    assert (site.open_connections, site.refused_connections, site.idle.closed) == (3, 0, 1)

    newer[1].clear()
    newer[0].dataReceived(b"GET /ok HTTP/1.1\r\n")  # now in a request
    transport.clear()
    channel.dataReceived(b"GET /ok HTTP/1.1\r\n")  # the newest one too: none idle
    # busy_one's head has been coming since its connection, 2 s ago: stalled, it gets its 408 for the new one
    admitted, admitted_transport = connect(site)
    assert busy_one[1].value().startswith(b"HTTP/1.1 408 Request Timeout") and busy_one[1].disconnecting
    assert admitted_transport.value() == b"" and not admitted_transport.disconnecting
    refused, refused_transport = connect(site)  # the other heads began now: not stalled
    assert refused_transport.value().startswith(b"HTTP/1.1 503 Service Unavailable")
    assert not (newer[1].disconnecting or transport.disconnecting or admitted_transport.disconnecting)
    assert (site.open_connections, site.refused_connections, site.idle.closed) == (3, 1, 2)


def test_heads_held_open_lose_their_slots_to_new_clients_past_a_second():
    """A security probe: one client held every slot with half-sent heads (each re-sent at its 10 s deadline), and
    every other client got 503, the supervisor's too. A full listener closes the connection whose head has been
    coming longest, once it has for STALLED_S (its 408, counted and logged as its deadline's), for the new one."""
    from svc.web.idle import STALLED_S

    clock = Clock()
    site, _ = make_site(clock, max_connections=2, header_timeout_ms=10000)
    slow = [connect(site) for _ in range(2)]
    for channel, _ in slow:
        channel.dataReceived(b"GET /ok HTTP/1.1\r\nX-A: 1\r\n")
    refused, refused_transport = connect(site)  # within the second: no one is stalled yet
    assert refused_transport.value().startswith(b"HTTP/1.1 503 ")
    clock.advance(STALLED_S)
    channel, transport = connect(site)
    assert slow[0][1].value().startswith(b"HTTP/1.1 408 Request Timeout") and slow[0][1].disconnecting
    assert not slow[1][1].disconnecting and site.header_timeouts == 1
    channel.dataReceived(REQUEST)
    assert transport.value().startswith(b"HTTP/1.1 200 OK")
    lose(*slow[0])  # its end frees no slot twice
    assert (site.open_connections, site.refused_connections, site.idle.closed) == (2, 1, 1)


def test_a_connection_is_idle_only_once_its_client_read_the_reply():
    """A reply still unsent (its client not reading) holds the connection out of the idle ones: a full listener
    refuses the next rather than close it; once the client read the reply, it is the one closed for the next."""
    clock = Clock()
    site, _ = make_site(clock, max_connections=1)
    channel, transport = connect(site, FullingTransport(limit=10))
    channel.dataReceived(REQUEST)
    refused, refused_transport = connect(site)
    assert refused_transport.value().startswith(b"HTTP/1.1 503 ") and not transport.disconnecting
    assert transport.drain().startswith(b"HTTP/1.1 200 OK")
    clock.advance(0)  # the held connection goes on once its reply left
    admitted, admitted_transport = connect(site)
    assert transport.disconnecting and not admitted_transport.disconnecting
    admitted.dataReceived(REQUEST)
    assert admitted_transport.value().startswith(b"HTTP/1.1 200 OK")


def test_a_client_that_does_not_read_stops_being_read_and_gets_no_more_replies():
    """While a connection's replies are unsent, no further pipelined request is read or answered;
    they are answered once the client reads."""
    clock = Clock()
    site, _ = make_site(clock)
    channel, transport = connect(site, FullingTransport(limit=300))
    channel.dataReceived(REQUEST * 200)
    answered = transport.value().count(b"HTTP/1.1 200")
    assert 1 <= answered <= 3
    assert transport.producerState == "paused"
    assert len(b"".join(channel._dataBuffer)) < len(REQUEST * 200)
    total = 0
    for _ in range(400):
        if total == 200:
            break
        total += transport.drain().count(b"HTTP/1.1 200")
        clock.advance(0)
    assert total == 200
    assert transport.producerState == "producing"


def test_a_full_send_buffer_during_a_slow_request_stops_reading():
    """twisted keeps reading while a request is handled even when the client reads nothing; we stop."""
    clock = Clock()
    site, res = make_site(clock)
    channel, transport = connect(site)
    channel.dataReceived(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    channel.pauseProducing()  # the transport's buffer is full
    assert transport.producerState == "paused"
    channel.dataReceived(REQUEST * 10)  # what was already read
    res.pending.pop().callback(None)
    assert transport.value().count(b"HTTP/1.1 200") == 1  # the pipelined ones wait for the client to read
    channel.resumeProducing()
    assert transport.value().count(b"HTTP/1.1 200") == 11


def test_pipelined_requests_are_answered_in_bursts_so_other_connections_get_the_reactor():
    """At most PIPELINE_BURST + 1 pipelined requests are answered per reactor turn on one connection."""
    clock = Clock()
    site, _ = make_site(clock)
    channel, transport = connect(site)
    channel.dataReceived(REQUEST * 100)
    assert transport.value().count(b"HTTP/1.1 200") == PIPELINE_BURST + 1
    turns = 0
    while transport.value().count(b"HTTP/1.1 200") < 100:
        # One reactor turn: only the calls already due run (Clock.advance would also run those they schedule).
        due = [c for c in clock.getDelayedCalls() if c.getTime() <= clock.seconds()]
        assert due, "the rest of the pipelined requests was never scheduled"
        for call in due:
            clock.calls.remove(call)
            call.func(*call.args, **call.kw)
        turns += 1
        assert transport.value().count(b"HTTP/1.1 200") <= (turns + 1) * (PIPELINE_BURST + 1)
    assert turns == 5


def test_every_process_declares_the_http_limit_keys():
    """The model server, the gateway and the supervisor each have the three keys with strict bounds."""
    for keys, cap in ((MODEL_SERVER_KEYS, 1024), (GATEWAY_KEYS, 1024), (SUPERVISOR_KEYS, 128)):
        table = {k.name: k for k in keys}
        assert table["header_timeout_ms"].default == 10000 and table["header_timeout_ms"].minimum == 1
        assert table["body_timeout_ms"].default == 60000 and table["body_timeout_ms"].minimum == 1
        assert table["max_connections"].default == cap and table["max_connections"].minimum == 1
        assert table["listen_backlog"].default == 1024 and table["listen_backlog"].minimum == 1


@pytest.mark.parametrize(
    "loader, table, key, value, problem",
    [
        ("model", "", "max_connections", "-1", "must be at least 1, got -1"),
        ("model", "", "header_timeout_ms", '"10s"', "must be an integer, got string '10s'"),
        ("model", "", "listen_backlog", "0", "must be at least 1, got 0"),
        ("gateway", "gateway", "max_connections", "0", "must be at least 1, got 0"),
        ("gateway", "gateway", "header_timeout_ms", "-5", "must be at least 1, got -5"),
        ("gateway", "gateway", "listen_backlog", "1.5", "must be an integer, got float 1.5"),
        ("supervisor", "supervisor", "max_connections", "true", "must be an integer, got boolean True"),
        ("supervisor", "supervisor", "listen_backlog", "70000", "must be at most 65535, got 70000"),
        ("supervisor", "supervisor", "header_timeout_ms", "0", "must be at least 1, got 0"),
        ("model", "", "body_timeout_ms", "0", "must be at least 1, got 0"),
        ("gateway", "gateway", "body_timeout_ms", '"1m"', "must be an integer, got string '1m'"),
        ("supervisor", "supervisor", "body_timeout_ms", "-1", "must be at least 1, got -1"),
    ],
)
def test_wrong_http_limits_are_refused_in_one_line(tmp_path, loader, table, key, value, problem):
    """A wrong type or a non-positive value of an HTTP limit stops the process with one line naming file and key."""
    path = tmp_path / "c.toml"
    if loader == "model":
        path.write_text(f'id = "M1"\nport = 9000\nserver_uri = "/m1/predict"\n{key} = {value}\n')
        load, name = load_model_server_config, key
    else:
        path.write_text(f"[{table}]\n{key} = {value}\n")
        load = load_gateway_config if loader == "gateway" else load_supervisor_config
        name = f"{table}.{key}"
    with pytest.raises(ConfigError) as e:
        load(str(path))
    assert str(e.value) == f"{path}: {name}: {problem}"


def test_configured_limits_reach_every_process(tmp_path):
    """The three keys are read from each process's table into its HttpLimits."""
    service = tmp_path / "service.toml"
    service.write_text("[gateway]\nheader_timeout_ms = 3000\nmax_connections = 10\nlisten_backlog = 200\n"
                       "body_timeout_ms = 6000\n[supervisor]\nheader_timeout_ms = 4000\nmax_connections = 20\n"
                       "listen_backlog = 300\nbody_timeout_ms = 7000\n")
    model = tmp_path / "m.toml"
    model.write_text('id = "M1"\nport = 9000\nserver_uri = "/m1/predict"\n'
                     "header_timeout_ms = 5000\nmax_connections = 30\nlisten_backlog = 400\nbody_timeout_ms = 8000\n")
    assert HttpLimits.from_config(load_gateway_config(str(service))) == HttpLimits(3000, 10, 200, 6000)
    assert HttpLimits.from_config(load_supervisor_config(str(service))) == HttpLimits(4000, 20, 300, 7000)
    assert HttpLimits.from_config(load_model_server_config(str(model))) == HttpLimits(5000, 30, 400, 8000)


def test_busy_replies_have_each_process_error_shape():
    """The 503 past max_connections: status 65 envelope on the gateway and model server, {ok:false,error} on the
    supervisor; all say when to retry."""
    from types import SimpleNamespace

    from svc.contract.envelope import ModelIdentity
    from svc.gateway.app import GatewayApp
    from svc.modelserver.app import ModelServerApp
    from svc.supervisor.api import ManagementApi
    from svc.web.routes import EnvelopeReplies, JsonApp, task_id_of

    def app(cls, replies):  # what busy_reply reads of an instance: its reply shape, its text, no early headers
        fake = SimpleNamespace(replies=replies, busy_text=cls.busy_text, early_headers=None)
        fake.with_early_headers = lambda request, reply: JsonApp.with_early_headers(fake, request, reply)
        return fake

    model_replies = EnvelopeReplies(lambda: ModelIdentity("M1", "v1"), task_id_of)
    for cls, replies, message in (
            (GatewayApp, GatewayApp.replies, "too many open connections (gateway max_connections); retry shortly"),
            (ModelServerApp, model_replies, "too many open connections (max_connections); retry shortly")):
        code, headers, body = cls.busy_reply(app(cls, replies))
        envelope = json.loads(body)
        assert (code, envelope["status"], envelope["status_str"], envelope["results"]) == (503, 65, "NOT_READY", [])
        assert envelope["error"] == message
        assert headers == {"X-Request-ID": envelope["task_id"], "Cache-Control": "no-store", "Retry-After": "1"}
    code, headers, body = ManagementApi.busy_reply(app(ManagementApi, ManagementApi.replies))
    assert (code, headers, json.loads(body)) == (503, {"Retry-After": "1"},
                                                 {"ok": False, "error": "too many open connections; retry shortly"})


def test_a_body_incomplete_at_body_timeout_ms_gets_408_however_steadily_it_comes():
    """The body deadline runs from the headers: bytes that keep coming (each in time for the idle timeout) do
    not move it; at it the request is answered 408 and the connection closed, and the handler never runs."""
    from twisted.logger import capturedLogs

    clock = Clock()
    site, res = make_site(clock, body_timeout_ms=2000)
    channel, transport = connect(site)
    channel.dataReceived(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\nX-Request-ID: r-1\r\n\r\n")
    for _ in range(19):
        clock.advance(0.1)
        channel.dataReceived(b"a")
    assert transport.value() == b""
    with capturedLogs() as events:
        clock.advance(0.1)
    # its access line has the time it took: the deadline (it said 0.0 ms)
    assert [e["access_line"] for e in events if "access_line" in e] == ["POST /x 408 2000.0ms key=- rid=r-1"]
    reply = transport.value()
    assert reply.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), reply
    assert b"Connection: close" in reply
    assert b"within 2000 ms (body_timeout_ms); 19 bytes came" in reply
    channel.dataReceived(b"a" * 81)  # the rest, too late: dropped
    assert res.posted == []
    lose(channel, transport)


def test_a_body_complete_in_time_cancels_its_deadline():
    clock = Clock()
    site, res = make_site(clock, body_timeout_ms=2000)
    channel, transport = connect(site)
    channel.dataReceived(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nab")
    clock.advance(1.9)
    channel.dataReceived(b"c")
    assert transport.value().startswith(b"HTTP/1.1 200 OK\r\n") and res.posted == [b"abc"]
    clock.advance(5)
    assert b"408" not in transport.value()
    lose(channel, transport)


def _served(stream: bytes, chunk: int | None) -> tuple[bytes, list[bytes]]:
    """What one connection answers to ``stream`` read whole (``chunk`` None) or ``chunk`` bytes at a time, and
    the bodies its handler saw."""
    clock = Clock()
    site, res = make_site(clock)
    channel, transport = connect(site)
    for start in range(0, len(stream), chunk or len(stream)):
        channel.dataReceived(stream[start:start + (chunk or len(stream))])
        clock.advance(0)
    for _ in range(10):  # pipelined requests past the burst wait a reactor turn each
        clock.advance(0.01)
    reply = re.sub(rb"Date: [^\r]*\r\n", b"", transport.value())  # the wall clock's second may turn between runs
    lose(channel, transport)
    return reply, res.posted


def _post(body: bytes, extra: bytes = b"") -> bytes:
    return b"POST /x HTTP/1.1\r\nHost: h\r\n" + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body


@pytest.mark.parametrize("stream", [
    _post(b"a" * 1000) + _post(b"b" * 1000) + _post(b"c" * 200),  # pipelined heads and bodies in one read
    _post(b"d" * 1000, b"X-Long: " + b"v" * 3000 + b"\r\n"),  # a header line of 3 KB: within the head's limits
    _post(b"e" * 100, b"X-Huge: " + b"v" * 20000 + b"\r\n"),  # a line past MAX_LENGTH: refused, 431
    REQUEST * 90 + b"GET /ok HTTP/1.1\r\nHost",  # pipelined GETs, the last one's head cut short
    _post(b"f" * 1000)[:60] + b"\r\n\r\n" + b"g" * 3000,  # a head that ends early: the rest is its body or junk
])
def test_a_request_read_whole_is_served_as_when_it_comes_in_pieces(stream):
    """A read that holds a whole head (and more) has its lines cut in place (svc.web.headlines), not by twisted's
    LineReceiver, which copies the rest of the read once per line: the replies and the bodies handed to the
    handler are the same as when the same bytes come a few at a time."""
    whole = _served(stream, None)
    assert whole == _served(stream, 7)
    assert whole[0].startswith(b"HTTP/1.1 ")


def test_a_request_whose_client_went_before_its_reply_gets_its_499_access_line():
    """No reply goes out, but the access log still has one line per request: 499 (nginx's "client closed
    request"), with the time it had been handled; answered requests keep their own code and are not repeated."""
    from twisted.logger import capturedLogs

    clock = Clock()
    site, res = make_site(clock)
    channel, transport = connect(site)
    with capturedLogs() as events:
        channel.dataReceived(REQUEST)  # answered at once
        channel.dataReceived(b"GET /slow HTTP/1.1\r\nHost: x\r\nX-Request-ID: gone-1\r\n\r\n")
        clock.advance(2.5)
        lose(channel, transport)
    lines = [e["access_line"] for e in events if "access_line" in e]
    assert lines == ["GET /ok 200 0.0ms key=- rid=-", "GET /slow 499 2500.0ms key=- rid=gone-1"]
    assert len(res.pending) == 1  # the handler was not answered: nothing was written after the loss


def test_a_request_whose_client_went_mid_upload_gets_its_499_access_line():
    """A client that sent a head with ``Content-Length``, part of the body, then closed was logged nowhere (logs
    probe, on every process): its head named it, so it gets the 499 line too, with the method and path of its head,
    its request id and the time since its head; a connection that went before a whole head is no request."""
    from twisted.logger import capturedLogs

    clock = Clock()
    site, res = make_site(clock)
    with capturedLogs() as events:
        channel, transport = connect(site)
        channel.dataReceived(b"POST /x HTTP/1.1\r\nHost: h\r\nX-Request-ID: cut-1\r\nContent-Length: 500\r\n\r\n"
                             + b"a" * 100)
        clock.advance(1.5)
        lose(channel, transport)
        channel, transport = connect(site)
        channel.dataReceived(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Le")  # no whole head
        lose(channel, transport)
    assert [e["access_line"] for e in events if "access_line" in e] == ["POST /x 499 1500.0ms key=- rid=cut-1"]
    assert res.posted == [] and transport.value() == b""  # no handler ran, nothing was written


@pytest.mark.parametrize("chunks", [b"5\r\nhello\r\nzz\r\n", b"-10\r\n", b"5\r\nhelloXX"])
def test_a_body_refused_for_its_framing_has_one_access_line_its_400(chunks):
    """An HTTP probe: a bad chunk size got its 400 (logged), and the close that followed logged a second line for
    the same request, "499" as if its client had gone, on the gateway and the model server."""
    from twisted.logger import capturedLogs

    clock = Clock()
    site, res = make_site(clock)
    with capturedLogs() as events:
        channel, transport = connect(site)
        channel.dataReceived(b"POST /x HTTP/1.1\r\nHost: h\r\nX-Request-ID: dbl-1\r\nTransfer-Encoding: chunked\r\n\r\n"
                             + chunks)
        assert transport.value().startswith(b"HTTP/1.1 400 Bad Request")
        lose(channel, transport)
    lines = [e["access_line"] for e in events if "access_line" in e]
    assert len(lines) == 1 and lines[0].startswith("POST /x 400 "), lines
    assert res.posted == []


def test_while_the_process_stops_every_connection_closes_after_its_reply():
    """site.closing (a model server's drain): a kept-alive connection would be reused by the gateway's pool right
    when the stop cuts it (a 502); closed after its reply, the next request goes on a new connection."""
    clock = Clock()
    site, _ = make_site(clock)
    channel, transport = connect(site)
    channel.dataReceived(REQUEST)
    assert b"connection: close" not in transport.value().lower() and not transport.disconnecting
    site.closing = True
    channel.dataReceived(REQUEST)
    assert transport.value().count(b"HTTP/1.1 200 OK") == 2
    assert b"Connection: close" in transport.value() and transport.disconnecting


def test_the_access_line_logs_a_clients_request_id_only_when_it_is_valid():
    """A reply without an id of its own (a preflight, /metrics, a listener's early answer) was logged with the
    client's header as sent: a forged ``200 1.0ms key=tenant-a`` in the line, terminal escapes, or 16 KB ids that
    rotated every earlier line out of the log.  An early answer logs the id its reply carries."""
    from twisted.logger import capturedLogs

    clock = Clock()
    res = Ok()
    site = JsonSite(res, max_body_bytes=8, busy_reply=busy, limits=HttpLimits(), timeout=660, reactor=clock,
                    oversize_reply=lambda r: (413, {"X-Request-ID": "made-1"}, b"{}"))
    forged = [b"x 200 1.0ms key=tenant-a rid=z", b"\x1b[31mred", b"F" * 129, b"caf\xc3\xa9"]
    with capturedLogs() as events:
        for rid in [*forged, b"ok-7"]:
            channel, transport = connect(site)
            channel.dataReceived(b"GET /ok HTTP/1.1\r\nHost: x\r\nX-Request-ID: " + rid + b"\r\n\r\n")
            lose(channel, transport)
        channel, transport = connect(site)
        channel.dataReceived(b"POST /ok HTTP/1.1\r\nHost: x\r\nContent-Length: 99\r\nX-Request-ID: \x1b]0;t\r\n\r\n")
        lose(channel, transport)
    lines = [e["access_line"] for e in events if "access_line" in e]
    assert lines == [*["GET /ok 200 0.0ms key=- rid=-"] * len(forged), "GET /ok 200 0.0ms key=- rid=ok-7",
                     "POST /ok 413 0.0ms key=- rid=made-1"]


def test_empty_lines_before_a_request_count_in_the_heads_size():
    """Empty lines before a request line are ignored (RFC 9112 section 2.2), however many, within the head's
    16 KiB: a request after 100 is served, and 16 KiB of them alone is the 431 of a head too large."""
    clock = Clock()
    site, _ = make_site(clock)
    channel, transport = connect(site)
    channel.dataReceived(b"\r\n" * 100 + REQUEST)
    assert transport.value().startswith(b"HTTP/1.1 200 OK") and not transport.disconnecting
    transport.clear()
    channel.dataReceived(b"\r\n" * 8192)
    assert not transport.disconnecting  # 16384 bytes: the limit itself
    channel.dataReceived(b"\r\n")
    assert transport.value().startswith(b"HTTP/1.1 431 Request Header Fields Too Large") and transport.disconnecting


def test_a_chunked_body_is_413_once_its_bytes_pass_the_limit_and_a_huge_chunk_size_alone_waits():
    """docs/ARCHITECTURE.md, "Body limit": a chunk-size line is no body yet, however large; the 413 comes when the
    bytes received pass max_body_bytes (1024 here), and a body that never comes gets the 408 of body_timeout_ms."""
    head = b"POST /ok HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nfffffff\r\n"
    clock = Clock()
    site, _ = make_site(clock, body_timeout_ms=5000)
    channel, transport = connect(site)
    channel.dataReceived(head + b"a" * 1024)
    assert transport.value() == b""
    channel.dataReceived(b"a")
    assert transport.value().startswith(b"HTTP/1.1 413 ")
    channel, transport = connect(site)
    channel.dataReceived(head)
    clock.advance(4.999)
    assert transport.value() == b""
    clock.advance(0.002)
    assert transport.value().startswith(b"HTTP/1.1 408 Request Timeout")


@pytest.mark.parametrize("version, first", [(b"HTTP/1.2", b"HTTP/1.1 200 OK"), (b"HTTP/1.9", b"HTTP/1.1 200 OK"),
                                            (b"HTTP/1.10", b"HTTP/1.1 400 Bad Request"),  # one digit, RFC 9112
                                            (b"HTTP/2.0", b"HTTP/1.1 400 Bad Request"),
                                            (b"HTTP/1.02", b"HTTP/1.1 400 Bad Request")])
def test_a_later_minor_version_is_read_as_http_1_1(version, first):
    """An HTTP probe: ``HTTP/1.2`` was a 400, where RFC 9112 section 2.3 has a server read a later minor version
    of its major one as the highest it speaks; another major version (HTTP/2.0 as text) stays a 400."""
    site, res = make_site(Clock())
    channel, transport = connect(site)
    channel.dataReceived(b"GET /ok " + version + b"\r\nHost: x\r\n\r\n")
    assert transport.value().startswith(first + b"\r\n"), transport.value()[:200]


@pytest.mark.parametrize("target, first", [(b"ok", b"HTTP/1.1 400 Bad Request"), (b"/ok#frag", b"HTTP/1.1 400 Bad Request"),
                                           (b"http://x/ok", b"HTTP/1.1 200 OK"), (b"/ok?a=1", b"HTTP/1.1 200 OK")])
def test_a_target_that_is_no_request_target_is_a_400(target, first):
    """An HTTP probe: ``GET healthz`` (no ``/``) was routed (401 on the gateway) and ``/x#frag`` answered as a
    path (404): neither is a request target (RFC 9112 section 3.2), and docs/api.md promises such a request line
    a 400 before any route.  An absolute URL and a query are targets."""
    site, res = make_site(Clock())
    channel, transport = connect(site)
    channel.dataReceived(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert transport.value().startswith(first + b"\r\n"), transport.value()[:200]


@pytest.mark.parametrize("body, served", [
    (b"5\nhello\r\n0\r\n\r\n", False),  # the chunk-size line
    (b"5\r\nhello\r\n0\n\n", False),  # the last chunk's line
    (b"5\r\nhello\r\n0\r\nX-Trailer: 1\n\r\n", False),  # a trailer line
    (b"5\r\nhe\nlo\r\n0\r\nX-Trailer: 1\r\n\r\n", True),  # an LF inside a chunk's data is data
])
def test_a_chunk_line_ending_in_a_bare_lf_is_a_400_at_once(body, served):
    """It waited for body_timeout_ms (60 s) and got a 408 saying no byte had come, holding its connection (a
    security probe), while docs/api.md (status 50) promises bare-LF line endings a 400 at once, as in the head."""
    clock = Clock()
    site, res = make_site(clock, body_timeout_ms=5000)
    channel, transport = connect(site)
    channel.dataReceived(b"POST /ok HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
    if served:
        assert transport.value().startswith(b"HTTP/1.1 200 OK") and res.posted == [b"he\nlo"]
        return
    head, _, reply = transport.value().partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"Connection: close" in head.split(b"\r\n")
    assert transport.disconnecting and res.posted == []


def test_a_connection_answered_early_gives_its_slot_to_a_new_one():
    """A regression probe: connections answered before their body was read (a 401, 413 or 429) linger 5 s reading
    and dropping the rest, so that their clients read the answer; opened again every 5 s, they held every slot, and
    /healthz was 503 all along. A full listener closes such a connection first for a new one."""
    clock = Clock()
    site, _ = make_site(clock, max_connections=1)
    refused, refused_transport = connect(site)
    refused.dataReceived(b"POST /ok HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n")  # over max_body_bytes
    assert refused_transport.value().startswith(b"HTTP/1.1 413 ")
    channel, transport = connect(site)  # at once: no second has passed
    assert refused_transport.disconnecting
    channel.dataReceived(REQUEST)
    assert transport.value().startswith(b"HTTP/1.1 200 OK")
    lose(refused, refused_transport)  # its end frees no slot twice
    assert (site.open_connections, site.refused_connections, site.idle.closed) == (1, 0, 1)


def test_the_model_servers_and_the_supervisors_bodies_without_a_credential_lose_their_slots_once_stalled(tmp_path):
    """A regression probe: trickled bodies of 5,000 bytes without a credential (read before their 401) held every slot
    of a model server and of the supervisor until body_timeout_ms; the gateway's were closed for new clients."""
    from svc.web.idle import STALLED_S
    from tests.support.inmemory import build_model_server
    from tests.unit.test_management_api import Harness as SupervisorHarness

    clock = Clock()
    model = build_model_server(clock)
    supervisor = SupervisorHarness(tmp_path)
    for app, path, open_path in ((model.service.app, b"/testfaults/predict", b"/healthz"),
                                 (supervisor.api, b"/api/v1/servers/AAA/start", b"/")):
        site = JsonSite.for_app(app, app.resource(), max_body_bytes=1 << 20, limits=HttpLimits(max_connections=1),
                                reactor=clock)
        trickled, trickled_transport = connect(site)
        trickled.dataReceived(b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n{")
        _, refused = connect(site)
        assert refused.value().startswith(b"HTTP/1.1 503 ") and not trickled_transport.disconnecting
        clock.advance(STALLED_S)
        healthy, transport = connect(site)
        assert trickled_transport.value().startswith(b"HTTP/1.1 408 ") and trickled_transport.disconnecting, path
        healthy.dataReceived(b"GET " + open_path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert transport.value().startswith(b"HTTP/1.1 200 OK"), transport.value()[:200]
