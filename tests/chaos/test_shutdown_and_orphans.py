"""Stops that must stay bounded: SIGTERM under load, SIGTERM while loading,
and a supervisor killed with -9 while a model is busy.

Each test names the promise it checks (docs/operations.md, "What survives what").  The
processes are real; the model is TESTFAULTS (tests/plugins), whose
``sleep_ms`` param makes a forward pass as long as a 1000-step diffusion job
and whose ``[model] load_delay_ms`` makes loading slow.  Bounds carry a margin
for a loaded 2-core machine; the promise itself is stated in each docstring.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

from tests.support.http import get, post
from tests.support.images import image_b64
from tests.support.processes import (
    child_env,
    free_port,
    metric,
    model_server_args,
    pid_alive,
    spawn,
    start_model_server,
    wait_until,
    write_config,
)
from tests.support.stack import build_stack, start_supervisor, stop_stack

GRACE_MS = 1500
#: Scheduling slack on a shared 2-core machine, on top of each promised bound.
MARGIN_S = 1.0


def infer_in_background(url: str, headers: dict[str, str], sleep_ms: int, box: list) -> threading.Thread:
    """A long synchronous request whose reply (or error) lands in ``box``."""

    def run() -> None:
        try:
            box.append(post(url, {"images": [image_b64()], "params": {"sleep_ms": sleep_ms}}, headers=headers,
                            timeout=60))
        except OSError as e:
            box.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def test_sigterm_with_long_jobs_queued_exits_within_grace_plus_one_second(tmp_path: Path) -> None:
    """SIGTERM with long batches running and queued: `/healthz` keeps answering
    200 until the port closes (the reactor is never blocked), every held
    request is answered 503 status 65, and the process exits 0 within
    `shutdown_grace_ms` + 1 s even though a forward pass is still running."""
    config = write_config(tmp_path, "TESTFAULTS", port=free_port(), shutdown_grace_ms=GRACE_MS, max_batch_size=1)
    proc = start_model_server(config)
    try:
        url = proc.url + "/testfaults/predict"
        replies: list = []
        threads = [infer_in_background(url, proc.auth, 20000, replies) for _ in range(3)]
        wait_until(lambda: metric(proc, "service_batch_size_count") == 1 and metric(proc, "service_queue_depth") == 2,
                   "the first batch in the worker, the other two queued")
        assert replies == []
        proc.popen.send_signal(signal.SIGTERM)
        signalled = time.monotonic()

        health: list[tuple[float, int | str]] = []
        while proc.alive() and time.monotonic() - signalled < 30:
            try:
                health.append((time.monotonic() - signalled, get(proc.url + "/healthz", timeout=1.0).status))
            except (ConnectionRefusedError, ConnectionResetError):  # a connect racing the port's close is reset
                health.append((time.monotonic() - signalled, "refused"))
            except OSError as e:  # a timeout here means the reactor stopped answering
                health.append((time.monotonic() - signalled, type(e).__name__))
            time.sleep(0.05)
        code = proc.popen.wait(30)
        exited = time.monotonic() - signalled

        assert code == 0, proc.output()[-3000:]
        assert exited < GRACE_MS / 1000 + 1 + MARGIN_S, (exited, health)
        # /healthz: 200 until the port closes, then refused; never a hang.
        outcomes = [h for _, h in health]
        assert outcomes and outcomes[0] == 200, health
        first_refused = outcomes.index("refused") if "refused" in outcomes else len(outcomes)
        assert [h for h in outcomes[:first_refused] if h != 200] == [], health  # a 1 s timeout: the grace is 1.5 s
        assert [h for h in outcomes[first_refused:] if h != "refused"] == [], health
        assert health[first_refused - 1][0] >= GRACE_MS / 1000 - 0.2, health  # answered through the grace

        for thread in threads:
            thread.join(10)
        assert len(replies) == 3
        for reply in replies:
            assert not isinstance(reply, Exception), replies
            assert reply.status == 503, reply.body
            assert reply.json["status"] == 65
            assert [r["status"] for r in reply.json["results"]] == [65]
    finally:
        proc.stop(signal.SIGKILL)


def test_sigterm_while_the_model_loads_exits_promptly(tmp_path: Path) -> None:
    """SIGTERM while the model is still loading (in the worker pool): the process
    does not wait for the load to finish; it closes its port and exits 0
    within 1 s."""
    port = free_port()
    config = write_config(tmp_path, "TESTFAULTS", port=port, model={"load_delay_ms": 60000})
    popen, log_path = spawn(model_server_args(config, port), env=child_env({"SERVICE_AUTH_TOKEN": "model-token"}))
    try:
        deadline = time.monotonic() + 120
        while True:  # the listener is up (/healthz 200) and the model is loading (/ready 503)
            assert popen.poll() is None, log_path.read_text()
            try:
                if get(f"http://127.0.0.1:{port}/healthz", timeout=2).status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        ready = get(f"http://127.0.0.1:{port}/ready", timeout=2)
        assert (ready.status, ready.json["status"]) == (503, 65)  # the load (60 s) is in progress: SIGTERM now
        popen.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = popen.wait(30)
        exited = time.monotonic() - signalled
        assert code == 0, log_path.read_text()[-3000:]
        assert exited < 1 + MARGIN_S, exited
        assert port_is_free(port)
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait(10)


#: From the kill to every model `running` and ready under the new supervisor:
#: the old children are gone within 2 s, the port wait retries on the
#: back-off schedule (one step after the port is free), the rest is the
#: normal cold start of the gateway and the model server (27 s measured on a
#: loaded 2-core machine).
RECOVERY_BOUND_S = 90.0


def test_kill_9_of_the_supervisor_orphans_exit_and_a_new_supervisor_recovers(tmp_path: Path) -> None:
    """kill -9 of the supervisor while a model runs a long batch: every child
    (gateway and model servers) exits within 2 s and frees its port; a new
    supervisor started within 1 s has every model `running` and ready again
    within 90 s, without a `start_failed` on the way."""
    stack = build_stack(tmp_path, {"TESTFAULTS": {}})
    new = None
    pids: list[int] = []
    try:
        stack.wait_for("TESTFAULTS", lambda c: c["state"] == "running" and c["ready"])
        stack.wait_for("__gateway", lambda c: c["state"] == "running" and c["ready"])
        status = stack.status()
        pids = [status["gateway"]["pid"], *(s["pid"] for s in status["servers"])]
        ports = [stack.gateway_port, *stack.model_ports.values()]
        replies: list = []
        batches = stack.model_metric("TESTFAULTS", "service_batch_size_count")
        infer_in_background(f"{stack.gateway}/v1/models/TESTFAULTS/infer", {"Authorization": f"Bearer {stack.key}"},
                            30000, replies)
        wait_until(lambda: stack.model_metric("TESTFAULTS", "service_batch_size_count") > batches,
                   "the batch runs in the model server", timeout=30)
        assert replies == []

        exits: dict[int, float] = {}

        def watch() -> None:  # when each old child is gone, seen every 20 ms
            while len(exits) < len(pids) and time.monotonic() - killed < 30:
                for pid in pids:
                    if pid not in exits and not pid_alive(pid):
                        exits[pid] = time.monotonic() - killed
                time.sleep(0.02)

        stack.supervisor.popen.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        stack.supervisor.popen.wait(10)
        new = start_supervisor(stack)
        assert new.extra["spawned_at"] - killed < 1.0  # the new supervisor was started within 1 s of the kill
        watcher.join(30)
        assert sorted(exits) == sorted(pids), (exits, pids)
        logs = "\n".join(f"--- {p.name}\n" + p.read_text(errors="replace")[-2000:]
                         for p in sorted((tmp_path / "logs").glob("*.log")))
        assert max(exits.values()) < 2 + MARGIN_S, f"{exits}\n{logs}"

        new.wait_for("TESTFAULTS", lambda c: c["state"] in ("running", "start_failed", "failed"),
                     timeout=RECOVERY_BOUND_S)
        for name in ("__gateway", "TESTFAULTS"):
            child = new.wait_for(name, lambda c: c["state"] == "running" and c["ready"], timeout=5)
            assert child["pid"] not in pids
        recovered = time.monotonic() - killed
        assert recovered < RECOVERY_BOUND_S, recovered
        reply = post(f"{new.gateway}/v1/models/TESTFAULTS/infer", {"images": [image_b64()]},
                     headers={"Authorization": f"Bearer {new.key}"}, timeout=30)
        assert (reply.status, reply.json["status"]) == (200, 0)
        assert all(not port_is_free(p) for p in ports)
    finally:
        if new is not None:
            code, survivors = stop_stack(new)
            assert code == 0 and survivors == []
        else:
            stack.supervisor.stop(signal.SIGKILL)
        for pid in pids:  # children are process-group leaders
            if pid_alive(pid):
                os.killpg(pid, signal.SIGKILL)
