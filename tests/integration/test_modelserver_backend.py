"""``[backend]`` workers, threads and worker_nice, ``gpu_mem_limit_mb`` on a CPU machine, and the
model server's item, identity and queue metrics, observed on real processes.

Threads are read from ``/proc/<pid>/task/*/stat``: the inference threads lower their own nice value
before their first torch op, and the OpenMP threads torch starts from them inherit it, so the threads at
``worker_nice`` are exactly the inference threads that have run and their intra-op helpers.
"""

from __future__ import annotations

import os
import re
import threading

import pytest

from tests.support.http import get, post
from tests.support.images import b64, image_b64
from tests.support.processes import start_model_server, wait_until, write_config

FAULTS_URI = "/testfaults/predict"


def thread_nices(pid: int) -> list[int]:
    """The nice value of every thread of ``pid``."""
    nices = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:  # a thread that just ended
            continue
        nices.append(int(stat[stat.rindex(")") + 2:].split()[16]))  # field 19 of proc(5): nice
    return nices


def metric_samples(server, name: str) -> dict[str, float]:
    """Every sample of one metric: its label set as written (or "") -> value."""
    text = get(server.url + "/metrics", headers=server.auth).body.decode()
    return {m.group(1) or "": float(m.group(2)) for m in re.finditer(rf"^{name}(\{{.*\}})? (\S+)$", text, re.M)}


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """TESTFAULTS with two inference threads of one torch thread each at nice 7, and a 1 MiB GPU cap."""
    config = write_config(tmp_path_factory.mktemp("backend"), "TESTFAULTS", max_batch_size=1, gpu_mem_limit_mb=1,
                          backend={"workers": 2, "threads": 1, "worker_nice": 7})
    server = start_model_server(config)
    yield server
    server.stop()


def test_gpu_mem_limit_mb_is_not_applied_on_cpu(faults):
    """A cap far below any model is a GPU-only setting: on CPU the model loads, serves, and nothing is said of it."""
    reply = post(faults.url + FAULTS_URI, {"images": [image_b64()]}, headers=faults.auth)
    assert (reply.status, reply.json["status"]) == (200, 0)
    assert "gpu_mem_limit" not in faults.output() and "memory fraction" not in faults.output()
    assert list(metric_samples(faults, "service_model_info")) == [
        f'{{device="cpu",model="TESTFAULTS",optimize="eager",replica="0",version="{reply.json["model"]["version"]}"}}']


def test_two_workers_run_two_batches_at_once_at_worker_nice(faults):
    pid = faults.popen.pid
    assert sorted(set(thread_nices(pid))) == [0, 7]  # the warm-up ran on one inference thread
    replies = []
    body = {"images": [image_b64()], "params": {"sleep_ms": 2000}}
    callers = [threading.Thread(target=lambda: replies.append(post(faults.url + FAULTS_URI, body, headers=faults.auth)))
               for _ in range(3)]
    for caller in callers:
        caller.start()
    # Two batches run while the third request's item waits: both inference threads are busy, at nice 7.
    wait_until(lambda: metric_samples(faults, "service_queue_depth") == {"": 1.0} and thread_nices(pid).count(7) == 2,
               "two batches running and one item waiting")
    assert replies == []
    for caller in callers:
        caller.join(60)
    assert [(r.status, r.json["status"]) for r in replies] == [(200, 0)] * 3
    assert metric_samples(faults, "service_queue_depth") == {"": 0.0}
    nices = thread_nices(pid)
    assert nices.count(7) == 2 and set(nices) == {0, 7}  # one torch thread per worker: no OpenMP helpers


def test_items_are_counted_by_their_status(faults):
    before = metric_samples(faults, "service_items_total")
    images = [image_b64(), "", "%%%not-base64", b64(b"not an image"), image_b64(seed=2)]
    reply = post(faults.url + FAULTS_URI, {"images": images}, headers=faults.auth)
    assert [r["status"] for r in reply.json["results"]] == [0, 3, 5, 5, 0]
    after = metric_samples(faults, "service_items_total")
    delta = {label: after[label] - before.get(label, 0.0) for label in after}
    assert {label: n for label, n in delta.items() if n} == {
        '{status="SUCCESS"}': 2.0, '{status="IMAGE_EMPTY"}': 1.0, '{status="INVALID_IMAGE"}': 2.0}


def test_torch_intra_op_threads_follow_backend_threads(tmp_path):
    """``threads = 3``: the inference thread and the two OpenMP threads its forward pass starts, all at nice 9."""
    config = write_config(tmp_path, "MOBILENETV2", backend={"workers": 1, "threads": 3, "worker_nice": 9})
    server = start_model_server(config)
    try:
        reply = post(server.url + "/mobilenetv2/predict", {"images": [image_b64()]}, headers=server.auth)
        assert (reply.status, reply.json["status"]) == (200, 0)
        nices = thread_nices(server.popen.pid)
        assert nices.count(9) == 3 and set(nices) == {0, 9}
    finally:
        server.stop()
