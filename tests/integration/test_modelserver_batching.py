"""Batching, deadlines, the wait queue, fault isolation and the per-IP limit,
on real processes of the test model TESTFAULTS (tests/plugins/models)."""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.http import get, post
from tests.support.images import image_b64
from tests.support.processes import start_model_server, write_config

URI = "/testfaults/predict"
RED = image_b64(color=(250, 10, 10))
BLUE = image_b64(color=(10, 10, 250))


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    server = start_model_server(write_config(tmp_path_factory.mktemp("faults"), "TESTFAULTS", max_batch_size=4))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    """One item per batch, a 1 s deadline and room for two waiting items."""
    config = write_config(tmp_path_factory.mktemp("tight"), "TESTFAULTS", max_batch_size=1, run_timeout_ms=1000,
                          max_queue_depth=2)
    server = start_model_server(config)
    yield server
    server.stop()


def infer(server, images, **params):
    body = {"images": images}
    if params:
        body["params"] = params
    return post(server.url + URI, body, headers=server.auth)


def in_background(fn, *args, **kw):
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("reply", fn(*args, **kw)))
    thread.start()
    return thread, result


def test_items_of_concurrent_requests_share_a_batch(faults):
    thread, slow = in_background(infer, faults, [BLUE], sleep_ms=600)
    time.sleep(0.3)  # the worker is busy: the next four requests wait together
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda _: infer(faults, [RED]), range(4)))
    thread.join()
    assert slow["reply"].json["results"][0]["data"]["batch_size"] == 1
    assert [r.json["results"][0]["data"]["batch_size"] for r in replies] == [4, 4, 4, 4]


def test_a_multi_image_request_is_one_batch(faults):
    reply = infer(faults, [RED, BLUE, RED])
    assert [r["data"]["batch_size"] for r in reply.json["results"]] == [3, 3, 3]
    assert reply.json["results"][0]["data"]["mean"][0] > 200 and reply.json["results"][1]["data"]["mean"][2] > 200


def test_engine_failure_fails_every_item_of_its_run_and_no_other(faults):
    thread, good = in_background(infer, faults, [RED, BLUE], sleep_ms=300)
    time.sleep(0.05)
    bad = infer(faults, [RED, BLUE], fail="engine")
    thread.join()
    assert bad.status == 500 and (bad.json["status"], bad.json["status_str"]) == (1, "ENGINE_ERROR")
    assert [r["status"] for r in bad.json["results"]] == [1, 1]
    assert "injected engine failure" in bad.json["results"][0]["error"]
    assert good["reply"].status == 200 and [r["status"] for r in good["reply"].json["results"]] == [0, 0]


def test_wrong_number_of_outputs_is_a_contract_failure_for_the_run(faults):
    reply = infer(faults, [RED, BLUE], fail="length")
    assert reply.status == 500 and reply.json["status"] == 6
    assert [r["status"] for r in reply.json["results"]] == [6, 6]


def test_data_breaking_its_schema_fails_only_that_item(faults):
    reply = infer(faults, [RED, BLUE], fail="item")
    assert reply.status == 200 and reply.json["status"] == 0
    assert [r["status"] for r in reply.json["results"]] == [6, 0]
    assert infer(faults, [RED]).json["status"] == 0


def test_deadline_with_some_items_done_is_200_status_68(tight):
    # items of 700 ms each, one per batch, a 1000 ms deadline: the first finishes, the second cannot.
    reply = infer(tight, [RED, BLUE], sleep_ms=700)
    assert reply.status == 200
    body = reply.json
    assert (body["status"], body["status_str"], body["partial"]) == (68, "PARTIAL", True)
    assert [r["status"] for r in body["results"]] == [0, 4]
    assert body["results"][1]["data"] is None
    time.sleep(0.6)  # let the started batch finish


def test_deadline_with_nothing_done_is_504_status_4(tight):
    reply = infer(tight, [RED], sleep_ms=1500)
    assert reply.status == 504
    assert (reply.json["status"], reply.json["partial"]) == (4, False)
    assert reply.json["results"] == [{"status": 4, "data": None, "error": reply.json["results"][0]["error"]}]
    time.sleep(0.7)
    assert infer(tight, [RED]).json["status"] == 0


def test_full_wait_queue_is_429_with_retry_after(tight):
    def rejected_count():
        text = get(tight.url + "/metrics", headers=tight.auth).body.decode()
        return float(re.search(r"^service_queue_rejected_total (\S+)$", text, re.M).group(1))

    before = rejected_count()
    running, _ = in_background(infer, tight, [RED], sleep_ms=800)
    time.sleep(0.2)
    waiting, queued = in_background(infer, tight, [RED, BLUE])  # two items wait: the queue is full
    time.sleep(0.2)
    reply = infer(tight, [RED])
    running.join()
    waiting.join()
    assert reply.status == 429 and reply.json["status"] == 429 and reply.json["results"] == []
    assert 1 <= int(reply.header("Retry-After")) <= 60
    assert queued["reply"].status == 200
    assert rejected_count() == before + 1
    assert infer(tight, [RED]).status == 200


def test_authentication_comes_before_the_per_ip_rate_limit(tmp_path):
    server = start_model_server(write_config(tmp_path, "TESTFAULTS", rate_limit_qps=3))
    try:
        for _ in range(10):
            assert post(server.url + URI, {"images": [RED]}).status == 401
        codes = [infer(server, [RED]).status for _ in range(5)]
        assert codes[:3] == [200, 200, 200] and 429 in codes[3:]
        limited = next(r for r in (infer(server, [RED]) for _ in range(3)) if r.status == 429)
        assert limited.json["status"] == 429 and int(limited.header("Retry-After")) >= 1
        time.sleep(1.1)
        assert infer(server, [RED]).status == 200
    finally:
        server.stop()
