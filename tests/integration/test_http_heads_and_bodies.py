"""Oversized heads and slow bodies on the three kinds of process, over raw sockets: a model server, a gateway,
a supervisor.

A request line longer than 16 KiB (a 70 KB path) is answered 414 and a head
larger than 16 KiB (one 70 KB header) 431, each in the process's reply
shape (the envelope, status 61, on the data plane; ``{ok: false, error}``
on the supervisor), and the connection is closed; twisted dropped the
connection without a word.  A body dripped slower than ``body_timeout_ms``
allows is answered 408 (status 408) and closed.  The process serves on
afterwards.  The framing of a request as RFC 9112 has it (found by a probe
with raw sockets): ``Connection`` options, ``Transfer-Encoding``, ``Host``,
line ends, empty lines, header fields sent on two lines, the ``*`` target,
and the headers of the replies written before any route.
"""

from __future__ import annotations

import gzip
import json
import re
import socket
import time

import pytest

from svc.contract.protocol import SUPERVISOR_PORT
from tests.support.gateway import GATEWAY_TOKENS, start_gateway
from tests.support.http import get, post, raw_exchange
from tests.support.processes import start_model_server, wait_until, write_config
from tests.support.stack import build_stack, stop_stack

BIG = 70_000
#: The processes' body_timeout_ms here.
BODY_TIMEOUT_MS = 1000
#: The gateway's key_max_in_flight here (its static token's requests count as one key's).
KEY_MAX_IN_FLIGHT = 3
#: Where each process gets the slow body (the deadline runs before any route is chosen).
POST_PATHS = {"model": b"/testfaults/predict", "gateway": b"/v1/models/TESTFAULTS/infer",
              "supervisor": b"/api/v1/servers/TESTFAULTS/start"}


@pytest.fixture(scope="module")
def processes(tmp_path_factory):
    """name -> (port, url, reply shape) of a running model server, gateway and supervisor."""
    root = tmp_path_factory.mktemp("heads")
    model = start_model_server(write_config(root, "TESTFAULTS", name="TESTFAULTS.toml",
                                            body_timeout_ms=BODY_TIMEOUT_MS))
    servers = root / "server"
    servers.mkdir()
    # The gateway routes to it: a route whose model the catalog lacks is 404 whatever the method.
    write_config(servers, "TESTFAULTS", name="TESTFAULTS.toml", port=model.port)
    gateway = start_gateway(root, servers, "# no keys: the static token only\n",
                            gateway_table=f"body_timeout_ms = {BODY_TIMEOUT_MS}\n"
                                          f"key_max_in_flight = {KEY_MAX_IN_FLIGHT}\n",
                            env={"SERVICE_UPSTREAM_TOKEN": "model-token"})
    stack = build_stack(root / "stack", {}, supervisor_extra=f"body_timeout_ms = {BODY_TIMEOUT_MS}\n")
    yield {"model": (model.port, model.url, "envelope"), "gateway": (gateway.port, gateway.url, "envelope"),
           "supervisor": (stack.supervisor.port, stack.url, "ok-error"), "model process": model,
           "gateway process": gateway,
           "tokens": {"model": "model-token", "gateway": GATEWAY_TOKENS["SERVICE_GATEWAY_AUTH_TOKEN"],
                      "supervisor": stack.env["SERVICE_API_TOKEN"]}}
    stop_stack(stack)
    gateway.stop()
    model.stop()


#: An IMF-fixdate (RFC 9110 section 5.6.7), as twisted writes ``Date``.
HTTP_DATE = r"(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} \d\d:\d\d:\d\d GMT"


def split(reply: bytes) -> tuple[bytes, dict[str, str], bytes]:
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    headers = {k.decode().lower(): v.decode().strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    return lines[0], headers, body


def assert_refusal(reply: bytes, status_line: bytes, shape: str, text: str,
                   status: tuple[int, str] = (61, "ENTITY_TOO_LARGE")) -> None:
    first, headers, body = split(reply)
    assert first == status_line, reply[:300]
    assert headers["content-type"] == "application/json; charset=utf-8" and headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)
    assert re.fullmatch(HTTP_DATE, headers["date"]), headers  # RFC 9110 section 6.6.1, as on routed replies
    got = json.loads(body)
    if shape == "envelope":
        assert (got["status"], got["status_str"], got["results"]) == (*status, []), got
        assert text in got["error"], got
        assert headers["x-request-id"] == got["task_id"]
    else:
        assert got["ok"] is False and text in got["error"], got


def assert_serving(url: str, name: str) -> None:
    assert get(url + ("/ui/favicon.svg" if name == "supervisor" else "/healthz"), timeout=10).status == 200


@pytest.mark.parametrize("name", ["model", "gateway", "supervisor"])
def test_a_70_kb_path_is_414(processes, name):
    port, url, shape = processes[name]
    reply = raw_exchange(port, b"GET /" + b"a" * BIG + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_refusal(reply, b"HTTP/1.1 414 Request-URI Too Long", shape, "the path is too long")
    assert_serving(url, name)


@pytest.mark.parametrize("name", ["model", "gateway", "supervisor"])
def test_a_70_kb_header_is_431(processes, name):
    """The X-Request-ID line right before the big one is echoed: twisted holds a header line back until the next
    starts (to join a folded one), and the 431 of that next line ignored it (a generated id)."""
    port, url, shape = processes[name]
    reply = raw_exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Request-ID: lim-431a\r\nX-Big: " + b"b" * BIG
                         + b"\r\n\r\n")
    assert_refusal(reply, b"HTTP/1.1 431 Request Header Fields Too Large", shape, "request head")
    if shape == "envelope":
        assert json.loads(split(reply)[2])["task_id"] == "lim-431a", reply[:300]
    assert_serving(url, name)


def assert_oip_refusal(reply: bytes, status_line: bytes, text: str) -> None:
    """The protocol's ``{"error"}`` (docs/oip.md), with the headers of every data-plane reply."""
    first, headers, body = split(reply)
    assert first == status_line, reply[:300]
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert re.fullmatch(HTTP_DATE, headers["date"]), headers
    assert headers["cache-control"] == "no-store" and len(headers["x-request-id"]) == 32
    assert list(json.loads(body)) == ["error"] and text in json.loads(body)["error"], body


@pytest.mark.parametrize("name", ["model", "gateway"])
def test_heads_too_large_under_v2_answer_in_the_protocols_shape(processes, name):
    """A 414, a 431 and the 400 of a head that is not HTTP came back under /v2 in the /v1 envelope: the reply is
    made before any request exists, so the shape is chosen from the path read so far."""
    port, url, _ = processes[name]
    reply = raw_exchange(port, b"GET /v2/models/" + b"a" * BIG + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_oip_refusal(reply, b"HTTP/1.1 414 Request-URI Too Long", "the path is too long")
    reply = raw_exchange(port, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * BIG + b"\r\n\r\n")
    assert_oip_refusal(reply, b"HTTP/1.1 431 Request Header Fields Too Large", "request head")
    reply = raw_exchange(port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
    assert_oip_refusal(reply, b"HTTP/1.1 400 Bad Request", "not valid HTTP/1.1")  # unparsable framing
    for head in (b"GET /v2/health/live HTTP/1.1\nHost: x\n\n", b"GET /v2/health/live HTTP/1.1\r\nHost: x\n\n"):
        reply = raw_exchange(port, head, timeout=5)  # a bare LF: the request line itself unparsed (an OIP probe)
        assert_oip_refusal(reply, b"HTTP/1.1 400 Bad Request", "bare LF")
    reply = raw_exchange(port, b"GET /v2x/" + b"a" * BIG + b" HTTP/1.1\r\nHost: x\r\n\r\n")  # not under /v2
    assert_refusal(reply, b"HTTP/1.1 414 Request-URI Too Long", "envelope", "the path is too long")
    assert_serving(url, name)


@pytest.mark.parametrize("name", ["model", "gateway"])
def test_many_headers_past_16_kib_in_all_are_431(processes, name):
    """Each header line is short; together they pass the head's 16 KiB (twisted answered a bare 400)."""
    port, _, shape = processes[name]
    headers = b"".join(b"X-H%d: %s\r\n" % (i, b"c" * 90) for i in range(250))
    reply = raw_exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
    assert_refusal(reply, b"HTTP/1.1 431 Request Header Fields Too Large", shape, "request head")


@pytest.mark.parametrize("name", ["model", "gateway"])
def test_a_head_of_16_kib_with_its_line_ends_is_served_and_one_byte_more_is_431(processes, name):
    """The head's size is its bytes as sent, CRLFs included: 450 short lines passed 900 bytes over."""
    port, _, shape = processes[name]

    def head(size: int) -> bytes:
        start = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        lines = b"".join(b"X%03d: 1234567890\r\n" % i for i in range(400))  # 400 x 19 bytes
        last = b"Y: " + b"y" * (size - len(start) - len(lines) - len(b"Y: \r\n\r\n")) + b"\r\n"
        whole = start + lines + last + b"\r\n"
        assert len(whole) == size
        return whole

    assert split(raw_exchange(port, head(16384)))[0] == b"HTTP/1.1 200 OK"
    assert_refusal(raw_exchange(port, head(16385)), b"HTTP/1.1 431 Request Header Fields Too Large", shape,
                   "request head")


@pytest.mark.parametrize("name", ["model", "gateway", "supervisor"])
def test_more_than_500_header_lines_within_16_kib_are_431_and_500_are_served(processes, name):
    """twisted's own limit of 500 header lines: the 501st got a bare 400; now the 431 of a head too large."""
    port, url, shape = processes[name]
    def head(count: int) -> bytes:  # ``count`` header lines in all
        return (b"GET /healthz HTTP/1.1\r\n" + b"".join(b"X%d: 1\r\n" % i for i in range(count - 2))
                + b"Host: x\r\nConnection: close\r\n\r\n")

    reply = raw_exchange(port, head(501))
    assert_refusal(reply, b"HTTP/1.1 431 Request Header Fields Too Large", shape, "more than 500 header lines")
    path = b"/ui/favicon.svg" if name == "supervisor" else b"/healthz"
    assert split(raw_exchange(port, head(500).replace(b"/healthz", path, 1)))[0] == b"HTTP/1.1 200 OK"
    assert_serving(url, name)


@pytest.mark.parametrize("name", ["model", "gateway", "supervisor"])
def test_a_body_dripped_past_body_timeout_ms_is_408(processes, name):
    """A real slow client: headers at once, then one body byte every 100 ms, each byte in time for an idle
    timeout, the whole body never: 408 with the reply shape once body_timeout_ms has passed, then closed."""
    port, url, shape = processes[name]
    received, dripped = b"", 0
    # With its credential: the gateway answers a request without one 401 before reading any body.
    auth = b"Authorization: Bearer " + processes["tokens"][name].encode() + b"\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST " + POST_PATHS[name] + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 50000\r\nX-Request-ID: slow-body-1\r\n" + auth + b"\r\n")
        sock.settimeout(0.1)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                try:
                    dripped += sock.send(b" ")
                except (BrokenPipeError, ConnectionResetError):
                    break
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break  # closed after the reply
            received += chunk
    assert dripped >= 3  # the body was on its way when the deadline came
    assert_refusal(received, b"HTTP/1.1 408 Request Timeout", shape, f"within {BODY_TIMEOUT_MS} ms",
                   status=(408, "REQUEST_TIMEOUT"))
    if shape == "envelope":
        assert split(received)[1]["x-request-id"] == "slow-body-1"
    assert_serving(url, name)


#: Requests twisted cannot parse: each got its bare ``400 Bad Request`` with no body, no counter, no access line.
MALFORMED = {
    "request line": b"garbage\r\n\r\n",
    "content-length": b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    "two framings": b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc",
    "chunk size": b"POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    "header line": b"GET /healthz HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
    # RFC 9112 section 3.2: an HTTP/1.1 request without Host, or any with two, is a 400 (twisted served both).
    "no host": b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n",
    "two hosts": b"GET /healthz HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
    "two hosts, a body": b"POST /healthz HTTP/1.1\r\nHost: x\r\nHost: y\r\nContent-Length: 3\r\n\r\nabc",
    # RFC 9112 section 3.2: Host is a host and an optional port (twisted served any value).
    "host not an authority": b"GET /healthz HTTP/1.1\r\nHost: a b/c\r\n\r\n",
    "host with a path, a body": b"POST /healthz HTTP/1.1\r\nHost: x/y\r\nContent-Length: 3\r\n\r\nabc",
}


@pytest.mark.parametrize("name", ["model", "gateway", "supervisor"])
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_request_twisted_cannot_parse_gets_the_process_400_and_closes(processes, name, case):
    port, url, shape = processes[name]
    head = MALFORMED[case]
    if name != "supervisor":  # with a credential: the data plane answers 401 to a valid head without one, unread
        head = head.replace(b"\r\n", b"\r\nAuthorization: Bearer " + processes["tokens"][name].encode() + b"\r\n", 1)
    reply = raw_exchange(port, head)
    assert_refusal(reply, b"HTTP/1.1 400 Bad Request", shape, "malformed HTTP request",
                   status=(50, "JSON_PARSE_ERROR"))
    assert_serving(url, name)


@pytest.mark.parametrize("name", ["model", "gateway", "supervisor"])
def test_an_http_1_0_request_without_host_is_served(processes, name):
    """Host is required of HTTP/1.1 only: an HTTP/1.0 client (``ab``, old tools) may leave it out."""
    port, _, _ = processes[name]
    path = b"/ui/favicon.svg" if name == "supervisor" else b"/healthz"
    reply = raw_exchange(port, b"GET " + path + b" HTTP/1.0\r\n\r\n")
    assert split(reply)[0] == b"HTTP/1.0 200 OK", reply[:300]  # twisted answers in the version asked


def test_a_request_twisted_cannot_parse_is_counted_and_logged(processes):
    """operations.md: the counter has every reply (method ``-`` before it was read), one access line each."""
    port, url, _ = processes["model"]
    metric = 'service_http_requests_total{code="400",method="%s",route="unmatched"}'

    def count(method: str) -> float:
        text = get(url + "/metrics", headers={"Authorization": "Bearer model-token"}, timeout=10).body.decode()
        line = [x for x in text.splitlines() if x.startswith(metric % method + " ")]
        return float(line[0].split()[1]) if line else 0.0

    before = count("-"), count("POST")
    chunked = MALFORMED["chunk size"].replace(b"\r\n", b"\r\nAuthorization: Bearer model-token\r\n", 1)  # else 401
    ids = [split(raw_exchange(port, head))[1]["x-request-id"] for head in (MALFORMED["request line"], chunked)]
    assert (count("-"), count("POST")) == (before[0] + 1, before[1] + 1)
    lines = processes["model process"].output().splitlines()
    # the line names the reply's request id (it said rid=- while the reply carried one)
    assert any(re.search(rf" - - 400 [0-9.]+ms key=- rid={ids[0]}$", line) for line in lines), lines[-5:]
    assert any(re.search(rf" POST /healthz 400 [0-9.]+ms key=- rid={ids[1]}$", line) for line in lines), lines[-5:]


@pytest.mark.parametrize("name", ["model", "gateway", "supervisor"])
@pytest.mark.parametrize("method", [b"post", b"Post"])
def test_a_method_is_case_sensitive_so_post_in_lower_case_is_405(processes, name, method):
    """RFC 9110: methods are case-sensitive. werkzeug matched them upper-cased, so ``post`` ran the POST routes
    of every process: the gateway admitted and charged it, then forwarded it without its body (it sends one with
    ``POST`` only), and the model server answered 400 "body is not valid JSON". A method in another case is one no
    route has: 405 status 62 with ``Allow``, after authentication, like any other."""
    port, url, shape = processes[name]
    token = processes["tokens"][name].encode()
    body = b'{"images": []}'
    reply = raw_exchange(port, method + b" " + POST_PATHS[name] + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                         b"Authorization: Bearer " + token + b"\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    first, headers, data = split(reply)
    assert first == b"HTTP/1.1 405 Method Not Allowed", reply[:400]
    assert "POST" in headers["allow"].split(", "), headers
    got = json.loads(data)
    if shape == "envelope":
        assert (got["status"], got["status_str"]) == (62, "METHOD_NOT_ALLOWED"), got
    else:
        assert got["ok"] is False, got
    assert f"method {method.decode()} not allowed" in got["error"], got
    assert_serving(url, name)


def test_a_credential_sent_in_the_query_string_is_not_written_to_the_access_log(processes):
    """The service reads credentials from Authorization only; a client that sent its key as ``?api_key=`` (a 401)
    had it written whole to the log, which the management API serves (secrets probe)."""
    port, url, _ = processes["model"]
    secret = "sk-live-" + "Z" * 24
    for path in (f"/testfaults/predict?api_key={secret}&timeout=5", f"/healthz?x=1&access_token={secret}",
                 f"/healthz?bearer={secret}", f"/healthz?%74oken={secret}", f"/healthz?a=1;token={secret}",
                 f"/healthz;api_key={secret}?x=1"):
        raw_exchange(port, f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
                     .encode())
    def redacted() -> list[str]:
        found = [x for x in processes["model process"].output().splitlines() if "REDACTED" in x]
        return found if len(found) >= 6 else []

    lines = wait_until(redacted, "two access lines", timeout=10)
    output = processes["model process"].output()
    assert secret not in output and "ZZZZ" not in output
    assert any("POST /testfaults/predict?api_key=REDACTED&timeout=5 401" in x for x in lines), lines
    assert any("POST /healthz?x=1&access_token=REDACTED 405" in x for x in lines), lines
    for shown in ("/healthz?bearer=REDACTED ", "/healthz?%74oken=REDACTED ", "/healthz?a=1;token=REDACTED ",
                  "/healthz;api_key=REDACTED?x=1 "):  # a percent-encoded name, ";" separators, a path parameter
        assert any(shown in x for x in lines), (shown, lines)


def test_a_control_character_of_a_path_is_written_escaped_in_the_access_log(processes):
    """A DEL in the path (twisted parses it; an ESC is a 400) was written to the log as the raw byte, and an ESC
    of a path too long for twisted to parse (a 414) too: what a terminal showed of the log changed."""
    port, _, _ = processes["model"]
    raw_exchange(port, b"GET /x\x7fy HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    raw_exchange(port, b"GET /esc\x1b[2J" + b"a" * BIG + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    def logged() -> list[str]:
        lines = processes["model process"].output().splitlines()
        found = [x for x in lines if "GET /x\\x7fy " in x or "GET /esc\\x1b[2Jaaa" in x]
        return found if len(found) == 2 else []

    lines = wait_until(logged, "both access lines, escaped", timeout=10)
    assert re.search(r"GET /x\\x7fy 404 ", lines[0]) and " 414 " in lines[1], lines


@pytest.mark.parametrize("name", ["model", "gateway"])
@pytest.mark.parametrize("request_line", [b"GET /healthz", b"GET /nowhere", b"POST /nowhere"])
def test_x_request_id_is_spelled_as_the_contract_spells_it(processes, name, request_line):
    """twisted.web wrote ``X-Request-Id`` on every routed reply, while the early replies (413, 431, 408) wrote
    ``X-Request-ID``, the contract's spelling: a client or log filter matching it saw two names."""
    port, url, shape = processes[name]
    token = processes["tokens"][name].encode()
    reply = raw_exchange(port, request_line + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Request-ID: rid-7\r\n"
                         b"Authorization: Bearer " + token + b"\r\nContent-Length: 0\r\n\r\n")
    head = reply.partition(b"\r\n\r\n")[0].split(b"\r\n")
    assert b"X-Request-ID: rid-7" in head, head


#: Each process's 401 for a request with two ``Authorization`` headers.
TWO_AUTHORIZATIONS = {
    "model": "two Authorization headers were sent",
    "gateway": "two Authorization headers were sent: send Authorization: Bearer <API key or token>",
    "supervisor": "two Authorization headers were sent (Authorization: Bearer <SERVICE_API_TOKEN>)",
}


@pytest.mark.parametrize("name", ["model", "gateway", "supervisor"])
def test_two_authorization_headers_carry_no_credential(processes, name):
    """The first of two ``Authorization`` headers won (good then bad: 200; bad then good: 401), where a proxy in
    front that checks the last would disagree (security probe): with two, a request is unauthenticated, 401."""
    port, url, shape = processes[name]
    token = processes["tokens"][name].encode()
    body = b'{"images": []}'

    def post(*credentials: bytes) -> bytes:
        auth = b"".join(b"Authorization: Bearer " + c + b"\r\n" for c in credentials)
        return raw_exchange(port, b"POST " + POST_PATHS[name] + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + auth
                            + b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
                            + b"\r\n\r\n" + body)

    def wrong_credentials() -> float:  # operations.md: two Authorization headers count as reason "wrong"
        text = get(url + "/metrics", headers={"Authorization": "Bearer gw-metrics-token"}, timeout=10).body.decode()
        line = [x for x in text.splitlines() if x.startswith('service_gateway_auth_failures_total{reason="wrong"} ')]
        return float(line[0].split()[1]) if line else 0.0

    before = wrong_credentials() if name == "gateway" else 0.0
    assert split(post(token))[0] != b"HTTP/1.1 401 Unauthorized"  # one: authenticated (422, or 200 on the supervisor)
    for credentials in ((token, token), (token, b"wrong"), (b"wrong", token)):
        first, _, data = split(post(*credentials))
        assert first == b"HTTP/1.1 401 Unauthorized", (credentials, data)
        got = json.loads(data)
        assert (got["status"], got["status_str"]) == (401, "UNAUTHORIZED") if shape == "envelope" else got["ok"] is False
        # It said "missing bearer token" (the gateway) or "missing or wrong ..." to a client that sent two.
        assert got["error"] == TWO_AUTHORIZATIONS[name], got
    if name == "gateway":
        assert wrong_credentials() == before + 3
    assert_serving(url, name)


def test_two_authorization_headers_on_the_gateways_metrics_are_a_wrong_credential(processes):
    """``GET /metrics`` with two ``Authorization`` headers (each the metrics token) was counted as ``missing`` and
    answered with the usual hint, where every other route says "two Authorization headers were sent" and counts
    ``wrong`` (docs/operations.md; metrics probe)."""
    port, url, _ = processes["gateway"]

    def wrong_credentials() -> float:
        text = get(url + "/metrics", headers={"Authorization": "Bearer gw-metrics-token"}, timeout=10).body.decode()
        line = [x for x in text.splitlines() if x.startswith('service_gateway_auth_failures_total{reason="wrong"} ')]
        return float(line[0].split()[1]) if line else 0.0

    before = wrong_credentials()
    twice = b"Authorization: Bearer gw-metrics-token\r\n" * 2
    first, _, data = split(raw_exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                        + twice + b"\r\n"))
    assert first == b"HTTP/1.1 401 Unauthorized", data
    got = json.loads(data)
    assert (got["status"], got["error"]) == (
        401, "two Authorization headers were sent: GET /metrics needs Authorization: Bearer <SERVICE_METRICS_TOKEN>")
    assert wrong_credentials() == before + 1


@pytest.mark.parametrize("name", ["model", "gateway", "supervisor"])
def test_a_request_target_in_absolute_form_is_its_path(processes, name):
    """RFC 9112 section 3.2.2: a server accepts ``GET http://host:port/path`` (what a client set up to use a proxy
    sends); twisted took the whole URL as the path, so every such request was 404 (found by an HTTP probe)."""
    port, url, _ = processes[name]
    path = b"/ui/favicon.svg" if name == "supervisor" else b"/healthz"
    for target in (b"http://127.0.0.1:%d" % port + path, b"HTTP://localhost" + path + b"?x=1"):
        reply = raw_exchange(port, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert split(reply)[0] == b"HTTP/1.1 200 OK", reply[:300]


def probe_path(name: str) -> bytes:
    """A GET that each process answers 200 without a credential."""
    return b"/ui/favicon.svg" if name == "supervisor" else b"/healthz"


@pytest.mark.parametrize("name", ["model", "gateway", "supervisor"])
@pytest.mark.parametrize("connection", [b"Connection: close, X-Foo\r\n", b"Connection: keep-alive\r\nConnection: Close\r\n",
                                        b"Connection: X-Foo , CLOSE\r\n"], ids=["first", "second-line", "last"])
def test_connection_close_anywhere_in_the_connection_lines_closes_after_the_reply(processes, name, connection):
    """RFC 9112 section 9.6: ``close`` among the options of any Connection line closes the connection after the
    reply, which says ``Connection: close``; twisted read only the first line, split at spaces, so these stayed
    open (the read below timed out)."""
    port, _, _ = processes[name]
    reply = raw_exchange(port, b"GET " + probe_path(name) + b" HTTP/1.1\r\nHost: x\r\n" + connection + b"\r\n",
                         timeout=5)
    first, headers, _ = split(reply)
    assert (first, headers["connection"]) == (b"HTTP/1.1 200 OK", "close"), reply[:300]


@pytest.mark.parametrize("name", ["model", "gateway"])
def test_every_content_encoding_line_is_judged(processes, name):
    """``Content-Encoding: identity`` then ``gzip`` on a second line: only the first was read, and the gzip body
    was answered 400 "body is not valid JSON"; the lines are one list (RFC 9110 section 5.3): 415 status 60."""
    port, _, _ = processes[name]
    token = processes["tokens"][name].encode()
    body = gzip.compress(b'{"images": ["AAAA"]}')
    reply = raw_exchange(port, b"POST " + POST_PATHS[name] + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                         b"Authorization: Bearer " + token + b"\r\nContent-Type: application/json\r\n"
                         b"Content-Encoding: identity\r\nContent-Encoding: gzip\r\nX-Request-ID: two-codings\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    first, headers, data = split(reply)
    assert (first, headers["x-request-id"]) == (b"HTTP/1.1 415 Unsupported Media Type", "two-codings"), reply[:400]
    assert headers["accept-encoding"] == "identity"  # what is taken (RFC 9110 section 15.5.16), through the gateway
    got = json.loads(data)
    assert (got["status"], got["status_str"]) == (60, "UNSUPPORTED_MEDIA_TYPE"), got
    assert got["error"] == "unsupported content encoding 'identity, gzip': send the body uncompressed", got


@pytest.mark.parametrize("name", ["model", "gateway"])
def test_a_second_x_service_params_line_is_not_ignored(processes, name):
    """A raw-body request's ``X-Service-Params`` on two lines ran with the first line's params, the second
    dropped without a word: the lines joined are not one JSON object, so 422 status 66 at ``/params``."""
    port, _, _ = processes[name]
    token = processes["tokens"][name].encode()
    body = b"\x89PNG not really"
    reply = raw_exchange(port, b"POST " + POST_PATHS[name] + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                         b"Authorization: Bearer " + token + b"\r\nContent-Type: image/png\r\n"
                         b'X-Service-Params: {}\r\nX-Service-Params: {"nope": 1}\r\n'
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    first, _, data = split(reply)
    assert first == b"HTTP/1.1 422 Unprocessable Content", reply[:400]
    got = json.loads(data)
    assert (got["status"], [e["pointer"] for e in got["errors"]]) == (66, ["/params"]), got
    assert got["errors"][0]["message"].startswith("X-Service-Params header is not valid JSON"), got


#: Transfer-Encoding that does not end in chunked (RFC 9112 section 6.3): twisted ignored ``identity``.
NOT_CHUNKED = {
    "identity with a length": b"Transfer-Encoding: identity\r\nContent-Length: 2\r\n\r\n{}",
    "identity alone": b"Transfer-Encoding: identity\r\n\r\n{}",  # the body was read as the next request: a hang
    "identity after chunked": b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("name", ["model", "gateway", "supervisor"])
@pytest.mark.parametrize("case", sorted(NOT_CHUNKED))
def test_a_transfer_encoding_other_than_chunked_is_the_process_400(processes, name, case):
    port, url, shape = processes[name]
    reply = raw_exchange(port, b"POST " + POST_PATHS[name] + b" HTTP/1.1\r\nHost: x\r\n" + NOT_CHUNKED[case],
                         timeout=5)
    assert_refusal(reply, b"HTTP/1.1 400 Bad Request", shape, "Transfer-Encoding other than chunked",
                   status=(50, "JSON_PARSE_ERROR"))
    assert_serving(url, name)


@pytest.mark.parametrize("name", ["model", "gateway", "supervisor"])
def test_a_transfer_encoding_in_an_http_1_0_request_is_the_process_400(processes, name):
    """RFC 9112 section 6.1: HTTP/1.0 has no Transfer-Encoding, so its framing is faulty; it was read as chunked
    (a security probe)."""
    port, url, shape = processes[name]
    reply = raw_exchange(port, b"POST " + POST_PATHS[name] + b" HTTP/1.0\r\nHost: x\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", timeout=5)
    assert_refusal(reply, b"HTTP/1.1 400 Bad Request", shape, "Transfer-Encoding in an HTTP/1.0 request",
                   status=(50, "JSON_PARSE_ERROR"))
    assert_serving(url, name)


@pytest.mark.parametrize("name", ["model", "gateway", "supervisor"])
@pytest.mark.parametrize("head", [b"GET /healthz HTTP/1.1\nHost: x\n\n", b"GET /healthz HTTP/1.1\r\nHost: x\n\n"],
                         ids=["every-line", "after-the-request-line"])
def test_a_head_with_bare_lf_line_ends_is_the_process_400_at_once(processes, name, head):
    """A head whose lines end in LF alone was never complete to twisted: nothing came back until the bare 408
    of header_timeout_ms (10 s here, past this read's 5 s).  Now the process's 400 status 50 at once (docs/api.md)."""
    port, url, shape = processes[name]
    assert_refusal(raw_exchange(port, head, timeout=5), b"HTTP/1.1 400 Bad Request", shape, "bare LF",
                   status=(50, "JSON_PARSE_ERROR"))
    assert_serving(url, name)


@pytest.mark.parametrize("name", ["model", "gateway", "supervisor"])
def test_empty_lines_before_a_request_line_are_ignored(processes, name):
    """RFC 9112 section 2.2: a client may send a CRLF after a POST body. twisted ignored one only: the request
    after two was answered 400 and the connection closed, losing what was pipelined behind it."""
    port, _, _ = processes[name]
    reply = raw_exchange(port, b"\r\n\r\nPOST " + POST_PATHS[name] + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                         b"\r\n{}\r\n\r\n\r\nGET " + probe_path(name) + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    codes = re.findall(rb"HTTP/1\.1 (\d{3}) ", reply)
    assert codes == [b"401", b"200"], reply[:600]


@pytest.mark.parametrize("name", ["model", "gateway", "supervisor"])
def test_every_form_of_a_valid_host_is_served(processes, name):
    """A name, an IPv4 or IPv6 address, a port, or nothing (RFC 9112 section 3.2): each is served."""
    port, _, _ = processes[name]
    for host in (b"localhost", b"127.0.0.1:%d" % port, b"[::1]:80", b"[fe80::1%25lo]", b"xn--bcher-kva.example.", b""):
        reply = raw_exchange(port, b"GET " + probe_path(name) + b" HTTP/1.1\r\nHost: " + host
                             + b"\r\nConnection: close\r\n\r\n", timeout=5)
        assert split(reply)[0] == b"HTTP/1.1 200 OK", (host, reply[:300])


#: Requests refused at their head once the client's X-Request-ID was read.
REFUSED_WITH_AN_ID = {
    "content-length": b"POST /healthz HTTP/1.1\r\nHost: x\r\nX-Request-ID: early-rid-1\r\nContent-Length: abc\r\n\r\n",
    "no host": b"GET /healthz HTTP/1.1\r\nX-Request-ID: early-rid-1\r\n\r\n",
}


@pytest.mark.parametrize("name", ["model", "gateway"])
@pytest.mark.parametrize("case", sorted(REFUSED_WITH_AN_ID))
def test_an_early_400_keeps_the_clients_request_id(processes, name, case):
    """The 400 of a bad Content-Length or a missing Host replaced a valid X-Request-ID with a generated one (the
    early 413 kept it); docs/api.md: a valid client id is echoed."""
    port, _, shape = processes[name]
    reply = raw_exchange(port, REFUSED_WITH_AN_ID[case])
    assert_refusal(reply, b"HTTP/1.1 400 Bad Request", shape, "malformed HTTP request", status=(50, "JSON_PARSE_ERROR"))
    assert json.loads(split(reply)[2])["task_id"] == "early-rid-1"


def test_the_gateways_early_replies_carry_vary_origin(processes):
    """processes.md: every gateway reply carries ``Vary: Origin``; its early 400, 414 and 431 had none (its early
    413 and 408 had it), and with an allowed Origin the early replies a browser can read reflect it."""
    port, _, _ = processes["gateway"]
    heads = [b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
             b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * BIG + b"\r\n\r\n",
             b"GET /" + b"a" * BIG + b" HTTP/1.1\r\nHost: x\r\n\r\n"]
    for head in heads:
        _, headers, _ = split(raw_exchange(port, head))
        assert headers.get("vary") == "Origin" and "access-control-allow-origin" not in headers, headers
    origin = b"http://localhost:%d" % SUPERVISOR_PORT  # the gateway's default origins: the supervisor's UI
    _, headers, _ = split(raw_exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nOrigin: " + origin
                                       + b"\r\nContent-Length: abc\r\n\r\n"))
    assert (headers.get("vary"), headers.get("access-control-allow-origin")) == ("Origin", origin.decode()), headers
    # the Origin line right before the one too long: twisted held it back (to join a folded line), unread
    _, headers, _ = split(raw_exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nOrigin: " + origin
                                       + b"\r\nX-Big: " + b"b" * BIG + b"\r\n\r\n"))
    assert (headers.get("vary"), headers.get("access-control-allow-origin")) == ("Origin", origin.decode()), headers


@pytest.mark.parametrize("name", ["model", "gateway", "supervisor"])
@pytest.mark.parametrize("method", [b"GET", b"POST"])
def test_the_asterisk_target_with_another_method_than_options_is_the_process_404(processes, name, method):
    """``GET *`` got twisted's bare 405 with ``Allow: OPTIONS``: no envelope, no X-Request-ID, no authentication.
    It is answered as any path that is no route (the gateway authenticates first); ``OPTIONS *`` keeps its 200."""
    port, url, shape = processes[name]
    token = processes["tokens"][name].encode()
    for credential, code in ((b"", 401 if name == "gateway" else 404), (b"Authorization: Bearer " + token + b"\r\n", 404)):
        reply = raw_exchange(port, method + b" * HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Request-ID: star-1\r\n"
                             + credential + b"Content-Length: 0\r\n\r\n", timeout=5)
        first, headers, data = split(reply)
        assert first.startswith(b"HTTP/1.1 %d " % code), reply[:400]
        got = json.loads(data)
        if shape == "envelope":
            assert (got["status"], got["task_id"], headers["x-request-id"]) == (code if code == 401 else 63, "star-1",
                                                                                   "star-1"), got
        else:
            assert got == {"ok": False, "error": "no such route: *"}, got
    reply = raw_exchange(port, b"OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout=5)
    assert split(reply)[0] == b"HTTP/1.1 200 OK", reply[:300]


def read_reply(sock: socket.socket, timeout: float = 10.0) -> bytes:
    """What the server sends on ``sock`` until it closes (or ``timeout`` passes)."""
    sock.settimeout(timeout)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return received


#: Heads of requests with a body and no valid credential; none of them sends a byte of its body.
UNAUTHENTICATED_HEADS = {
    "no Authorization": b"",
    "a wrong token": b"Authorization: Bearer not-a-key\r\n",
    "another scheme": b"Authorization: Basic dXNlcjpwYXNz\r\n",
    "two Authorization headers": b"Authorization: Bearer gw-static-token\r\nAuthorization: Bearer gw-static-token\r\n",
}


def auth_failures(url: str) -> float:
    """``service_gateway_auth_failures_total`` over its reasons."""
    text = get(url + "/metrics", headers={"Authorization": "Bearer gw-metrics-token"}, timeout=10).body.decode()
    return sum(float(x.split()[1]) for x in text.splitlines() if x.startswith("service_gateway_auth_failures_total{"))


#: Bodies the gateway does not read without a credential: larger than 64 KiB, chunked, or awaiting 100 Continue.
UNREAD_FRAMINGS = {"900000 bytes": b"Content-Length: 900000\r\n", "chunked": b"Transfer-Encoding: chunked\r\n",
                   "100-continue": b"Content-Length: 20\r\nExpect: 100-continue\r\n"}


@pytest.mark.parametrize("framing", sorted(UNREAD_FRAMINGS))
@pytest.mark.parametrize("case", sorted(UNAUTHENTICATED_HEADS))
def test_the_gateway_answers_401_before_reading_the_body_of_a_request_without_a_credential(processes, case, framing):
    """A client without a valid key could make the gateway read and hold ``max_body_bytes`` per connection before
    its 401 (it waited for the whole body, or answered 408 at ``body_timeout_ms`` when none came).  Now the head
    decides: 401 with the envelope, ``WWW-Authenticate`` and the client's request id at once, no ``100 Continue``,
    and the connection closes; the gateway serves on."""
    port, url, _ = processes["gateway"]
    before = auth_failures(url)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /v1/models/TESTFAULTS/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + UNREAD_FRAMINGS[framing] + UNAUTHENTICATED_HEADS[case] + b"X-Request-ID: no-key-1\r\n\r\n")
        started = time.monotonic()
        received = read_reply(sock)
    assert time.monotonic() - started < BODY_TIMEOUT_MS / 1000.0  # before the body deadline's 408
    assert_refusal(received, b"HTTP/1.1 401 Unauthorized", "envelope", "send Authorization: Bearer",
                   status=(401, "UNAUTHORIZED"))
    headers = split(received)[1]
    assert headers["www-authenticate"].startswith("Bearer realm=") and headers["x-request-id"] == "no-key-1", headers
    assert headers["vary"] == "Origin" and "x-service-key" not in headers, headers
    assert auth_failures(url) == before + 1  # counted as the route's 401 is
    assert_serving(url, "gateway")


@pytest.mark.parametrize("framing", sorted(UNREAD_FRAMINGS))
@pytest.mark.parametrize("case", sorted(UNAUTHENTICATED_HEADS))
@pytest.mark.parametrize("target", [b"POST /testfaults/predict", b"GET /healthz", b"POST /v2/models/TESTFAULTS/infer"])
def test_a_model_server_answers_401_before_reading_the_body_of_a_request_without_its_token(processes, target, case,
                                                                                           framing):
    """A process on the host without the model server's token could make it read and hold ``max_body_bytes`` (32
    MiB) per connection before its 401, as the gateway's clients could: the head decides there too, whatever the
    method and path (under /v2 in the protocol's shape), and the connection closes."""
    port, url, _ = processes["model"]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(target + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + UNREAD_FRAMINGS[framing]
                     + UNAUTHENTICATED_HEADS[case] + b"\r\n")
        started = time.monotonic()
        received = read_reply(sock)
    assert time.monotonic() - started < BODY_TIMEOUT_MS / 1000.0  # before the body deadline's 408
    reason = "two Authorization headers were sent" if case.startswith("two") else "missing or wrong bearer token"
    if b"/v2/" in target:
        assert_oip_refusal(received, b"HTTP/1.1 401 Unauthorized", reason)
    else:
        assert_refusal(received, b"HTTP/1.1 401 Unauthorized", "envelope", reason, status=(401, "UNAUTHORIZED"))
    assert split(received)[1]["www-authenticate"].startswith("Bearer realm="), received[:400]
    assert_serving(url, "model")


def after_100_continue(port: int, path: bytes, token: bytes, body: bytes = b'{"images": []}') -> bytes:
    """The reply to a POST of ``body`` sent once ``Expect: 100-continue`` was answered 100 (asserted)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nExpect: 100-continue\r\nAuthorization: Bearer " + token + b"\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        sock.settimeout(10)
        interim = sock.recv(64)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n", interim
        sock.sendall(body)
        return read_reply(sock)


def test_a_model_server_reads_the_body_of_a_request_with_its_token(processes):
    """With the token, ``Expect: 100-continue`` is answered 100 and the body reaches the route."""
    first = split(after_100_continue(processes["model"][0], b"/testfaults/predict", b"model-token"))[0]
    assert first == b"HTTP/1.1 422 Unprocessable Content", first


@pytest.mark.parametrize("framing", sorted(UNREAD_FRAMINGS))
@pytest.mark.parametrize("target", [b"GET /metrics", b"GET /healthz", b"HEAD /openapi.json",
                                    b"OPTIONS /v1/models/TESTFAULTS/infer", b"GET /v1/models/TESTFAULTS/jobs/x"])
def test_every_method_without_a_credential_is_401_before_its_body(processes, target, framing):
    """A security probe: GET, HEAD and OPTIONS were left out, so a 60 MB body on ``GET /v1/models/X/infer``
    without a key was read whole (the gateway's RSS grew by the body) before its 401.  No route reads such a body,
    and ``/healthz`` and a CORS preflight, which need no credential, carry none: the same 401 from the head."""
    port, url, _ = processes["gateway"]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(target + b" HTTP/1.1\r\nHost: x\r\n" + UNREAD_FRAMINGS[framing] + b"\r\n")
        started = time.monotonic()
        received = read_reply(sock)
    assert time.monotonic() - started < BODY_TIMEOUT_MS / 1000.0
    first, headers, body = split(received)
    assert first == b"HTTP/1.1 401 Unauthorized" and headers["connection"] == "close", received[:300]
    assert json.loads(body)["status_str"] == "UNAUTHORIZED"
    assert_serving(url, "gateway")


def test_the_metrics_token_is_a_credential_before_the_body(processes):
    """The metrics token is known to the check before the body (its route checks it): ``Expect: 100-continue`` on
    ``GET /metrics`` with it is answered 100 and then the route's reply."""
    port, _, _ = processes["gateway"]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\nExpect: 100-continue\r\n"
                     b"Authorization: Bearer gw-metrics-token\r\nContent-Length: 2\r\n\r\n")
        sock.settimeout(10)
        assert sock.recv(64) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(b"{}")
        received = read_reply(sock)
    assert received.startswith(b"HTTP/1.1 200 OK\r\n") and b"service_http_requests_total" in received


def test_the_401_before_the_body_under_v2_is_in_the_protocols_shape(processes):
    """Under /v2 the early 401 is the protocol's ``{"error"}``, as the route's own 401 is (docs/oip.md)."""
    port, url, _ = processes["gateway"]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /v2/models/TESTFAULTS/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 900000\r\n\r\n")
        received = read_reply(sock)
    assert_oip_refusal(received, b"HTTP/1.1 401 Unauthorized", "missing bearer token")
    assert split(received)[1]["www-authenticate"].startswith("Bearer realm="), received[:400]
    assert_serving(url, "gateway")


def test_a_body_of_64_kib_without_a_credential_is_read_and_its_connection_stays_open(processes):
    """Up to 64 KiB the body is read as before and the route answers 401 on a connection that stays open: the
    request pipelined behind it is served."""
    port, _, _ = processes["gateway"]
    body = b"{" + b" " * (64 * 1024 - 2) + b"}"
    reply = raw_exchange(port, b"POST /v1/models/TESTFAULTS/infer HTTP/1.1\r\nHost: x\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body
                         + b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", reply) == [b"401", b"200"], reply[:600]


def test_a_request_with_a_valid_credential_still_gets_100_continue_and_its_route(processes):
    """The check before the body lets a valid credential through: ``Expect: 100-continue`` is answered 100, and
    the body sent then reaches the route (the model's 422 for an empty image list), on the same connection."""
    received = after_100_continue(processes["gateway"][0], b"/v1/models/TESTFAULTS/infer", b"gw-static-token")
    first, headers, data = split(received)
    assert first == b"HTTP/1.1 422 Unprocessable Content", received[:300]
    assert headers["x-service-key"] == "static-token" and json.loads(data)["status_str"] != "UNAUTHORIZED", headers



def test_an_unknown_model_is_counted_as_a_path_that_is_no_route(processes):
    """docs/operations.md: a path that is no route is ``route="unmatched"``, and an unknown model id gets the same 404
    (docs/processes.md); a soak probe found that 404 counted under the route's name (``route="infer"``)."""
    port, url, _ = processes["gateway"]

    def count(route: str) -> float:
        text = get(url + "/metrics", headers={"Authorization": "Bearer gw-metrics-token"}, timeout=10).body.decode()
        sample = f'service_http_requests_total{{code="404",method="POST",protocol="contract",route="{route}"}} '
        return next((float(x.split()[-1]) for x in text.splitlines() if x.startswith(sample)), 0.0)

    before = count("unmatched"), count("infer")
    for path in (b"/v1/models/NOPE/infer", b"/v1/models/TESTFAULTS/nowhere"):
        reply = raw_exchange(port, b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                             b"Authorization: Bearer gw-static-token\r\nContent-Length: 2\r\n\r\n{}")
        assert reply.startswith(b"HTTP/1.1 404 Not Found\r\n"), reply[:300]
    assert (count("unmatched"), count("infer")) == (before[0] + 2, before[1])


def in_flight_rejections(url: str) -> float:
    """``service_gateway_key_rejections_total{reason="in_flight"}`` of the static token."""
    text = get(url + "/metrics", headers={"Authorization": "Bearer gw-metrics-token"}, timeout=10).body.decode()
    sample = 'service_gateway_key_rejections_total{key="static-token",reason="in_flight"} '
    return next((float(x.split()[-1]) for x in text.splitlines() if x.startswith(sample)), 0.0)


def test_a_keys_uploads_hold_its_in_flight_slots_from_their_heads(processes):
    """A probe: ``key_max_in_flight`` counted a request only once its whole body had arrived, so a key could keep
    any number of uploads open and make the gateway hold ``max_body_bytes`` for each.  An upload the gateway does not
    read without a credential (docs/processes.md) takes its slot from its head: the one past the limit is answered
    429 unread, and a held upload whose body then arrives is routed, not refused by its own slot."""
    port, url, _ = processes["gateway"]
    body = b'{"images": [], "pad": "' + b"x" * 899_960 + b'"}'
    head = (b"POST /v1/models/TESTFAULTS/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer gw-static-token\r\nConnection: close\r\nExpect: 100-continue\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
    before = in_flight_rejections(url)
    uploads = []
    try:
        for _ in range(KEY_MAX_IN_FLIGHT):  # each answered 100 Continue once the gateway holds its slot
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            uploads.append(sock)
            sock.sendall(head)
            assert sock.recv(64) == b"HTTP/1.1 100 Continue\r\n\r\n"
            sock.sendall(body[:1000])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(head)
            received = read_reply(sock)
        first, headers, data = split(received)
        assert first == b"HTTP/1.1 429 Too Many Requests" and headers["connection"] == "close", received[:300]
        assert headers["retry-after"] == "1" and headers["x-service-key"] == "static-token", headers
        reply = json.loads(data)
        assert (reply["status"], reply["status_str"], reply["error"]) == (
            429, "RATE_LIMITED", f"key static-token has {KEY_MAX_IN_FLIGHT} requests in flight, the most one key may "
                                 "have (key_max_in_flight): retry when one has been answered"), reply
        assert in_flight_rejections(url) == before + 1
        uploads[0].sendall(body[1000:])  # the rest of a held upload: its route answers, with the slot it holds
        first, headers, _ = split(read_reply(uploads[0]))
        assert first not in (b"HTTP/1.1 429 Too Many Requests", b"") and headers["x-service-key"] == "static-token"
    finally:
        for sock in uploads:
            sock.close()

    def served() -> bool:  # every slot is given back once the uploads' clients are gone
        statuses = []
        socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(KEY_MAX_IN_FLIGHT)]
        try:
            for sock in socks:
                sock.sendall(head)
                statuses.append(sock.recv(12))
        finally:
            for sock in socks:
                sock.close()
        return statuses == [b"HTTP/1.1 100"] * KEY_MAX_IN_FLIGHT

    wait_until(served, "the uploads' slots given back", 10)
    assert_serving(url, "gateway")


def test_a_keys_upload_over_its_rate_is_429_from_its_head(processes, tmp_path):
    """A security probe: a key limited to 1 request/s held twelve 50 MB uploads open, each refused 429 only once
    its whole body had arrived (the gateway's memory 69 MB -> 655 MB).  An upload the gateway judges from its head
    takes its key's token there: the second upload within the second is 429 unread, and the first, whose token was
    taken, is routed when its body comes (not refused by its own token)."""
    from svc.auth import hash_key, key_entry

    servers = tmp_path / "server"
    servers.mkdir()
    write_config(servers, "TESTFAULTS", name="TESTFAULTS.toml", port=processes["model"][0])
    key = "rate-limited-key-" + "k" * 32
    gateway = start_gateway(tmp_path, servers, key_entry("limited", hash_key(key), qps=1),
                            env={"SERVICE_UPSTREAM_TOKEN": "model-token"})
    body = b'{"images": [], "pad": "' + b"x" * 899_960 + b'"}'
    head = (b"POST /v1/models/TESTFAULTS/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + key.encode() + b"\r\nConnection: close\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
    try:
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as first, \
                socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as second:
            first.sendall(head + body[:1000])  # its token taken from its head: the bucket (burst 1) is empty now
            second.sendall(head + body[:1000])
            status, headers, data = split(read_reply(second))
            assert status == b"HTTP/1.1 429 Too Many Requests" and headers["connection"] == "close", data[:300]
            assert headers["x-service-key"] == "limited" and headers["retry-after"] == "1", headers
            assert json.loads(data)["error"] == "rate limit of 1 requests/s for key limited exceeded"
            first.sendall(body[1000:])
            status, headers, data = split(read_reply(first))
            assert status == b"HTTP/1.1 422 Unprocessable Content", data[:300]  # its route's answer: no images
        metrics = get(gateway.url + "/metrics", headers={"Authorization": "Bearer gw-metrics-token"}).body.decode()
        assert 'service_gateway_key_rejections_total{key="limited",reason="rate_limited"} 1.0' in metrics
    finally:
        gateway.stop()


def test_an_upload_answered_early_gives_its_slot_back_at_once_and_its_line_names_the_key(processes):
    """A regression probe: an upload holding its key's slot from its head, answered 408 (or 413) before its body
    was complete, kept the slot until its connection closed, up to 5 s later (LINGER_SECONDS): the key's next
    requests were 429. Its access line said ``key=-`` though its head named the key."""
    port, url, _ = processes["gateway"]
    head = (b"POST /v1/models/TESTFAULTS/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer gw-static-token\r\nX-Request-ID: slow-upload-%d\r\n"
            b"Content-Length: 900000\r\n\r\n")
    uploads = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(KEY_MAX_IN_FLIGHT)]
    try:
        for i, sock in enumerate(uploads):
            sock.sendall(head % i + b"{")
        for sock in uploads:  # each answered 408 at body_timeout_ms; the sockets stay open (the server lingers)
            sock.settimeout(10)
            assert sock.recv(64).startswith(b"HTTP/1.1 408 "), "no 408"
        reply = post(url + "/v1/models/TESTFAULTS/infer", {"images": []},
                     headers={"Authorization": "Bearer gw-static-token"}, timeout=10)
        assert reply.status == 422, (reply.status, reply.body[:200])  # its route's answer, not the key's 429
    finally:
        for sock in uploads:
            sock.close()
    lines = processes["gateway process"].output().splitlines()
    for i in range(KEY_MAX_IN_FLIGHT):
        assert any(re.search(rf" 408 [0-9.]+ms key=static-token rid=slow-upload-{i}$", line) for line in lines), \
            lines[-6:]
