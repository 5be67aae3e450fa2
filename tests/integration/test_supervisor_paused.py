"""A paused supervisor (SIGSTOP, or its reactor held by a slow disk) reads none of its children's output: the
gateway's log lines filled the pipe and the next write blocked its reactor, so within seconds the public port
answered nothing (a probe: timeouts from 20 s after the pause).  Now a child's writes never wait for the pipe
(svc.infra.output)."""

from __future__ import annotations

import http.client
import signal

from tests.support.processes import wait_until
from tests.support.stack import build_stack, stop_stack

#: Requests whose access lines are several times what a pipe holds (64 KiB; a line is about 150 bytes).
REQUESTS = 1500


def test_the_gateway_answers_while_its_supervisor_is_paused_and_logs_every_line_after(tmp_path):
    stack = build_stack(tmp_path, {})
    try:
        wait_until(lambda: stack.child("__gateway")["ready"], "the gateway ready")
        stack.supervisor.popen.send_signal(signal.SIGSTOP)
        try:
            connection = http.client.HTTPConnection("127.0.0.1", stack.gateway_port, timeout=10)
            for i in range(REQUESTS):  # each refused with 401: one access line each, nothing else
                connection.request("GET", "/v1/models", headers={"X-Request-ID": f"paused-{i:05d}"})
                reply = connection.getresponse()
                reply.read()
                assert reply.status == 401, (i, reply.status)
            connection.close()
        finally:
            stack.supervisor.popen.send_signal(signal.SIGCONT)
        log = tmp_path / "logs" / "__gateway.log"
        wait_until(lambda: f"rid=paused-{REQUESTS - 1:05d}" in log.read_text(), "the last line, once read", 30)
        text = log.read_text()
        assert all(f"rid=paused-{i:05d}" in text for i in range(REQUESTS))  # none lost: they waited in memory
    finally:
        stop_stack(stack)
