"""The Open Inference Protocol through a real gateway and real model servers, with tritonclient's HTTP client."""

from __future__ import annotations

import base64
import csv
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.support.gateway import GATEWAY_TOKENS, start_gateway
from tests.support.http import get, post, raw_exchange, request
from tests.support.images import image_b64, image_bytes
from tests.support.processes import REPO, SHIPPED_CONF, free_port, spawn_model_server, until_all_ready, write_config
from tests.support.stack import key_entry

KEY, SLOW_KEY = "a" * 64, "b" * 64


def auth(key: str = KEY) -> dict[str, str]:
    """A fresh headers dict: tritonclient adds its own headers to the dict it is given."""
    return {"Authorization": f"Bearer {key}"}

YOLO_PARAMS = {"score_threshold": 0.0, "top_k": 5}
MAX_BODY = 1_000_000


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """MOBILENETV2, YOLOV8 and TESTFAULTS behind one gateway, and STOPPED, whose model server is not running."""
    root = tmp_path_factory.mktemp("oip")
    servers = root / "server"
    servers.mkdir()
    ports = {m: free_port() for m in ("MOBILENETV2", "YOLOV8", "TESTFAULTS")}
    configs = {
        "MOBILENETV2": write_config(servers, "MOBILENETV2", name="MOBILENETV2.toml", port=ports["MOBILENETV2"]),
        "YOLOV8": write_config(servers, "YOLOV8", name="YOLOV8.toml", port=ports["YOLOV8"], model={"imgsz": 128}),
        "TESTFAULTS": write_config(servers, "TESTFAULTS", name="TESTFAULTS.toml", port=ports["TESTFAULTS"]),
    }
    write_config(servers, "TESTFAULTS", name="STOPPED.toml", id="STOPPED", port=free_port(),
                 server_uri="/stopped/predict")
    procs = until_all_ready(*(spawn_model_server(c, token="upstream", port=ports[m]) for m, c in configs.items()))
    keys = key_entry("tenant-a", KEY) + key_entry("tenant-slow", SLOW_KEY, qps=1)
    gateway = start_gateway(root, servers, keys, env={"SERVICE_UPSTREAM_TOKEN": "upstream"},
                            gateway_table=f"max_body_bytes = {MAX_BODY}\n")
    yield {"gateway": gateway, "client": triton.InferenceServerClient(f"127.0.0.1:{gateway.port}")}
    gateway.stop()
    for proc in procs:
        proc.stop()


def images_input(*files: bytes, binary: bool = True) -> triton.InferInput:
    tensor = triton.InferInput("IMAGE", [len(files)], "BYTES")
    values = files if binary else [base64.b64encode(f) for f in files]
    tensor.set_data_from_numpy(np.array(values, dtype=np.object_), binary_data=binary)
    return tensor


def contract(stack, model: str, images: list[str], params: dict | None = None) -> dict:
    """The same request on the contract's route."""
    body = {"images": images, **({"params": params} if params else {})}
    reply = post(stack["gateway"].url + f"/v1/models/{model}/infer", body, headers=auth())
    assert reply.status == 200, reply.body
    return reply.json


def status_of(call) -> str:
    with pytest.raises(InferenceServerException) as e:
        call()
    return e.value.status()


# -- health and metadata -------------------------------------------------------------------------------


def test_health_and_metadata(stack):
    client = stack["client"]
    assert client.is_server_live(headers=auth())
    # the protocol's server ready is every model's: STOPPED is not running (all running: the generative stack)
    assert client.is_server_ready(headers=auth()) is False
    reply = get(stack["gateway"].url + "/v2/health/ready", headers=auth())
    assert (reply.status, reply.json) == (503, {"error": "not every model is ready: STOPPED "
                                                         "(GET /v2/models/{id}/ready says why)"})
    assert reply.header("X-Request-ID") and reply.header("Cache-Control") == "no-store"
    server = client.get_server_metadata(headers=auth())
    assert server["name"] == "inference-service" and "binary_tensor_data" in server["extensions"]
    assert client.is_model_ready("MOBILENETV2", headers=auth())
    meta = client.get_model_metadata("MOBILENETV2", headers=auth())
    assert meta["platform"] == "inference-service" and meta["versions"] == ["random-init-seed0"]
    assert meta["inputs"] == [{"name": "IMAGE", "datatype": "BYTES", "shape": [-1, 1]}]
    assert meta["outputs"] == [{"name": "PROBABILITIES", "datatype": "FP32", "shape": [-1, 1000]}]
    yolo = client.get_model_metadata("YOLOV8", model_version="random-init-seed0", headers=auth())
    assert [(o["name"], o["datatype"], o["shape"]) for o in yolo["outputs"]] == [
        ("BOXES", "FP32", [-1, 4]), ("SCORES", "FP32", [-1]), ("CLASSES", "INT32", [-1]), ("ROWS", "INT32", [-1])]
    assert [o["name"] for o in client.get_model_metadata("TESTFAULTS", headers=auth())["outputs"]] == ["DATA"]
    assert status_of(lambda: client.get_model_metadata("MOBILENETV2", model_version="7", headers=auth())) == "404"


def test_model_configuration_in_tritons_shape(stack):
    """tritonclient's get_model_config, what Triton's perf_analyzer reads before its first request: the model
    server's serving (the rows a request may carry, its batching and workers, the mode in use), passed back by the
    gateway; each tensor's dims are its metadata shape without the rows."""
    client = stack["client"]
    assert client.get_model_config("MOBILENETV2", headers=auth()) == {
        "name": "MOBILENETV2", "platform": "inference-service", "backend": "", "max_batch_size": 16,
        "input": [{"name": "IMAGE", "data_type": "TYPE_STRING", "format": "FORMAT_NONE", "dims": [1]}],
        "output": [{"name": "PROBABILITIES", "data_type": "TYPE_FP32", "dims": [1000]}],
        "instance_group": [{"name": "MOBILENETV2", "kind": "KIND_CPU", "count": 3}],
        "dynamic_batching": {"preferred_batch_size": [8], "max_queue_delay_microseconds": 5000},
        "parameters": {"version": {"string_value": "random-init-seed0"}, "optimize": {"string_value": "eager"},
                       "weights": {"string_value": "demo"}, "batch_size": {"string_value": "8"}}}
    meta = client.get_model_metadata("YOLOV8", headers=auth())
    yolo = client.get_model_config("YOLOV8", model_version="random-init-seed0", headers=auth())
    assert [(o["name"], o["data_type"], o["dims"]) for o in yolo["output"]] == [
        ("BOXES", "TYPE_FP32", [4]), ("SCORES", "TYPE_FP32", []), ("CLASSES", "TYPE_INT32", []),
        ("ROWS", "TYPE_INT32", [])]
    for config, metadata in ((yolo["input"], meta["inputs"]), (yolo["output"], meta["outputs"])):
        assert [(t["name"], t["dims"]) for t in config] == [(t["name"], t["shape"][1:]) for t in metadata]
    reply = get(stack["gateway"].url + "/v2/models/TESTFAULTS/config", headers={**auth(), "X-Request-ID": "cfg-1"})
    assert reply.status == 200 and reply.header("X-Request-ID") == "cfg-1"
    assert reply.header("Content-Type") == "application/json" and reply.header("X-Service-Key") == "tenant-a"
    assert reply.json["dynamic_batching"] == {"preferred_batch_size": [4], "max_queue_delay_microseconds": 5000}
    assert status_of(lambda: client.get_model_config("MOBILENETV2", model_version="7", headers=auth())) == "404"
    assert status_of(lambda: client.get_model_config("NOPE", headers=auth())) == "404"
    assert status_of(lambda: client.get_model_config("MOBILENETV2", headers=auth("c" * 64))) == "401"
    assert status_of(lambda: client.get_model_config("STOPPED", headers=auth())) == "503"
    bad = get(stack["gateway"].url + "/v2/models/MOBILENETV2/config", headers={**auth(), "X-Request-ID": "a b"})
    assert (bad.status, set(bad.json)) == (400, {"error"})


#: Triton's perf_analyzer, put beside the suite's interpreter by bin/ensure-perf-analyzer (tox's commands_pre).
PERF_ANALYZER = Path(sys.executable).parent.parent / "perf_analyzer"


def oip_infer_counts(stack) -> dict[str, float]:
    """The gateway's ``service_http_requests_total`` of OIP inference, by status code."""
    text = get(stack["gateway"].url + "/metrics",
               headers={"Authorization": f"Bearer {GATEWAY_TOKENS['SERVICE_METRICS_TOKEN']}"}).body.decode()
    return {m["code"]: float(m["n"]) for m in re.finditer(
        r'^service_http_requests_total\{code="(?P<code>\d+)",method="POST",protocol="oip",route="infer"\} (?P<n>\S+)$',
        text, re.M)}


@pytest.mark.parametrize(("model", "batch"), [("MOBILENETV2", 4), ("YOLOV8", 1)])
def test_tritons_perf_analyzer_measures_a_model_through_the_gateway(stack, tmp_path, model, batch):
    """Triton's own load generator reads the metadata and the configuration, builds its requests from them
    (binary BYTES of shape [batch, 1]) and measures: every request it sends is served 200."""
    image = image_bytes(width=96, height=72, seed=9, fmt="JPEG")
    data = tmp_path / "image.json"  # Triton's serialized BYTES element: a 4-byte length, then the file
    data.write_text(json.dumps({"data": [{"IMAGE": {"b64": base64.b64encode(
        struct.pack("<I", len(image)) + image).decode()}}]}))
    before = oip_infer_counts(stack)
    run = subprocess.run(
        [str(PERF_ANALYZER / "bin" / "perf_analyzer"), "-m", model, "-u", f"127.0.0.1:{stack['gateway'].port}",
         "-i", "http", "-H", f"Authorization: Bearer {KEY}", "--input-data", str(data), "-b", str(batch),
         "--concurrency-range", "2", "--measurement-mode", "count_windows", "--measurement-request-count", "10",
         # any latency spread is stable: on a loaded machine (the suite's other workers) it found none within
         # its 10 windows at its default 10 %, and stability is not what this test is about
         "--stability-percentage", "100000", "-f", str(tmp_path / "result.csv")],
        env={**os.environ, "LD_LIBRARY_PATH": str(PERF_ANALYZER / "lib")}, capture_output=True, text=True,
        timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"Batch size: {batch}" in run.stdout, run.stdout
    [row] = list(csv.DictReader((tmp_path / "result.csv").open()))
    assert row["Concurrency"] == "2" and float(row["Inferences/Second"]) > 0, row
    counted = re.findall(r"Request count: (\d+)", run.stdout)
    after = oip_infer_counts(stack)
    assert {code for code in after if after[code] != before.get(code, 0.0)} == {"200"}  # no request refused
    assert after["200"] - before.get("200", 0.0) >= sum(int(n) for n in counted) >= 10


# -- inference -----------------------------------------------------------------------------------------


def test_binary_tensors_give_the_contract_routes_probabilities(stack):
    files = [image_bytes(seed=1), image_bytes(seed=2, fmt="JPEG")]
    result = stack["client"].infer("MOBILENETV2", [images_input(*files)], request_id="oip-1", headers=auth())
    probabilities = result.as_numpy("PROBABILITIES")
    assert probabilities.dtype == np.float32 and probabilities.shape == (2, 1000)
    assert result.get_response()["id"] == "oip-1" and result.get_response()["model_version"] == "random-init-seed0"
    same = contract(stack, "MOBILENETV2", [base64.b64encode(f).decode() for f in files], {"top_k": 5})
    for row, item in zip(probabilities, same["results"]):
        top = item["data"]
        assert int(row.argmax()) == top["class_id"]
        assert np.allclose(row[top["class_ids"]], top["scores"], rtol=1e-6)
        assert row.sum() == pytest.approx(1.0, abs=1e-3)
    # One row is sent to the model server as a raw body (no base64 on either side): the same probabilities.
    one = stack["client"].infer("MOBILENETV2", [images_input(files[1])], headers=auth()).as_numpy("PROBABILITIES")
    assert one.shape == (1, 1000) and np.allclose(one[0], probabilities[1], atol=1e-6)


def test_json_tensors_and_class_count(stack):
    files = [image_bytes(seed=3)]
    outputs = [triton.InferRequestedOutput("PROBABILITIES", binary_data=False, class_count=3)]
    result = stack["client"].infer("MOBILENETV2", [images_input(*files, binary=False)], outputs=outputs,
                                   headers=auth())
    assert result.get_output("PROBABILITIES")["datatype"] == "BYTES"  # JSON data, not binary
    labels = result.as_numpy("PROBABILITIES")
    assert labels.shape == (1, 3)
    top = contract(stack, "MOBILENETV2", [base64.b64encode(files[0]).decode()], {"top_k": 3})["results"][0]["data"]
    parsed = [label.split(":", 2) for label in labels[0]]  # JSON data: str elements
    assert [int(index) for _, index, _ in parsed] == top["class_ids"]
    assert [name for _, _, name in parsed] == top["categories"]
    assert [float(score) for score, _, _ in parsed] == pytest.approx(top["scores"], abs=1e-6)


def test_yolov8_tensors_per_row(stack):
    files = [image_bytes(seed=4), image_bytes(seed=5)]
    result = stack["client"].infer("YOLOV8", [images_input(*files)], parameters=YOLO_PARAMS, headers=auth())
    boxes, scores = result.as_numpy("BOXES"), result.as_numpy("SCORES")
    classes, rows = result.as_numpy("CLASSES"), result.as_numpy("ROWS")
    same = contract(stack, "YOLOV8", [base64.b64encode(f).decode() for f in files], YOLO_PARAMS)["results"]
    expected = [(r, d) for r, item in enumerate(same) for d in item["data"]]
    assert len(expected) > 0 and boxes.shape == (len(expected), 4) and boxes.dtype == np.float32
    assert classes.dtype == np.int32 and rows.tolist() == [r for r, _ in expected]
    assert classes.tolist() == [d["class_id"] for _, d in expected]
    assert np.allclose(scores, [d["score"] for _, d in expected]) and np.allclose(boxes, [d["bbox"] for _, d in expected])


def test_model_params_travel_in_parameters(stack):
    result = stack["client"].infer("TESTFAULTS", [images_input(image_bytes(), image_bytes(seed=9))],
                                   parameters={"sleep_ms": 1}, headers=auth())
    data = [json.loads(v) for v in result.as_numpy("DATA")]
    assert len(data) == 2 and all(len(d["mean"]) == 3 for d in data)
    assert status_of(lambda: stack["client"].infer("TESTFAULTS", [images_input(image_bytes())],
                                                   parameters={"nope": 1}, headers=auth())) == "400"


def test_a_failed_row_fails_the_request(stack):
    with pytest.raises(InferenceServerException) as e:
        stack["client"].infer("TESTFAULTS", [images_input(image_bytes(), b"not an image")], headers=auth())
    assert e.value.status() == "400" and "row 1 of 2 failed (INVALID_IMAGE)" in e.value.message()
    engine = status_of(lambda: stack["client"].infer("TESTFAULTS", [images_input(image_bytes())],
                                                     parameters={"fail": "engine"}, headers=auth()))
    assert engine == "500"
    assert status_of(lambda: stack["client"].infer("TESTFAULTS", [images_input(b"")], headers=auth())) == "400"


# -- errors ----------------------------------------------------------------------------------------------


def test_unknown_model_is_404(stack):
    client = stack["client"]
    assert status_of(lambda: client.infer("NOPE", [images_input(image_bytes())], headers=auth())) == "404"
    assert status_of(lambda: client.get_model_metadata("NOPE", headers=auth())) == "404"
    reply = get(stack["gateway"].url + "/v2/nowhere", headers=auth())
    assert reply.status == 404 and set(reply.json) == {"error"}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}])
def test_wrong_or_missing_credential_is_401(stack, headers):
    client = stack["client"]
    assert status_of(lambda: client.infer("MOBILENETV2", [images_input(image_bytes())], headers=headers)) == "401"
    assert status_of(lambda: client.get_model_metadata("NOPE", headers=headers)) == "401"  # before routing
    reply = get(stack["gateway"].url + "/v2/health/live", headers=headers)
    assert reply.status == 401 and reply.header("WWW-Authenticate") == 'Bearer realm="gateway"'
    assert set(reply.json) == {"error"}


def test_rate_limited_key_is_429_with_retry_after(stack):
    assert get(stack["gateway"].url + "/v2/models/NOPE", headers=auth(SLOW_KEY)).status == 404  # spends no token
    url = stack["gateway"].url + "/v2"  # the server's metadata: admitted, then answered by the gateway at once
    replies = []
    while len(replies) < 20 and not (replies and replies[-1].status == 429):
        replies.append(get(url, headers=auth(SLOW_KEY)))
    assert {r.status for r in replies[:-1]} <= {200} and replies[-1].status == 429, [r.status for r in replies]
    assert replies[-1].header("Retry-After") == "1" and "rate limit" in replies[-1].json["error"]
    assert replies[-1].header("X-Service-Key") == "tenant-slow"
    client = stack["client"]
    assert status_of(lambda: client.get_server_metadata(headers=auth(SLOW_KEY))) == "429"


def test_stopped_model_is_503(stack):
    client = stack["client"]
    assert client.is_model_ready("STOPPED", headers=auth()) is False
    with pytest.raises(InferenceServerException) as e:
        client.infer("STOPPED", [images_input(image_bytes())], headers=auth())
    assert e.value.status() == "503" and "not running" in e.value.message()


def test_bad_binary_lengths_are_400(stack):
    head = json.dumps({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1],
                                   "parameters": {"binary_data_size": 50}}]}).encode()
    blob = struct.pack("<I", 3) + b"abc"
    reply = post(stack["gateway"].url + "/v2/models/MOBILENETV2/infer", head + blob,
                 headers={**auth(), "Inference-Header-Content-Length": str(len(head))})
    assert reply.status == 400 and "runs past" in reply.json["error"]


def test_two_different_header_lengths_are_400(stack):
    """Which ``Inference-Header-Content-Length`` splits the body was the first one's to say, silently."""
    head = json.dumps({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": [image_b64()]}]})
    body = head.encode()
    port = stack["gateway"].port

    def exchange(*lengths: int | str) -> bytes:
        fields = "".join(f"Inference-Header-Content-Length: {n}\r\n" for n in lengths)
        return raw_exchange(port, (f"POST /v2/models/TESTFAULTS/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                                   f"{KEY}\r\nConnection: close\r\nContent-Length: {len(body)}\r\n{fields}\r\n"
                                   ).encode() + body)

    reply = exchange(len(body), 5)
    assert reply.startswith(b"HTTP/1.1 400 ") and reply.endswith(
        b'{"error":"two different Inference-Header-Content-Length headers"}'), reply
    assert exchange(len(body), len(body)).startswith(b"HTTP/1.1 200 ")  # the same twice says one thing
    # One line with both values is read as the two lines are (an OIP probe: "n, n" was "not an integer").
    assert exchange(f"{len(body)}, {len(body)}").startswith(b"HTTP/1.1 200 ")
    assert exchange(f"{len(body)}, 5").endswith(b'{"error":"two different Inference-Header-Content-Length headers"}')


def test_too_large_is_413(stack):
    client = stack["client"]
    too_many = [image_bytes(width=8, height=8)] * 17  # max_request_items 16: the model server's 413
    with pytest.raises(InferenceServerException) as e:
        client.infer("TESTFAULTS", [images_input(*too_many)], headers=auth())
    assert e.value.status() == "413" and "16" in e.value.message()
    head = json.dumps({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": ["A" * MAX_BODY]}]})
    reply = post(stack["gateway"].url + "/v2/models/TESTFAULTS/infer", head.encode(), headers=auth())
    assert reply.status == 413 and set(reply.json) == {"error"} and "max_body_bytes" in reply.json["error"]


# -- the rest of the request path -------------------------------------------------------------------------


def test_request_ids_cors_and_metrics(stack):
    url = stack["gateway"].url
    body = {"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": [image_b64()]}]}
    reply = post(url + "/v2/models/TESTFAULTS/infer", body,
                 headers={**auth(), "X-Request-ID": "rid-7", "Origin": "http://127.0.0.1:8787"})
    assert reply.status == 200 and reply.header("X-Request-ID") == "rid-7"
    assert reply.header("Access-Control-Allow-Origin") == "http://127.0.0.1:8787"
    assert reply.header("X-Service-Key") == "tenant-a" and reply.header("Cache-Control") == "no-store"
    preflight = request("OPTIONS", url + "/v2/models/TESTFAULTS/infer", headers={
        "Origin": "http://127.0.0.1:8787", "Access-Control-Request-Method": "POST"})
    assert preflight.status == 204 and "POST" in preflight.header("Access-Control-Allow-Methods")
    assert "Inference-Header-Content-Length" in preflight.header("Access-Control-Allow-Headers")
    text = get(url + "/metrics", headers={"Authorization": f"Bearer {GATEWAY_TOKENS['SERVICE_METRICS_TOKEN']}"}).body
    text = text.decode()
    assert re.search(r'^service_http_requests_total\{code="200",method="POST",protocol="oip",route="infer"\} [1-9]',
                     text, re.M)
    assert re.search(r'^service_http_request_duration_ms_count\{protocol="oip",route="infer"\} [1-9]', text, re.M)


@pytest.mark.parametrize("case, body", [
    ("a wrong datatype", {"inputs": [{"name": "IMAGE", "datatype": "FP32", "shape": [1], "data": [1]}]}),
    ("a shape its data does not fill", {"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [2],
                                                    "data": ["aGk="]}]}),
    ("an unknown output", {"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": ["aGk="]}],
                           "outputs": [{"name": "NOPE"}]}),
    ("a bad parameter", {"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": ["aGk="]}],
                         "parameters": {"fail": "x"}}),
])
def test_a_refused_request_carries_its_body_id_as_a_served_one_does(stack, case, body):
    """docs/oip.md: the body's ``id`` is the request id when no header names one. A 400 carried a new id (and
    both access lines logged it): a client correlating by ``id`` lost it on exactly the errors it traces. A
    header still wins, and an invalid one names no id of the client's."""
    url = stack["gateway"].url + "/v2/models/TESTFAULTS/infer"
    reply = post(url, {"id": f"e-{len(case)}", **body}, headers=auth())
    assert (reply.status, reply.header("X-Request-ID")) == (400, f"e-{len(case)}"), (case, reply.body)
    assert set(reply.json) == {"error"}
    reply = post(url, {"id": "e-body", **body}, headers={**auth(), "X-Request-ID": "h-7"})
    assert (reply.status, reply.header("X-Request-ID")) == (400, "h-7")
    reply = post(url, {"id": "e-body", **body}, headers={**auth(), "X-Request-ID": "bad id"})
    assert reply.status == 400 and reply.header("X-Request-ID") not in ("bad id", "e-body")
    assert f"rid=e-{len(case)}" in stack["gateway"].output()


def test_the_gateway_serves_its_committed_openapi_document(tmp_path):
    gateway = start_gateway(tmp_path, SHIPPED_CONF, None)
    try:
        reply = get(gateway.url + "/openapi.json", headers=gateway.auth)
        assert reply.status == 200 and reply.header("Content-Type") == "application/json; charset=utf-8"
        committed = json.loads((REPO / "openapi" / "gateway.json").read_text())
        # As committed, but for the port it names: its own (it named 8080 whatever [gateway] port said).
        assert committed["servers"] == [{"url": "http://127.0.0.1:8080"}] and gateway.port != 8080
        assert reply.json == {**committed, "servers": [{"url": f"http://127.0.0.1:{gateway.port}"}]}
        assert get(gateway.url + "/openapi.json").status == 401
    finally:
        gateway.stop()
