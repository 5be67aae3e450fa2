"""The model-server contract on a real MOBILENETV2 process over real HTTP.

Every bad input gets its documented status, and a good request still
succeeds afterwards (the ``assert_still_serving`` at the end of each test).
"""

from __future__ import annotations

import io
import json
import re
import signal
import socket

import numpy as np
import pytest
from PIL import Image

from tests.support.http import get, post, raw_exchange, request
from tests.support.images import b64, image_b64, image_bytes, jpeg_with_orientation, stored_pixels, undecodable_avif
from tests.support.processes import start_model_server, write_config

URI = "/mobilenetv2/predict"
ENVELOPE_FIELDS = ["status", "status_str", "task_id", "model", "results", "server_time_ms", "partial"]


def infer(server, body, headers=None, **kw):
    return post(server.url + URI, body, headers={**server.auth, **(headers or {})}, **kw)


def assert_still_serving(server):
    reply = infer(server, {"images": [image_b64()]})
    assert reply.status == 200 and reply.json["status"] == 0


def assert_rejection(reply, http, status, pointers=None):
    assert reply.status == http, reply.body
    assert reply.header("Content-Type") == "application/json; charset=utf-8"
    body = reply.json
    assert body["status"] == status
    assert body["results"] == []
    assert body["model"]["name"] == "MOBILENETV2"
    assert reply.header("X-Request-ID") == body["task_id"]
    assert reply.header("Cache-Control") == "no-store"
    if pointers is not None:
        assert [e["pointer"] for e in body["errors"]] == pointers
    return body


# -- success ---------------------------------------------------------------------------


def test_success_reply_has_exactly_the_spec_fields_and_headers(mobilenet):
    reply = infer(mobilenet, {"images": [image_b64(seed=1), image_b64(seed=2, fmt="JPEG")], "req_id": "req-42",
                              "params": {"top_k": 3}})
    assert reply.status == 200
    assert reply.header("Content-Type") == "application/json; charset=utf-8"
    assert reply.header("X-Request-ID") == "req-42"
    assert reply.header("Cache-Control") == "no-store"
    body = reply.json
    assert list(body) == ENVELOPE_FIELDS
    assert (body["status"], body["status_str"], body["task_id"], body["partial"]) == (0, "SUCCESS", "req-42", False)
    assert body["model"] == {"name": "MOBILENETV2", "version": "random-init-seed0"}
    assert body["server_time_ms"] > 0
    assert len(body["results"]) == 2
    for item in body["results"]:
        assert item["status"] == 0
        data = item["data"]
        assert set(data) == {"class_id", "category", "scores", "class_ids", "categories"}
        assert len(data["scores"]) == 3 and data["scores"] == sorted(data["scores"], reverse=True)
        assert data["class_id"] == data["class_ids"][0] and data["category"] == data["categories"][0]
        assert all(0 < s < 1 for s in data["scores"])


def test_server_generates_a_task_id_or_uses_x_request_id(mobilenet):
    generated = infer(mobilenet, {"images": [image_b64()]})
    assert len(generated.json["task_id"]) == 32 and generated.header("X-Request-ID") == generated.json["task_id"]
    echoed = infer(mobilenet, {"images": [image_b64()]}, {"X-Request-ID": "from-header"})
    assert echoed.json["task_id"] == "from-header"


def test_top_k_and_max_results(mobilenet):
    data = infer(mobilenet, {"images": [image_b64()], "params": {"top_k": 1000}}).json["results"][0]["data"]
    assert len(data["scores"]) == 1000 and abs(sum(data["scores"]) - 1.0) < 1e-3
    assert sorted(data["class_ids"]) == list(range(1000))
    capped = infer(mobilenet, {"images": [image_b64()], "params": {"top_k": 10}, "options": {"max_results": 2}})
    assert len(capped.json["results"][0]["data"]["scores"]) == 2
    default = infer(mobilenet, {"images": [image_b64()]}).json["results"][0]["data"]
    assert len(default["scores"]) == 5


def test_raw_body_is_one_item_with_header_params(mobilenet):
    reply = request("POST", mobilenet.url + URI, image_bytes(fmt="JPEG"), headers={
        **mobilenet.auth, "Content-Type": "image/jpeg", "X-Service-Params": '{"top_k": 2}', "X-Request-ID": "raw-1"})
    assert reply.status == 200
    assert reply.json["task_id"] == "raw-1" and len(reply.json["results"]) == 1
    assert len(reply.json["results"][0]["data"]["scores"]) == 2
    octet = request("POST", mobilenet.url + URI, image_bytes(), headers={**mobilenet.auth, "Content-Type": "application/octet-stream"})
    assert octet.status == 200 and octet.json["results"][0]["status"] == 0


@pytest.mark.parametrize("header, where", [("X-Service-Params", "/params"), ("X-Service-Options", "/options")])
def test_raw_body_bad_header_json_is_422(mobilenet, header, where):
    reply = request("POST", mobilenet.url + URI, image_bytes(), headers={**mobilenet.auth, "Content-Type": "image/png", header: "{nope"})
    assert_rejection(reply, 422, 66, [where])
    assert_still_serving(mobilenet)


# -- per-item failures --------------------------------------------------------------------


def test_one_bad_item_fails_alone(mobilenet):
    reply = infer(mobilenet, {"images": [image_b64(), "", "%%%not-base64", b64(b"not an image"), image_b64(fmt="JPEG")]})
    assert reply.status == 200
    body = reply.json
    assert (body["status"], body["partial"]) == (0, False)
    assert [r["status"] for r in body["results"]] == [0, 3, 5, 5, 0]
    assert [r["data"] is None for r in body["results"]] == [False, True, True, True, False]
    assert all(r["error"] for r in body["results"][1:4])


def test_all_items_failing_on_input_is_400_with_the_first_status(mobilenet):
    reply = infer(mobilenet, {"images": ["", b64(b"junk")]})
    assert reply.status == 400
    assert (reply.json["status"], reply.json["status_str"]) == (3, "IMAGE_EMPTY")
    assert [r["status"] for r in reply.json["results"]] == [3, 5]
    raw_empty = request("POST", mobilenet.url + URI, b"", headers={**mobilenet.auth, "Content-Type": "image/png"})
    assert raw_empty.status == 400 and raw_empty.json["results"][0]["status"] == 3
    assert_still_serving(mobilenet)


def test_image_over_the_pixel_limit_fails_its_item(mobilenet):
    # 10000 x 5000 = 5e7 pixels > max_image_pixels (4e7); a PNG of one colour stays small.
    big = image_b64(width=10000, height=5000)
    reply = infer(mobilenet, {"images": [big, image_b64()]})
    assert reply.status == 200
    assert [r["status"] for r in reply.json["results"]] == [5, 0]
    assert "max_image_pixels" in reply.json["results"][0]["error"]


@pytest.mark.parametrize(("orientation", "turn"), [(6, Image.Transpose.ROTATE_270), (8, Image.Transpose.ROTATE_90)])
def test_exif_orientation_is_applied_before_preprocessing(mobilenet, orientation, turn):
    """A JPEG tagged with EXIF Orientation 6 (or 8) is classified as the
    image a viewer shows: exactly the result of its stored pixels physically
    turned and sent without a tag (a lossless PNG), not that of the stored
    pixels as they are."""
    stored = Image.fromarray(np.random.default_rng(orientation).integers(0, 256, (96, 160, 3), dtype=np.uint8))
    tagged = jpeg_with_orientation(stored, orientation)
    pixels = stored_pixels(tagged)
    turned, upright = io.BytesIO(), io.BytesIO()
    pixels.transpose(turn).save(turned, "PNG")
    pixels.save(upright, "PNG")
    reply = infer(mobilenet, {"images": [b64(tagged), b64(turned.getvalue()), b64(upright.getvalue())],
                              "params": {"top_k": 1000}})
    assert reply.status == 200 and reply.json["status"] == 0
    assert [r["status"] for r in reply.json["results"]] == [0, 0, 0]
    served, expected, unturned = (r["data"] for r in reply.json["results"])
    assert served == expected
    assert served != unturned


# -- request rules -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, pointers",
    [
        ({"images": ["x"], "colour": 1}, ["/colour"]),
        ({"images": ["x"], "top_k": 3}, ["/top_k"]),
        ({"images": ["x"], "params": {"top_k": 0}}, ["/params/top_k"]),
        ({"images": ["x"], "params": {"top_k": "3"}}, ["/params/top_k"]),
        ({"images": ["x"], "params": {"top_q": 3}}, ["/params/top_q"]),
        ({"images": ["x"], "options": {"image_format": "png"}}, ["/options/image_format"]),
        ({"img_data": "x"}, ["/images", "/img_data"]),
        ({"img_data": "x", "images": ["x"]}, ["/img_data"]),
        ({"req_id": "r", "code": 0, "msg": "", "data": {}}, ["/code", "/data", "/images", "/msg"]),
        ({}, ["/images"]),
        ({"images": "x"}, ["/images"]),
        ({"images": []}, ["/images"]),
        ({"images": ["x", 7]}, ["/images/1"]),
    ],
)
def test_contract_violations_are_422_status_66(mobilenet, body, pointers):
    reply = infer(mobilenet, body)
    got = assert_rejection(reply, 422, 66)
    assert sorted(e["pointer"] for e in got["errors"]) == pointers
    assert all(e["message"] for e in got["errors"])
    assert_still_serving(mobilenet)


def test_img_data_message_gives_the_migration(mobilenet):
    got = assert_rejection(infer(mobilenet, {"img_data": "x", "images": ["x"]}), 422, 66, ["/img_data"])
    assert "images[0]" in got["errors"][0]["message"]


def test_a_422_has_its_reason_phrase(mobilenet):
    """twisted's table has no 422: its status line said "Unknown Status"."""
    body = json.dumps({"img_data": "x"}).encode()
    reply = raw_exchange(mobilenet.port, b"POST " + URI.encode() + b" HTTP/1.1\r\nHost: m\r\nConnection: close\r\n"
                         b"Authorization: Bearer " + mobilenet.token.encode() + b"\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert reply.startswith(b"HTTP/1.1 422 Unprocessable Content\r\n"), reply[:200]


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b"null"])
def test_body_not_a_json_object_is_400_status_50(mobilenet, body):
    reply = request("POST", mobilenet.url + URI, body, headers={**mobilenet.auth, "Content-Type": "application/json"})
    assert_rejection(reply, 400, 50)
    assert_still_serving(mobilenet)


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", None])
def test_unsupported_content_type_is_415_status_60(mobilenet, ctype):
    headers = dict(mobilenet.auth)
    if ctype:
        headers["Content-Type"] = ctype
    reply = request("POST", mobilenet.url + URI, b'{"images": ["x"]}', headers=headers)
    assert_rejection(reply, 415, 60)
    assert_still_serving(mobilenet)


def test_too_many_images_is_413_status_67(mobilenet):
    assert_rejection(infer(mobilenet, {"images": [image_b64()] * 7}), 413, 67)
    assert infer(mobilenet, {"images": [image_b64()] * 6}).status == 200
    # named by the client's req_id, as the 422 and the 200 are (it had a new task_id)
    assert assert_rejection(infer(mobilenet, {"images": [image_b64()] * 7, "req_id": "many-413"}),
                            413, 67)["task_id"] == "many-413"


def test_a_small_body_of_many_bad_entries_gets_a_small_reply(mobilenet):
    """200 KB of ``images`` numbers or of unknown fields: each was made an ``errors[]`` entry first, so that a
    6 MB body took 84 s and a 233 MB reply (security probe). Now the count is checked first, and a 422 lists at
    most 50 errors and counts the rest."""
    zeros = request("POST", mobilenet.url + URI, b'{"images": [' + b",".join([b"0"] * 100_000) + b"]}",
                    headers={**mobilenet.auth, "Content-Type": "application/json"})
    body = assert_rejection(zeros, 413, 67)
    assert body["error"] == "100000 images in one request; at most 6 are accepted (max_request_items)", body
    assert len(zeros.body) < 1000
    fields = infer(mobilenet, {"images": [image_b64()], **{f"k{i}": 1 for i in range(20_000)}})
    body = assert_rejection(fields, 422, 66, [f"/k{i}" for i in range(50)])
    assert body["error"].endswith("(and 19999 more); errors[] lists the first 50"), body["error"]
    assert_still_serving(mobilenet)


def test_body_over_the_limit_is_413_status_61(mobilenet):
    big = {"images": ["A" * (300 * 1024)]}  # limit of the test server: 256 KiB
    body = assert_rejection(infer(mobilenet, big), 413, 61)
    assert "max_body_bytes" in body["error"]
    assert_still_serving(mobilenet)


def test_huge_body_is_refused_before_it_is_sent(mobilenet):
    """Only the headers go out: the 413 arrives although the body never does."""
    with socket.create_connection(("127.0.0.1", mobilenet.port), timeout=10) as s:
        s.sendall(
            f"POST {URI} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {mobilenet.token}\r\n"
            "Content-Type: application/json\r\nContent-Length: 10000000000\r\nExpect: 100-continue\r\n\r\n".encode()
        )
        data = b""
        while not data.endswith(b"}") or b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 ")
    assert b"100 Continue" not in head
    assert json.loads(payload)["status"] == 61
    assert_still_serving(mobilenet)


def test_chunked_body_growing_past_the_limit_is_413(mobilenet):
    def chunks():
        for _ in range(40):
            yield b"A" * 16384

    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", mobilenet.port, timeout=30)
    conn.request("POST", URI, body=chunks(), headers={**mobilenet.auth, "Content-Type": "application/json"},
                 encode_chunked=True)
    resp = conn.getresponse()
    assert resp.status == 413 and json.loads(resp.read())["status"] == 61
    conn.close()
    assert_still_serving(mobilenet)


# -- process routes -----------------------------------------------------------------------


def test_health_ready_openapi_need_no_token(mobilenet):
    for path in ("/healthz", "/ready"):
        reply = get(mobilenet.url + path)
        assert reply.status == 200 and reply.json["status"] == 0 and reply.json["results"] == []
    doc = get(mobilenet.url + "/openapi.json")
    assert doc.status == 200 and doc.header("Content-Type") == "application/json; charset=utf-8"
    assert URI in doc.json["paths"] and doc.json["openapi"].startswith("3.1")


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer "},
                                     {"Authorization": "Basic bW9kZWw6dG9rZW4="}])
def test_inference_and_metrics_need_the_token(mobilenet, headers):
    reply = post(mobilenet.url + URI, {"images": [image_b64()]}, headers=headers)
    assert_rejection(reply, 401, 401)
    assert reply.header("WWW-Authenticate", ) is not None
    assert_rejection(get(mobilenet.url + "/metrics", headers=headers), 401, 401)


def test_metrics_text(mobilenet):
    infer(mobilenet, {"images": [image_b64()]})
    reply = get(mobilenet.url + "/metrics", headers=mobilenet.auth)
    assert reply.status == 200 and reply.header("Content-Type").startswith("text/plain")
    text = reply.body.decode()
    for name in ("service_http_requests_total", "service_http_request_duration_ms_bucket", "service_queue_rejected_total",
                 "service_batch_size_bucket", "service_batch_window_wait_ms_bucket", "service_stage_duration_ms_bucket",
                 'service_model_ready 1.0'):
        assert name in text, name
    assert 'service_http_requests_total{code="200",method="POST",route="infer"}' in text
    assert 'stage="decode"' in text and 'stage="inference"' in text and 'stage="queue_wait"' in text
    # svc.infra.process.freeze_heap ran once the model was warm: torch and the model are far more than 100k objects
    frozen = re.search(r"^service_gc_frozen_objects (\S+)$", text, re.M)
    assert frozen and float(frozen.group(1)) > 100_000, frozen
    assert re.search(r'^python_gc_collections_total\{generation="2"\} ', text, re.M)


@pytest.mark.parametrize("path", ["/welcome", "/hello_world", "/nope", "/v1/models/MOBILENETV2/infer", "/jobs"])
def test_unknown_paths_are_404_status_63(mobilenet, path):
    assert_rejection(get(mobilenet.url + path), 404, 63)
    assert_rejection(post(mobilenet.url + path, {"images": ["x"]}), 404, 63)


@pytest.mark.parametrize("method, path, allow", [("GET", URI, "POST"), ("PUT", URI, "POST"),
                                                 ("DELETE", "/healthz", "GET, HEAD"), ("POST", "/ready", "GET, HEAD"),
                                                 ("POST", "/metrics", "GET, HEAD")])
def test_wrong_method_is_405_status_62_with_allow(mobilenet, method, path, allow):
    reply = request(method, mobilenet.url + path, headers=mobilenet.auth)
    assert_rejection(reply, 405, 62)
    assert reply.header("Allow") == allow
    for listed in allow.split(", "):  # what Allow lists is served (HEAD with GET: an OIP probe's 200)
        assert request(listed, mobilenet.url + path, headers=mobilenet.auth).status != 405, listed


# -- backend.decode_in_worker ---------------------------------------------------------------


@pytest.fixture(scope="module")
def decode_pool(conf_dir):
    """MOBILENETV2 with ``decode_in_worker = false``: images decoded in the decode pool."""
    proc = start_model_server(write_config(conf_dir, "MOBILENETV2", name="MOBILENETV2-decode-pool.toml",
                                           max_request_items=6, backend={"decode_in_worker": False}))
    yield proc
    proc.stop(signal.SIGTERM)


def test_decoding_in_the_worker_answers_as_the_decode_pool_does(mobilenet, decode_pool):
    assert "images decoded in the inference thread" in mobilenet.output()  # the CPU default
    assert "images decoded in the decode pool" in decode_pool.output()
    # An AVIF that Pillow cannot decode raises RuntimeError: a 500 item in the worker, and in the decode pool
    # every item of the request failed 500 with it.
    images = [image_b64(seed=1), "", "%%%not-base64", b64(b"not an image"), b64(undecodable_avif()),
              image_b64(seed=2, fmt="JPEG")]
    in_worker = infer(mobilenet, {"images": images, "params": {"top_k": 3}})
    pooled = infer(decode_pool, {"images": images, "params": {"top_k": 3}})
    for reply in (in_worker, pooled):
        assert (reply.status, reply.json["status"]) == (200, 0)
        assert [r["status"] for r in reply.json["results"]] == [0, 3, 5, 5, 5, 0]
        assert all(r["error"] for r in reply.json["results"][1:5])
        assert reply.json["results"][4]["error"] == "image cannot be read: RuntimeError: Failed to decode image: Not implemented"
    for mine, theirs in zip(in_worker.json["results"], pooled.json["results"]):
        assert mine["data"] == theirs["data"]  # same classes and scores; None for the bad items
    # Every item bad: nothing reaches the forward pass; both answer 400 with the first item's status.
    for server in (mobilenet, decode_pool):
        all_bad = infer(server, {"images": ["", b64(b"junk")]})
        assert (all_bad.status, all_bad.json["status"]) == (400, 3)
        assert [r["status"] for r in all_bad.json["results"]] == [3, 5]
        metrics = get(server.url + "/metrics", headers=server.auth).body.decode()
        assert re.search(r'^service_stage_duration_ms_count\{stage="decode"\} [1-9]', metrics, re.M)
        assert_still_serving(server)
