"""svcctl's one entry (``svc.cli.main``, ``python -m svc.cli``): stdout that cannot be written, for every command.

Real processes whose stdout is a pipe with no reader (``| true``, made deterministic: the reader is closed before
the process starts) or ``/dev/full``, each run buffered and unbuffered (the error then comes from the write itself
or from the last flush at exit); the commands that call the gateway answered by hand on a real listener.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import svc.cli
from tests.support.fake_client import FakeClient, Reply
from tests.unit.test_cli import (
    CLEARED,
    GATEWAY,
    REPO,
    TOKEN,
    accept_request_head,
    fake_client,
    free_port,
    listener,
    start,
)

FULL = "svcctl: cannot write to stdout: No space left on device\n"
JOB = {"job_id": "job_1", "state": "pending", "poll_url": "/v1/models/M/jobs/job_1",
       "result_url": "/v1/models/M/jobs/job_1/result"}
ENVELOPE = {"status": 0, "status_str": "OK", "task_id": "t", "results": [{"status": 0, "data": {"class_id": 3}}]}
BUFFERING = pytest.mark.parametrize("unbuffered", ["1", ""], ids=["unbuffered", "buffered"])


@contextmanager
def no_reader() -> Iterator[int]:
    """The write end of a pipe whose read end is already closed: every write fails with EPIPE (``| true``)."""
    read, write = os.pipe()
    os.close(read)
    try:
        yield write
    finally:
        os.close(write)


def run_to(stdout: int, *args: str, unbuffered: str = "1", env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = start(*args, stdout=stdout, env={"PYTHONUNBUFFERED": unbuffered, **(env or {})})
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


@pytest.fixture
def offline(tmp_path) -> dict[str, str]:
    """A key file and an empty weights cache for the commands that only read local files."""
    keys = tmp_path / "keys.toml"
    keys.write_text('[keys.a]\nhash = "' + "a" * 64 + '"\n')
    return {"keys": str(keys), "SERVICE_WEIGHTS_DIR": str(tmp_path / "weights")}


LOCAL = [["keygen", "foo"], ["hash", "abc"], ["--version"], ["keys", "list", "--keys-file", "{keys}"],
         ["weights", "list"], ["weights", "list", "--json"], ["weights", "verify"]]


@BUFFERING
@pytest.mark.parametrize("argv", LOCAL, ids=[" ".join(a[:3]) for a in LOCAL])
def test_a_reader_gone_away_is_quiet_and_exit_141(offline, argv, unbuffered):
    """``svcctl keys list | true`` and the others ended in a BrokenPipeError traceback, exit 1."""
    argv = [a.format(**offline) for a in argv]
    with no_reader() as stdout:
        assert run_to(stdout, *argv, unbuffered=unbuffered, env=offline) == (141, "")


@BUFFERING
@pytest.mark.parametrize("argv", [["hash", "abc"], ["--version"], ["weights", "list", "--json"]])
def test_a_full_device_is_one_line_and_exit_2(offline, argv, unbuffered):
    with open("/dev/full", "w") as full:
        assert run_to(full.fileno(), *argv, unbuffered=unbuffered, env=offline) == (2, FULL)


def answer(server: socket.socket, status: str, body: dict) -> None:
    """Accept one connection, read its whole request (head and body) and answer ``body`` as JSON, then close."""
    conn, data = accept_request_head(server)
    with conn:
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(rest) < length:
            rest += conn.recv(65536)
        content = json.dumps(body).encode()
        conn.sendall(b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n"
                     b"\r\n%s" % (status.encode(), len(content), content))


@BUFFERING
def test_jobs_run_with_its_reader_gone_is_quiet_and_exit_141_not_interrupted(unbuffered):
    """``svcctl jobs run ... | true`` printed Twisted's "main function encountered error", a traceback and
    "svcctl: interrupted" (exit 1): the failed print was inside the reactor."""
    with listener() as (server, url), no_reader() as stdout:
        proc = start("jobs", "run", "M", "--gateway", url, stdout=stdout, env={"PYTHONUNBUFFERED": unbuffered})
        answer(server, "202 Accepted", JOB)
        answer(server, "200 OK", {**JOB, "state": "done"})
        answer(server, "200 OK", ENVELOPE)
        _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (141, "job_1 pending\njob_1 done\n")


@BUFFERING
def test_infer_to_a_full_device_is_one_line_and_exit_2(tmp_path, unbuffered):
    """``svcctl infer MODEL a.jpg > /dev/full``: "main function encountered error", OSError ENOSPC, "interrupted"."""
    image = tmp_path / "a.jpg"
    image.write_bytes(b"\xff\xd8\xff")
    with listener() as (server, url), open("/dev/full", "w") as full:
        proc = start("infer", "M", str(image), "--gateway", url, stdout=full.fileno(),
                     env={"PYTHONUNBUFFERED": unbuffered})
        answer(server, "200 OK", ENVELOPE)
        _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (2, FULL)


@BUFFERING
def test_a_reader_gone_in_the_middle_of_a_large_reply_is_141(unbuffered):
    """``svcctl infer ... | head -1`` of a 1.1 MB reply exited 0: unbuffered, its one write(1) returned a short count
    when the reader left, and Python's TextIOWrapper dropped the rest without an error."""
    big = {"job_id": "job_1", "state": "done", "pad": ["x" * 100] * 10_000}  # 1 MB: many times a pipe's capacity
    with listener() as (server, url):
        proc = start("jobs", "get", "M", "job_1", "--gateway", url, env={"PYTHONUNBUFFERED": unbuffered})
        answer(server, "200 OK", big)
        assert proc.stdout.readline() == "{\n"  # the reply is being written: the reader leaves in its middle
        proc.stdout.close()
        with proc.stderr:
            err = proc.stderr.read()
        proc.wait(timeout=60)
    assert (proc.returncode, err) == (141, "")


class GoneReader:
    """A stdout whose reader went away (in-process: no file descriptor to point elsewhere)."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        pass


def test_a_failure_to_report_keeps_its_status_when_the_reader_is_gone(monkeypatch, capsys):
    """141 only when the command has nothing worse to say: a job that failed still exits 1, with its line."""
    gateway = fake_client(monkeypatch)
    gateway.script = [Reply(202, JOB), Reply(200, {**JOB, "state": "failed", "error": "bad input"})]
    monkeypatch.setattr(sys, "stdout", GoneReader())
    assert svc.cli.main(["jobs", "run", "M", "--gateway", GATEWAY], client=gateway) == 1
    assert capsys.readouterr().err == "job_1 pending\njob_1 failed\nsvcctl: job job_1 ended failed: bad input\n"
    gateway.script = [Reply(404, {"error": "no such job"})]
    assert svc.cli.main(["jobs", "get", "M", "job_1", "--gateway", GATEWAY], client=gateway) == 1
    assert capsys.readouterr().err == f"svcctl: HTTP 404 Not Found from GET {GATEWAY}/v1/models/M/jobs/job_1\n"
    gateway.script = [Reply(200, {**JOB, "state": "done"})]
    assert svc.cli.main(["jobs", "get", "M", "job_1", "--gateway", GATEWAY], client=gateway) == 141
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------- Ctrl-C before the reactor's handlers

#: Run as ``python -c``: svcctl by its ``python -m svc.cli`` entry, stopped at the first import of ``$BLOCK_AT``
#: until a signal comes, once it has said so on stderr (the test waits for that line, then sends SIGINT).
BLOCKING_ENTRY = """
import os, runpy, signal, sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ["BLOCK_AT"]:
            sys.meta_path.remove(self)
            os.write(2, b"importing " + name.encode() + b"\\n")
            signal.pause()  # Ctrl-C's KeyboardInterrupt is raised here, inside the import
        return None

sys.meta_path.insert(0, Block())
runpy.run_module("svc.cli", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("module", ["svc.cli.commands", "twisted.internet.defer", "treq.client",
                                    "twisted.internet.reactor"])
def test_ctrl_c_while_svcctl_imports_is_interrupted_and_130(module):
    """docs/cli.md promises 130 when interrupted; Ctrl-C in the first second or two gave a KeyboardInterrupt
    traceback (the commands' imports, the reactor's inside task.react) or "main function encountered error" and
    exit 1 (treq, imported inside the coroutine that task.react starts before the reactor's handlers exist)."""
    proc = start("jobs", "get", "M", "job_1", "--gateway", f"http://127.0.0.1:{free_port()}",
                 env={"BLOCK_AT": module}, entry=("-c", BLOCKING_ENTRY))
    assert proc.stderr.readline() == f"importing {module}\n"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (130, "", "svcctl: interrupted\n")


class InterruptedClient(FakeClient):
    """Ctrl-C inside the coroutine before the reactor runs (task.react starts it first): a KeyboardInterrupt."""

    async def exchange(self, reactor, call, token):
        raise KeyboardInterrupt


@pytest.mark.parametrize("argv, line", [
    (["jobs", "get", "M", "job_1", "--gateway", GATEWAY], "svcctl: interrupted\n"),
    (["jobs", "run", "M", "--gateway", GATEWAY], "svcctl: interrupted\n"),
    (["keys", "disable", "a", "--keys-file", "{keys}", "--supervisor", "http://sup.test:8787"],
     "svcctl: interrupted: the key file is changed; the gateway restart may not have happened\n"),
])
def test_ctrl_c_inside_the_request_before_the_reactor_runs_is_130(monkeypatch, capsys, offline, argv, line):
    fake_client(monkeypatch)
    monkeypatch.setenv("SERVICE_API_TOKEN", "management")
    try:
        code = svc.cli.main([a.format(**offline) for a in argv], client=InterruptedClient())
    except KeyboardInterrupt:
        pytest.fail("the interrupt went past svcctl's entry")
    assert (code, capsys.readouterr().err.splitlines(keepends=True)[-1]) == (130, line)


# ---------------------------------------------------------------- started without a stdout or stderr (>&-, 2>&-)

CLOSED = "svcctl: cannot write to stdout: Bad file descriptor\n"


def start_without(fd: int, *args: str, stdout: Any = subprocess.PIPE, env: dict[str, str] | None = None
                  ) -> subprocess.Popen:
    """``python -m svc.cli ARGS`` started with descriptor ``fd`` closed, as ``>&-`` (1) or ``2>&-`` (2) leave it."""
    full = {k: v for k, v in os.environ.items() if k not in CLEARED}
    full.update({"PYTHONPATH": str(REPO), "SERVICE_API_KEY": TOKEN, **(env or {})})
    return subprocess.Popen([sys.executable, "-m", "svc.cli", *args], env=full, stdin=subprocess.DEVNULL,
                            stdout=None if fd == 1 else stdout, stderr=None if fd == 2 else subprocess.PIPE,
                            text=True, preexec_fn=lambda: os.close(fd))


@BUFFERING
@pytest.mark.parametrize("argv", [["hash", "abc"], ["keygen", "q"], ["keys", "list", "--keys-file", "{keys}"],
                                  ["keys", "add", "bob", "--keys-file", "{keys}", "--no-restart"]],
                         ids=["hash", "keygen", "keys list", "keys add"])
def test_a_closed_stdout_is_one_line_and_exit_2_and_no_key_is_stored(offline, argv, unbuffered):
    """``svcctl hash abc >&-`` and the others: ``AttributeError: 'NoneType' object has no attribute 'write'``,
    exit 1 (Python leaves sys.stdout None).  ``keys add`` leaves the key file as it was, as with /dev/full."""
    before = open(offline["keys"]).read()
    proc = start_without(1, *[a.format(**offline) for a in argv], env={"PYTHONUNBUFFERED": unbuffered})
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err, open(offline["keys"]).read()) == (2, CLOSED, before)


def test_infer_with_a_closed_stdout_is_one_line_and_exit_2(tmp_path):
    image = tmp_path / "a.jpg"
    image.write_bytes(b"\xff\xd8\xff")
    with listener() as (server, url):
        proc = start_without(1, "infer", "M", str(image), "--gateway", url)
        answer(server, "200 OK", ENVELOPE)
        _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (2, CLOSED)


def test_a_closed_stderr_never_puts_its_lines_into_stdouts_file(tmp_path):
    """``svcctl infer ... 2>&- > out.json`` wrote the demo-weights note into out.json: ``print(file=sys.stderr)``
    with sys.stderr None prints to stdout."""
    image, out = tmp_path / "a.jpg", tmp_path / "out.json"
    image.write_bytes(b"\xff\xd8\xff")
    with listener() as (server, url), open(out, "w") as stdout:
        proc = start_without(2, "infer", "M", str(image), "--gateway", url, stdout=stdout)
        conn, _ = accept_request_head(server)
        with conn:
            content = json.dumps(ENVELOPE).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Service-Weights: demo\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(content), content))
            assert proc.wait(timeout=60) == 0
    assert out.read_text() == json.dumps(ENVELOPE, indent=2) + "\n"


# ---------------------------------------------------------------- Ctrl-C before main()

#: A ``sitecustomize`` (first on the child's PYTHONPATH, so imported at start-up) that sends the process SIGINT at
#: the first import of ``$SIGINT_AT``: Ctrl-C at that exact moment, without a race against the process's start.
SIGINT_AT_IMPORT = """
import os
import sys


class SigintAt:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ["SIGINT_AT"]:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), 2)  # SIGINT; the signal module is not imported here: it imports enum
        return None


sys.meta_path.insert(0, SigintAt())
"""


@pytest.mark.parametrize("module", ["enum", "svc.cli.__main__"])
def test_ctrl_c_before_main_is_interrupted_and_130(tmp_path, module):
    """docs/cli.md promises ``svcctl: interrupted`` and 130 from the moment svcctl starts; Ctrl-C before main()'s
    handler (enum: imported with the package's first import; ``svc.cli.__main__``: runpy looks for it once the
    package is imported) gave a KeyboardInterrupt traceback and exit 1."""
    (tmp_path / "sitecustomize.py").write_text(SIGINT_AT_IMPORT)
    proc = start("hash", "abc", env={"PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]), "SIGINT_AT": module})
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (130, "", "svcctl: interrupted\n")



# ---------------------------------------------------------------- the working directory's models/ folder

#: A model plugin of the user's own, in the folder ``python -m`` is run from.
USER_PLUGIN = 'print("IMPORTED", flush=True)\n'


def test_python_m_svc_cli_imports_no_models_folder_of_the_working_directory(tmp_path):
    """An installed user's ``mkdir models; echo 'print("IMPORTED")' > models/mine.py; python -m svc.cli weights
    list`` printed IMPORTED: ``-m`` put the working directory first on sys.path, where the ``models`` plugin
    package took in its ``models/``.  The servers run ``python -P`` for that reason; ``svcctl`` never had it."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mine.py").write_text(USER_PLUGIN)
    env = {**{k: v for k, v in os.environ.items() if k not in CLEARED}, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "svc.cli", "weights", "list"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "IMPORTED" not in done.stdout + done.stderr
    assert done.stdout.split()[:2] == ["MODEL", "VARIANT"]
    assert "MOBILENETV2 " in done.stdout  # the service's own plugins, still found
