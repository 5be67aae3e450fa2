"""Concurrent HTTP client loops for tests and benches: each thread sends
requests until told to stop (or its budget is spent) and records every
outcome, so a test can say exactly how many connections or requests failed.

:class:`ClientLoops` sends GETs on fresh or kept connections;
:class:`RequestLoad` calls a test's own request function (an inference
through the gateway) and keeps each reply's HTTP and envelope status."""

from __future__ import annotations

import http.client
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Failures of a request on a kept-alive connection that the server closed
#: before reading it: HTTP clients re-send an idempotent request once on a new
#: connection (urllib3 and browsers do); counted apart as ``stale_retries``.
STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


@dataclass
class Outcomes:
    """What the clients saw, under one lock."""

    statuses: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    error_times: list[float] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    #: (monotonic time the reply ended, latency ms, status) per answered request
    samples: list[tuple[float, float, int]] = field(default_factory=list)
    stale_retries: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def requests(self) -> int:
        return sum(self.statuses.values()) + len(self.errors)

    @property
    def server_errors(self) -> int:
        return sum(n for code, n in self.statuses.items() if code >= 500)

    def record(self, status: int | None, started: float, error: str | None = None) -> None:
        now = time.monotonic()
        with self.lock:
            if error is not None:
                self.errors.append(error)
                self.error_times.append(now)
            else:
                self.statuses[status] = self.statuses.get(status, 0) + 1
                self.latencies_ms.append((now - started) * 1000.0)
                self.samples.append((now, (now - started) * 1000.0, status))


class ClientLoops:
    """``fresh`` threads with a new connection per request, ``kept`` threads with
    a persistent one; every thread stops at ``stop()`` or after ``max_requests``.

    ``pause_s``: each thread waits this long after each answer.  The clients
    stay concurrent (connections keep opening and closing at every moment)
    without making the test process and the server spend whole cores.
    """

    def __init__(self, port: int, path: str, *, fresh: int, kept: int, headers: dict[str, str] | None = None,
                 max_requests: int = 100_000, timeout: float = 30.0, pause_s: float = 0.0) -> None:
        self.port, self.path, self.headers = port, path, dict(headers or {})
        self.max_requests, self.timeout, self.pause_s = max_requests, timeout, pause_s
        self.outcomes = Outcomes()
        self._stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(False,), daemon=True) for _ in range(fresh)]
        self.threads += [threading.Thread(target=self._loop, args=(True,), daemon=True) for _ in range(kept)]

    def start(self) -> ClientLoops:
        for t in self.threads:
            t.start()
        return self

    def stop(self, join_timeout: float = 60.0) -> Outcomes:
        self._stop.set()
        for t in self.threads:
            t.join(join_timeout)
        return self.outcomes

    def snapshot(self) -> tuple[int, int, int]:
        """(requests, errors, 5xx) so far."""
        o = self.outcomes
        with o.lock:
            return o.requests, len(o.errors), o.server_errors

    def _loop(self, keep: bool) -> None:
        conn: http.client.HTTPConnection | None = None
        headers = {**self.headers, **({} if keep else {"Connection": "close"})}
        for _ in range(self.max_requests):
            if self._stop.is_set():
                break
            started = time.monotonic()
            reused = conn is not None
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
                try:
                    status = self._get(conn, headers)
                except STALE:
                    if not reused:
                        raise
                    with self.outcomes.lock:
                        self.outcomes.stale_retries += 1
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
                    status = self._get(conn, headers)
                self.outcomes.record(status, started)
            except (OSError, http.client.HTTPException) as e:
                self.outcomes.record(None, started, f"{type(e).__name__}: {e}")
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.01)
                continue
            if not keep or conn.sock is None:
                conn.close()
                conn = None
            if self.pause_s:
                self._stop.wait(self.pause_s)
        if conn is not None:
            conn.close()

    def _get(self, conn: http.client.HTTPConnection, headers: dict[str, str]) -> int:
        conn.request("GET", self.path, headers=headers)
        reply = conn.getresponse()
        reply.read()
        if reply.will_close:
            conn.close()
        return reply.status


class RequestLoad:
    """``clients`` threads calling ``send()`` one request after another until ``stop()`` (or ``limit_s``).

    ``send`` returns a ``tests.support.http.Reply``.  Every answer is kept as
    (sent, answered, HTTP status, envelope status or None for a body that
    is not JSON), every transport failure in ``errors``.
    """

    def __init__(self, send: Callable[[], Any], clients: int, limit_s: float, join_s: float = 60.0) -> None:
        self.send, self.join_s = send, join_s
        self.replies: list[tuple[float, float, int, int | None]] = []
        self.errors: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.limit = time.monotonic() + limit_s
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(clients)]
        for t in self.threads:
            t.start()

    def _loop(self) -> None:
        while not self.stopped.is_set() and time.monotonic() < self.limit:
            sent = time.monotonic()
            try:
                reply = self.send()
                status = reply.json.get("status") if reply.body.startswith(b"{") else None
                with self.lock:
                    self.replies.append((sent, time.monotonic(), reply.status, status))
            except (OSError, http.client.HTTPException) as e:
                with self.lock:
                    self.errors.append((time.monotonic(), f"{type(e).__name__}: {e}"))
                time.sleep(0.05)

    def stop(self) -> None:
        self.stopped.set()
        for t in self.threads:
            t.join(self.join_s)

    def codes(self, *, sent_after: float = 0.0, answered_after: float = 0.0) -> Counter:
        """(HTTP status, envelope status) -> count, of the requests sent and answered after the given times."""
        with self.lock:
            return Counter((code, status) for sent, answered, code, status in self.replies
                           if sent >= sent_after and answered >= answered_after)


def percentile(data: list[float], p: float) -> float:
    """The p-th percentile (0-100) of ``data`` by nearest rank; 0 for no data."""
    if not data:
        return 0.0
    ordered = sorted(data)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100.0 * len(ordered)) - 1))]
