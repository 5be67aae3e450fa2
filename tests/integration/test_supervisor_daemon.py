"""The supervisor run as a daemon (``twistd`` without ``-n``, docs/processes.md) starts its children; every
program run so tells its launcher when its port is taken, and a model server's daemon that exits past twistd
(``os._exit``) removes its pidfile.

twistd forks after it has built the service, and the supervisor used to put
its pid of that moment in the children's ``SERVICE_SUPERVISOR_PID``: the
parent that exited.  Every child's wrapper then took its supervisor for dead
and exited 1 at once, and the status said only "refused to start (exit code
1)" for the gateway and every model.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from svc.supervisor.logsink import LogDirLock
from tests.support.gateway import GATEWAY_TOKENS
from tests.support.http import get, post
from tests.support.images import image_b64
from tests.support.processes import Proc, child_env, pid_alive, wait_until, write_config
from tests.support.stack import build_stack

TWISTD = str(Path(sys.executable).parent / "twistd")
TOKEN = {"SERVICE_AUTH_TOKEN": "model-token"}


def test_a_daemonized_supervisor_runs_its_children_and_stops_them(tmp_path: Path) -> None:
    stack = build_stack(tmp_path, {"TESTFAULTS": {}}, start=False)
    pidfile, log = tmp_path / "supervisor.pid", tmp_path / "supervisor.log"
    launcher = subprocess.Popen([TWISTD, "--pidfile", str(pidfile), "--logfile", str(log), "service-supervisor",
                                 "--config", str(tmp_path / "service.toml")], env=child_env(stack.env), cwd=tmp_path)
    assert launcher.wait(60) == 0  # the daemon runs on; the launcher returns
    stack.supervisor = Proc(launcher, stack.extra["supervisor_port"], log, stack.env["SERVICE_API_TOKEN"])
    deadline = time.monotonic() + 60
    while not pidfile.exists() or get(stack.url + "/api/v1/health", timeout=5).status != 200:
        assert time.monotonic() < deadline, log.read_text()[-3000:] if log.exists() else "no log"
        time.sleep(0.2)
    daemon = int(pidfile.read_text())
    try:
        for name in ("__gateway", "TESTFAULTS"):
            child = stack.wait_for(name, lambda c: c["state"] == "running" and c["ready"], timeout=120)
            assert child["restarts"] == 0 and child["last_error"] is None, child
        reply = post(f"{stack.gateway}/v1/models/TESTFAULTS/infer", {"images": [image_b64()]},
                     headers={"Authorization": f"Bearer {stack.key}"})
        assert reply.status == 200 and reply.json["status"] == 0, reply.json
        pids = [stack.child(n)["pid"] for n in ("__gateway", "TESTFAULTS")]
        # the logs folder's lock names the daemon, not the process that forked it (docs/processes.md)
        assert (tmp_path / "logs" / "supervisor.lock").read_text() == f"{daemon}\n"
        # logrotate's usual postrotate signal: twistd rotated the daemon's own log on it (supervisor.log.1), where
        # docs/operations.md says every process ignores it.  The handler runs on the reactor's thread as the signal
        # arrives; the status request after it is answered by the same reactor, after the rotation it would queue.
        os.kill(daemon, signal.SIGUSR1)
        for _ in range(2):
            assert get(stack.url + "/api/v1/status", headers={"Authorization": f"Bearer {stack.env['SERVICE_API_TOKEN']}"},
                       timeout=10).status == 200
        assert sorted(p.name for p in tmp_path.glob("supervisor.log*")) == ["supervisor.log"]
        # The logs folder removed by hand: the daemon makes its lock again, so that a second supervisor on the
        # folder is still refused (it started, wrote into the same files and held the folder's only lock).
        shutil.rmtree(tmp_path / "logs")
        deadline = time.monotonic() + 30
        while not (tmp_path / "logs" / "supervisor.lock").exists():
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        second = LogDirLock(str(tmp_path / "logs"))
        assert (second.acquire() or "").startswith(f"{tmp_path / 'logs'} ({tmp_path / 'logs'}) is in use by another "
                                                   f"supervisor (pid {daemon}")
    finally:
        os.kill(daemon, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while pid_alive(daemon) or any(pid_alive(p) for p in pids):
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    assert not pidfile.exists()


def daemon_command(program: str, tmp_path: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """``program``'s arguments (after ``twistd ... ``) and environment, with its port ``port``."""
    if program == "service-model":
        config = write_config(tmp_path, "TESTFAULTS", port=port)
        return ["--server", str(config)], {"SERVICE_AUTH_TOKEN": "model-token"}
    if program == "service-gateway":
        servers = tmp_path / "server"
        servers.mkdir()
        config = tmp_path / "gateway.toml"
        config.write_text(f'[gateway]\nport = {port}\nkeys_file = "{tmp_path / "keys.toml"}"\n'
                          f'servers_dir = "{servers}"\n')
        (tmp_path / "keys.toml").write_text("# the static token only\n")
        return ["--config", str(config)], GATEWAY_TOKENS
    stack = build_stack(tmp_path, {"TESTFAULTS": {}}, start=False)
    config = tmp_path / "service.toml"
    mine = f"[supervisor]\nport = {stack.extra['supervisor_port']}\n"
    config.write_text(config.read_text().replace(mine, f"[supervisor]\nport = {port}\n"))
    return ["--config", str(config)], stack.env


@pytest.mark.parametrize("program", ["service-model", "service-gateway", "service-supervisor"])
def test_a_daemon_whose_port_is_taken_tells_its_launcher_and_leaves_no_pidfile(tmp_path: Path, program: str) -> None:
    """A config probe: ``twistd`` without ``-n`` forks its daemon before the port is bound; the daemon's refusal of a
    taken port (a SystemExit) reached the log, but twistd reports only an exception to the launcher, which waited on
    for ever, the dead daemon's pidfile left behind. The launcher exits 1 now with the refusal's start, as it does for
    twistd's own errors, and the pidfile is gone."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        args, env = daemon_command(program, tmp_path, port)
        pidfile, log = tmp_path / "daemon.pid", tmp_path / "daemon.log"
        launcher = subprocess.run([TWISTD, "--pidfile", str(pidfile), "--logfile", str(log), program, *args],
                                  env=child_env(env), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert launcher.returncode == 1, (launcher.stderr, log.read_text()[-2000:])
    first, second = launcher.stderr.splitlines()
    assert first.startswith(f"An error has occurred: b'{program}: ") and len(first) > 40, launcher.stderr
    assert second == "Please look at log file for more information."
    assert not pidfile.exists()

    def refusals() -> list[str]:  # the daemon tells its launcher first, then writes the line as it exits (a CI race)
        return [line for line in log.read_text().splitlines() if f"cannot listen on 127.0.0.1:{port}: " in line]

    refusal = wait_until(refusals, "the daemon's refusal in its log", 10)
    assert len(refusal) == 1 and f"{program}: " in refusal[0], log.read_text()[-2000:]


def start_daemon(tmp_path: Path, config: Path) -> tuple[int, Path, Path]:
    """A ``service-model`` daemon of ``config`` on a port of the kernel's: its pid, pidfile and log file, once the
    ``twistd`` that forked it has returned (0: the daemon listens; the model loads after, docs/processes.md)."""
    pidfile, log = tmp_path / "d.pid", tmp_path / "d.log"
    launcher = subprocess.run([TWISTD, "--pidfile", str(pidfile), "--logfile", str(log), "service-model",
                               "--server", str(config), "--port", "0"], env=child_env(TOKEN), cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
    assert launcher.returncode == 0, (launcher.stderr, log.read_text()[-2000:])
    return int(pidfile.read_text()), pidfile, log


def test_a_daemon_whose_model_does_not_load_removes_its_pidfile(tmp_path: Path) -> None:
    """A config probe: a daemon whose weights did not fit the architecture logged its line and exited 1 (``os._exit``
    after the reactor's shutdown), which twistd's removal of the pidfile never saw: the file stayed, naming a dead
    pid.  The launcher still returns 0 once the daemon listens; the daemon removes its own pidfile as it exits."""
    import torch

    weights = tmp_path / "wrong.pth"
    torch.save({"foo": torch.zeros(3)}, weights)
    config = write_config(tmp_path, "MOBILENETV2", model={"weights": str(weights)})
    daemon, pidfile, log = start_daemon(tmp_path, config)
    wait_until(lambda: not pid_alive(daemon), "the daemon's exit", 120)
    assert not pidfile.exists()
    lines = [line for line in log.read_text().splitlines() if "#critical]" in line]
    assert len(lines) == 1 and lines[0].endswith(f"service-model: weights '{weights}' (from {config}): weights file "
                                                 f"{weights}: missing tensor 'features.0.0.weight' (shape "
                                                 "[32, 3, 3, 3])"), lines


def test_a_daemon_stopped_while_its_model_loads_removes_its_pidfile(tmp_path: Path) -> None:
    """A daemon stopped while a worker still builds its model ends with ``hard_exit`` (the build cannot be
    interrupted): twistd's removal of the pidfile never ran there either."""
    config = write_config(tmp_path, "TESTFAULTS", model={"load_delay_ms": 600000})
    daemon, pidfile, log = start_daemon(tmp_path, config)
    try:
        port = int(wait_until(lambda: re.search(r"listening on 127\.0\.0\.1:(\d+);", log.read_text()),
                              "the daemon's port in its log").group(1))
        wait_until(lambda: get(f"http://127.0.0.1:{port}/ready", timeout=5).json["error"] ==
                   "the model is loading: building the model and loading its weights", "the build under way")
    finally:
        os.kill(daemon, signal.SIGTERM)
    wait_until(lambda: not pid_alive(daemon), "the daemon's exit", 30)
    assert not pidfile.exists()
    assert "inference still running: exiting without waiting for them" in log.read_text()
