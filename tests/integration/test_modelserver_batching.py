"""Batching and deadlines on real processes of the test model TESTFAULTS (tests/plugins/models).

Only what needs a real process is here: a batch computed by real torch in a
real worker thread, and a forward pass outliving its request.  The logic
(batch formation, the wait queue, partial deadlines, fault containment,
auth before the per-IP limit) is driven step by step in memory in
tests/unit/test_modelserver_routes.py.
"""

from __future__ import annotations

import pytest

from tests.support.http import post
from tests.support.images import image_b64
from tests.support.processes import metric, start_model_server, wait_until, write_config

URI = "/testfaults/predict"
RED = image_b64(color=(250, 10, 10))
BLUE = image_b64(color=(10, 10, 250))
#: Forward passes that finished (``predict`` returned), from /metrics.
PASSES = 'service_stage_duration_ms_count{stage="inference"}'


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


