"""Batching and deadlines on real processes of the test model TESTFAULTS (tests/plugins/models).

Only what needs a real process is here: a batch computed by real torch in a
real worker thread, a forward pass outliving its request, and an image whose
real decoding outlives it.  The logic
(batch formation, the wait queue, partial deadlines, fault containment,
auth before the per-IP limit) is driven step by step in memory in
tests/unit/test_modelserver_routes.py.
"""

from __future__ import annotations

import time

import pytest

from svc.model.images import open_image
from tests.support.http import post
from tests.support.images import b64, image_b64, image_bytes
from tests.support.processes import (
    metric,
    spawn_model_server,
    start_model_server,
    until_all_ready,
    wait_until,
    write_config,
)

URI = "/testfaults/predict"
RED = image_b64(color=(250, 10, 10))
BLUE = image_b64(color=(10, 10, 250))
#: Forward passes that finished (``predict`` returned), from /metrics.
PASSES = 'service_stage_duration_ms_count{stage="inference"}'
#: Decodings that finished: one per request in the decode pool, one per batch in the worker.
DECODES = 'service_stage_duration_ms_count{stage="decode"}'


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """Batches of up to four and a 1 s deadline: one process for both tests."""
    config = write_config(tmp_path_factory.mktemp("faults"), "TESTFAULTS", max_batch_size=4, run_timeout_ms=1000)
    server = start_model_server(config)
    yield server
    server.stop()


def infer(server, images, **params):
    body = {"images": images}
    if params:
        body["params"] = params
    return post(server.url + URI, body, headers=server.auth)


def test_a_multi_image_request_is_one_batch(faults):
    reply = infer(faults, [RED, BLUE, RED])
    assert [r["data"]["batch_size"] for r in reply.json["results"]] == [3, 3, 3]
    assert reply.json["results"][0]["data"]["mean"][0] > 200 and reply.json["results"][1]["data"]["mean"][2] > 200


def test_deadline_with_nothing_done_is_504_status_4_and_the_late_pass_is_harmless(faults):
    # A real forward pass outlives its request in a worker thread; the server answers on time and goes on.
    before = metric(faults, PASSES)
    reply = infer(faults, [RED], sleep_ms=1500)
    assert reply.status == 504
    assert (reply.json["status"], reply.json["partial"]) == (4, False)
    assert reply.json["results"] == [{"status": 4, "data": None, "error": reply.json["results"][0]["error"]}]
    wait_until(lambda: metric(faults, PASSES) == before + 1, "the late forward pass ends")
    assert infer(faults, [RED]).json["status"] == 0




def test_a_bad_image_keeps_its_status_beside_an_image_whose_decoding_outlasts_the_deadline(tmp_path):
    """A junk or empty image beside a 6000x6000 PNG (about 1.2 s to decode here) was answered 504 with both items
    status 4, in the worker and in the decode pool (probe): the bad item keeps its own status, the reply is 200
    status 68.  The deadline is a quarter of the PNG's decoding as timed here, so the PNG always outlasts it."""
    png = image_bytes(width=6000, height=6000, color=(10, 200, 30))
    started = time.perf_counter()
    open_image(png, 40_000_000).convert("RGB")
    deadline_ms = max(100, int((time.perf_counter() - started) * 1000 / 4))
    servers = until_all_ready(*(spawn_model_server(write_config(tmp_path, "TESTFAULTS", run_timeout_ms=deadline_ms,
                                                                backend={"decode_in_worker": in_worker}))
                                for in_worker in (True, False)))
    timed_out = {"status": 4, "data": None, "error": "the deadline passed before this item finished"}
    junk = {"status": 5, "data": None,
            "error": "not a decodable image (JPEG, PNG, WebP, GIF, BMP, TIFF, AVIF, JPEG 2000, PNM, TGA, ICO or QOI)"}
    empty = {"status": 3, "data": None, "error": "input image is empty"}
    try:
        for server in servers:
            for images, results in (([b64(b"junk"), b64(png)], [junk, timed_out]), ([b64(png), ""], [timed_out, empty])):
                decoded = metric(server, DECODES)
                reply = infer(server, images)
                assert (reply.status, reply.json["status"], reply.json["partial"]) == (200, 68, True), reply.json
                assert reply.json["results"] == results
                wait_until(lambda s=server, n=decoded + 1: metric(s, DECODES) == n, "the PNG's decoding ends")
    finally:
        for server in servers:
            server.stop()
