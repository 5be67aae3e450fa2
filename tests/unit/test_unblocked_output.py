"""svc.infra.output on a real pipe that nobody reads: a write never waits, what waits is bounded, and the lines
dropped are said once the pipe takes lines again."""

from __future__ import annotations

import fcntl
import os
import select

import pytest
from twisted.internet.task import Clock

from svc.infra.output import RETRY_S, UnblockedOutput, unblock_log_output


@pytest.fixture
def pipe():
    read, write = os.pipe()
    fcntl.fcntl(read, fcntl.F_SETFL, os.O_NONBLOCK)  # the test's reads only
    yield read, write
    os.close(read)
    os.close(write)


def read_all(fd: int) -> bytes:
    data = b""
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return data
        if not chunk:
            return data
        data += chunk


def line(i: int) -> str:
    return f"2026-11-28T08:00:00+0000 [svc.access#info] GET /healthz 200 0.1ms key=- rid=r-{i:06d}\n"


def test_a_full_pipe_never_blocks_a_write_and_every_line_kept_comes_out_in_order(pipe):
    read, write = pipe
    clock = Clock()
    out = UnblockedOutput(write, clock.callLater, limit=256 * 1024)
    capacity = fcntl.fcntl(write, 1032)  # F_GETPIPE_SZ: 64 KiB here
    sent = [line(i) for i in range(3 * capacity // len(line(0)))]  # three pipes' worth: a blocking write hangs
    for text in sent:
        assert out.write(text) == len(text)
        out.flush()
    assert 0 < len(out.pending) <= 256 * 1024 and out.dropped == 0
    assert select.select([], [write], [], 0)[1] == []  # the pipe is full, and no write waited for it
    received = read_all(read)  # the supervisor reads again: the next timer writes what waited
    clock.advance(RETRY_S)
    received += read_all(read)
    while out.pending:
        clock.advance(RETRY_S)
        received += read_all(read)
    assert received.decode() == "".join(sent)


def test_past_its_limit_whole_lines_are_dropped_and_counted_in_one_line(pipe):
    read, write = pipe
    out = UnblockedOutput(write, None, limit=4096)
    for i in range(2000):  # about 190 KB into a 64 KiB pipe and 4 KiB of room
        out.write(line(i))
    assert out.dropped > 0 and len(out.pending) <= 4096
    dropped = out.dropped
    received = read_all(read)
    out.flush()  # the supervisor reads again: what waited goes out, then the count
    out.write(line(99999))
    received += read_all(read)
    *kept, note, last = received.decode().splitlines(keepends=True)
    assert note.endswith(f" [svc.infra.output#warn] {dropped} log lines were dropped: the supervisor did not read "
                         f"this process's output\n")
    assert last == line(99999) and all(x.startswith("2026-11-28T08:00:00+0000 [svc.access#info] GET /h") for x in kept)
    assert kept == [line(i) for i in range(len(kept))]  # the first ones, whole, in order
    assert len(kept) + dropped == 2000  # every line is written or counted, none cut in the middle


def test_only_a_child_of_the_supervisor_run_by_twist_gets_it(monkeypatch):
    import sys

    class Twist(dict):
        pass

    class Sub:
        parent = Twist(logFile=sys.stdout)

    assert unblock_log_output(Sub(), Clock(), env={}) is None and Sub.parent["logFile"] is sys.stdout  # by hand
    monkeypatch.setattr("atexit.register", lambda *a: None)
    output = unblock_log_output(Sub(), Clock(), env={"SERVICE_SUPERVISOR_PID": "1"})
    assert output is not None and Sub.parent["logFile"] is output and output.fileno() == sys.stdout.fileno()


def test_lines_written_from_several_threads_come_out_whole(pipe):
    """Worker threads log too (the observer runs in the thread that logged): the pending bytes are shared."""
    import threading

    read, write = pipe
    out = UnblockedOutput(write, None, limit=1 << 22)
    threads = [threading.Thread(target=lambda n=n: [out.write(line(n * 1000 + i)) for i in range(300)])
               for n in range(4)]
    received = b""
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads) or out.pending:
        received += read_all(read)
        out.flush()
    received += read_all(read)
    assert sorted(received.decode().splitlines(keepends=True)) == sorted(
        line(n * 1000 + i) for n in range(4) for i in range(300))
