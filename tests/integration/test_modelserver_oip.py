"""A model server answers the Open Inference Protocol itself (svc/modelserver/oip_route.py): straight to its
port with tritonclient and raw HTTP, the outputs, the reply's headers and every error in the protocol's shape."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.support.http import post, request
from tests.support.images import b64, image_bytes
from tests.support.processes import start_model_server, write_config

TOKEN = "upstream"
PATH = "/v2/models/MOBILENETV2/infer"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    config = write_config(tmp_path_factory.mktemp("ms-oip"), "MOBILENETV2")
    proc = start_model_server(config, token=TOKEN)
    yield proc
    proc.stop()


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def binary_body(image: bytes, head: dict | None = None) -> tuple[bytes, dict[str, str]]:
    """One binary BYTES row and a binary classification output, as tritonclient sends them."""
    blob = struct.pack("<I", len(image)) + image
    head = head or {"inputs": [{"name": "IMAGE", "shape": [1], "datatype": "BYTES",
                                "parameters": {"binary_data_size": len(blob)}}],
                    "outputs": [{"name": "PROBABILITIES", "parameters": {"classification": 3, "binary_data": True}}]}
    text = json.dumps(head).encode()
    return text + blob, {**auth(), "Inference-Header-Content-Length": str(len(text))}


def served_version(server) -> str:
    return request("GET", server.url + "/ready").json["model"]["version"]


def test_tritonclient_straight_to_the_model_server_gets_the_contract_routes_classes(server):
    image = image_bytes(width=64, height=48, seed=4)
    client = triton.InferenceServerClient(f"127.0.0.1:{server.port}")
    tensor = triton.InferInput("IMAGE", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([image], dtype=np.object_), binary_data=True)
    result = client.infer("MOBILENETV2", [tensor], outputs=[triton.InferRequestedOutput("PROBABILITIES", class_count=3)],
                          headers=auth())
    got = [s.decode() for s in result.as_numpy("PROBABILITIES").reshape(-1)]
    envelope = post(server.url + "/mobilenetv2/predict", {"images": [b64(image)], "params": {"top_k": 3}},
                    headers=auth()).json
    data = envelope["results"][0]["data"]
    assert got == [f"{s:f}:{c}:{label}" for s, c, label in zip(data["scores"], data["class_ids"], data["categories"])]
    assert result.get_response()["model_version"] == served_version(server)


def test_a_binary_reply_carries_the_protocols_headers(server):
    body, headers = binary_body(image_bytes(width=64, height=48, seed=5))
    for path in (PATH, f"/v2/models/MOBILENETV2/versions/{served_version(server)}/infer"):
        reply = request("POST", server.url + path, body, headers={**headers, "X-Request-ID": "oip-straight-1"})
        assert reply.status == 200, reply.body
        assert reply.header("Content-Type") == "application/octet-stream"
        length = int(reply.header("Inference-Header-Content-Length"))
        head = json.loads(reply.body[:length])
        assert head["model_name"] == "MOBILENETV2" and head["outputs"][0]["shape"] == [1, 3]
        assert reply.header("X-Request-ID") == "oip-straight-1"
        assert reply.header("Cache-Control") == "no-store"
        assert reply.header("X-Service-Weights") == "demo"


@pytest.mark.parametrize(
    ("case", "status", "text"),
    [
        ("no token", 401, "missing or wrong bearer token"),
        ("another model", 404, "'YOLOV8' is not served here"),
        ("another version", 404, "not 'v999'"),
        ("a header that is not JSON", 400, ""),
        ("top_k as a parameter", 400, "top_k is not a parameter here"),
        ("a class count above the model's", 400, "more than the model's 1000 classes"),
        # max_results is refused here (the outputs set it): an unknown option's error offered it
        ("an unknown option (the server's own 422)", 400,
         "invalid request: /options/nope: unknown option 'nope'; accepted: none"),
        # top_k is set from the outputs (a top_k param is refused): an unknown param's error offered it
        ("an unknown parameter", 400, "invalid request: /params/bogus: unknown parameter 'bogus'; accepted: none"),
        ("max_results as an option", 400, "max_results is not an option here"),
        ("an input of another name", 400, "unexpected input 'IMAGES'"),
        ("an output named twice", 400, "output PROBABILITIES is asked for twice"),
        ("a compressed body (the server's own 415)", 400, "unsupported content encoding 'gzip'"),
        ("an image that is not one", 400, "row 0 of 1 failed"),
        ("a body naming another model", 400, "model_name 'YOLOV8' is not the model of the path, MOBILENETV2"),
    ],
)
def test_errors_take_the_protocols_shape(server, case, status, text):
    image = image_bytes(width=32, height=32, seed=6)
    body, headers = binary_body(image)
    path = PATH
    if case == "no token":
        headers = {k: v for k, v in headers.items() if k != "Authorization"}
    elif case == "another model":
        path = "/v2/models/YOLOV8/infer"
    elif case == "another version":
        path = "/v2/models/MOBILENETV2/versions/v999/infer"
    elif case == "a header that is not JSON":
        body, headers = b"{nope" + body, {**auth(), "Inference-Header-Content-Length": "5"}
    elif case == "top_k as a parameter":
        blob = struct.pack("<I", len(image)) + image
        body, headers = binary_body(image, {"inputs": [{"name": "IMAGE", "shape": [1], "datatype": "BYTES",
                                                        "parameters": {"binary_data_size": len(blob)}}],
                                            "parameters": {"top_k": 3}})
    elif case == "a class count above the model's":
        body = json.dumps({"inputs": [{"name": "IMAGE", "shape": [1], "datatype": "BYTES", "data": [b64(image)]}],
                           "outputs": [{"name": "PROBABILITIES", "parameters": {"classification": 2000}}]}).encode()
        headers = auth()
    elif case == "an unknown parameter":
        body = json.dumps({"inputs": [{"name": "IMAGE", "shape": [1], "datatype": "BYTES", "data": [b64(image)]}],
                           "parameters": {"bogus": 1}}).encode()
        headers = auth()
    elif case.startswith("an unknown option") or case == "max_results as an option":
        options = {"nope": 1} if case.startswith("an unknown option") else {"max_results": 2}
        body = json.dumps({"inputs": [{"name": "IMAGE", "shape": [1], "datatype": "BYTES", "data": [b64(image)]}],
                           "parameters": {"options": options}}).encode()
        headers = auth()
    elif case == "an input of another name":
        body = json.dumps({"inputs": [{"name": "IMAGES", "shape": [1], "datatype": "BYTES",
                                       "data": [b64(image)]}]}).encode()
        headers = auth()
    elif case == "an output named twice":
        body = json.dumps({"inputs": [{"name": "IMAGE", "shape": [1], "datatype": "BYTES", "data": [b64(image)]}],
                           "outputs": [{"name": "PROBABILITIES"}, {"name": "PROBABILITIES"}]}).encode()
        headers = auth()
    elif case.startswith("a compressed body"):
        headers = {**headers, "Content-Encoding": "gzip"}
    elif case == "an image that is not one":
        body = json.dumps({"inputs": [{"name": "IMAGE", "shape": [1], "datatype": "BYTES",
                                       "data": [b64(b"not an image")]}]}).encode()
        headers = auth()
    elif case.startswith("a body naming"):
        body = json.dumps({"model_name": "YOLOV8", "model_version": "v999", "inputs": [{"name": "IMAGE", "shape": [1], "datatype": "BYTES",
                                                "data": [b64(image)]}]}).encode()
        headers = auth()
    reply = request("POST", server.url + path, body, headers=headers)
    assert reply.status == status, reply.body
    assert reply.header("Content-Type") == "application/json"  # plain: KServe's client reads the error only so
    error = reply.json
    assert set(error) == {"error"} and text in error["error"]
    if status == 401:
        assert reply.header("WWW-Authenticate") == 'Bearer realm="model-server"'
    # the server still answers
    ok_body, ok_headers = binary_body(image)
    assert request("POST", server.url + PATH, ok_body, headers=ok_headers).status == 200


def test_too_many_rows_is_413_named_by_the_bodys_id(server):
    """An OIP probe: a body ``id`` names the 200 and the 400 (``X-Request-ID``), and the 413 of too many rows had a
    new one (max_request_items 16 here)."""
    image = b64(image_bytes(width=8, height=8, seed=1))
    body = json.dumps({"id": "rows-413", "inputs": [{"name": "IMAGE", "shape": [17], "datatype": "BYTES",
                                                      "data": [image] * 17}]}).encode()
    reply = request("POST", server.url + PATH, body, headers=auth())
    assert reply.status == 413 and set(reply.json) == {"error"} and "at most 16" in reply.json["error"], reply.body
    assert reply.header("X-Request-ID") == "rows-413"


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_a_request_as_kserves_client_writes_it_is_served(server, binary):
    """KServe's client (kserve 0.21, InferRequest.to_rest) writes the model's name (and version) into every
    request, and MLServer's content_type into an input's parameters: each was refused as an unsupported field,
    so no inference of that client ever ran. They are accepted when they agree with the path."""
    image = image_bytes(width=40, height=30, seed=8)
    head = {"model_name": "MOBILENETV2", "model_version": "1", "id": "kserve-1",  # a version in the body: ignored
            "inputs": [{"name": "IMAGE", "shape": [1], "datatype": "BYTES", "parameters": {"content_type": "str"}}],
            "outputs": [{"name": "PROBABILITIES", "parameters": {"classification": 3}}]}
    if binary:
        head["inputs"][0]["parameters"]["binary_data_size"] = len(image) + 4  # the row's length prefix and bytes
        body, headers = binary_body(image, head)
    else:
        head["inputs"][0]["data"] = [b64(image)]
        body, headers = json.dumps(head).encode(), auth()
    reply = request("POST", server.url + PATH, body, headers=headers)
    assert reply.status == 200, reply.body
    assert reply.header("Content-Type") == "application/json"
    assert reply.json["id"] == "kserve-1" and reply.json["model_name"] == "MOBILENETV2"
    assert reply.json["outputs"][0]["shape"] == [1, 3]


def test_the_model_configuration_straight_from_the_model_server(server):
    """The model server states its own serving (the gateway forwards /config to it), with its token."""
    version = served_version(server)
    for path in ("/v2/models/MOBILENETV2/config", f"/v2/models/MOBILENETV2/versions/{version}/config"):
        reply = request("GET", server.url + path, headers={**auth(), "X-Request-ID": "cfg-straight"})
        assert reply.status == 200, reply.body
        assert reply.header("X-Request-ID") == "cfg-straight" and reply.header("Content-Type") == "application/json"
        assert reply.json["max_batch_size"] == 16 and reply.json["instance_group"][0]["count"] == 3
        assert reply.json["parameters"]["version"] == {"string_value": version}
    unauthorized = request("GET", server.url + "/v2/models/MOBILENETV2/config")
    assert unauthorized.status == 401 and unauthorized.header("WWW-Authenticate") == 'Bearer realm="model-server"'
    other = request("GET", server.url + "/v2/models/YOLOV8/config", headers=auth())
    assert other.status == 404 and "not served here" in other.json["error"]
    assert request("POST", server.url + "/v2/models/MOBILENETV2/config", b"{}", headers=auth()).status == 405


def test_the_contract_route_keeps_the_envelope(server):
    reply = post(server.url + "/mobilenetv2/predict", {"images": []}, headers=auth())
    assert reply.status == 422 and "status" in reply.json and "results" in reply.json


def test_tritonclient_sees_a_404_for_another_model(server):
    client = triton.InferenceServerClient(f"127.0.0.1:{server.port}")
    tensor = triton.InferInput("IMAGE", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([image_bytes(width=8, height=8)], dtype=np.object_), binary_data=True)
    with pytest.raises(InferenceServerException) as e:
        client.infer("DDPM", [tensor], headers=auth())
    assert e.value.status() == "404"


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_a_body_above_the_inline_parse_size_is_parsed_off_the_reactor_alike(server, binary):
    """Above 64 KB (INLINE_PARSE_BYTES) the tensors are parsed in the decode pool: the same reply, and a bad
    request there is the same 400 in the protocol's shape."""
    from svc.modelserver.inference import INLINE_PARSE_BYTES

    image = image_bytes(width=160, height=160, seed=8)  # noise PNG, about 77 KB
    assert len(image) > INLINE_PARSE_BYTES
    if binary:
        body, headers = binary_body(image)
    else:
        body = json.dumps({"inputs": [{"name": "IMAGE", "shape": [1], "datatype": "BYTES", "data": [b64(image)]}],
                           "outputs": [{"name": "PROBABILITIES", "parameters": {"classification": 3}}]}).encode()
        headers = auth()
    reply = request("POST", server.url + PATH, body, headers=headers)
    assert reply.status == 200, reply.body
    if binary:
        head = json.loads(reply.body[:int(reply.header("Inference-Header-Content-Length"))])
    else:
        head = reply.json
    assert head["model_name"] == "MOBILENETV2" and head["outputs"][0]["shape"] == [1, 3]
    big = json.dumps({"inputs": [{"name": "IMAGE", "shape": [2], "datatype": "BYTES", "data": [b64(image)]}]})
    bad = request("POST", server.url + PATH, big.encode(), headers=auth())  # shape [2] with one element
    assert bad.status == 400 and set(bad.json) == {"error"} and "elements of data for shape [2]" in bad.json["error"], bad.body
