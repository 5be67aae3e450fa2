"""Archive ``handler.py`` and run TorchServe 0.12 with it on loopback ports (a context manager).

Settings, as the issue's peer figures were taken: batch 8 with a 5 ms
``maxBatchDelay``, one worker of 2 torch threads (``BENCH_TORCH_THREADS``),
glibc malloc tuned in the worker, token authorization off; everything else
TorchServe's defaults (its access log and metrics included: they are part
of what it costs).  The frontend, the worker and the launcher form one
process group, stopped together.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench.threadcpu import process_tree_cpu
from bench.torchserve.install import install
from tests.support.processes import REPO, child_env, free_port

HERE = Path(__file__).resolve().parent
MODEL = "mobilenetv2"


class TorchServe:
    """A running TorchServe serving MOBILENETV2 at ``url`` (``POST`` one image as the raw body)."""

    def __init__(self, *, batch_size: int = 8, max_batch_delay_ms: int = 5, threads: int = 2,
                 ready_timeout: float = 300.0) -> None:
        self.batch_size = batch_size
        self.max_batch_delay_ms = max_batch_delay_ms
        self.threads = threads
        self.ready_timeout = ready_timeout
        self.work = Path(tempfile.mkdtemp(prefix="bench-torchserve-"))
        self.popen: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/predictions/{MODEL}"

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def cpu_ms(self) -> float:
        """CPU time of the launcher, the Java frontend and the Python worker together."""
        return sum(process_tree_cpu(self.pid).values())

    def _archive(self, python: Path) -> Path:
        store = self.work / "store"
        store.mkdir()
        config = self.work / "model-config.yaml"
        config.write_text(f"minWorkers: 1\nmaxWorkers: 1\nbatchSize: {self.batch_size}\n"
                          f"maxBatchDelay: {self.max_batch_delay_ms}\nresponseTimeout: 120\n")
        archiver = python.parent / "torch-model-archiver"
        subprocess.run([str(archiver), "--model-name", MODEL, "--version", "1.0", "--handler",
                        str(HERE / "handler.py"), "--config-file", str(config), "--export-path", str(store)],
                       check=True, capture_output=True)
        return store

    def start(self, probe_body: bytes) -> "TorchServe":
        python = install()
        store = self._archive(python)
        self.port, management, metrics = free_port(), free_port(), free_port()
        props = self.work / "config.properties"
        props.write_text("\n".join([
            f"inference_address=http://127.0.0.1:{self.port}",
            f"management_address=http://127.0.0.1:{management}",
            f"metrics_address=http://127.0.0.1:{metrics}",
            "disable_token_authorization=true",
            "default_workers_per_model=1",
            "job_queue_size=1000",
            f"model_store={store}",
        ]) + "\n")
        env = child_env({"BENCH_TORCH_THREADS": str(self.threads), "LOG_LOCATION": str(self.work / "logs"),
                         "METRICS_LOCATION": str(self.work / "logs")})
        log = open(self.work / "torchserve.out", "wb")
        self.popen = subprocess.Popen(
            [str(python.parent / "torchserve"), "--start", "--foreground", "--ncs", "--ts-config", str(props),
             "--model-store", str(store), "--models", f"{MODEL}={MODEL}.mar", "--disable-token-auth"],
            cwd=self.work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self._wait_ready(probe_body)
        return self

    def _wait_ready(self, body: bytes) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"torchserve exited with {self.popen.returncode}: {self.output()[-3000:]}")
            request = urllib.request.Request(self.url, data=body, method="POST",
                                             headers={"Content-Type": "image/jpeg"})
            try:
                with urllib.request.urlopen(request, timeout=30) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"torchserve not serving after {self.ready_timeout:g} s: {self.output()[-3000:]}")

    def output(self) -> str:
        text = (self.work / "torchserve.out").read_text(errors="replace")
        worker_log = self.work / "logs" / "model_log.log"
        return text + (worker_log.read_text(errors="replace") if worker_log.exists() else "")

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def __enter__(self) -> "TorchServe":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["TorchServe", "REPO"]
