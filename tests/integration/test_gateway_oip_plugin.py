"""The Open Inference Protocol's outputs of a third party's classifier follow from its declarations (docs/oip.md).

``TESTCLASSES`` (tests/plugins/models/testplugin.py) has four classes; its
``top_k`` maximum is its ``[model] max_top_k``.  The plain ``PROBABILITIES``
tensor sets ``top_k`` to the class count, so it is the model's output only
when ``top_k`` can reach it; otherwise the model has ``DATA``, as any other.
Before, a classifier of 10 classes whose ``top_k`` stopped at 7 had
``PROBABILITIES`` in its metadata and answered every plain request ``400
/params/top_k: 10 is greater than the maximum of 7``.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import tritonclient.http as triton

from tests.integration.test_gateway_oip import KEY, auth, contract, images_input, status_of
from tests.support.gateway import start_gateway
from tests.support.http import post
from tests.support.images import image_bytes
from tests.support.processes import free_port, start_model_server, write_config
from tests.support.stack import key_entry

FILES = [image_bytes(width=32, height=24, seed=31), image_bytes(width=24, height=32, seed=32)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """TESTCLASSES with ``top_k`` up to 3 of its 4 classes, behind a gateway."""
    root = tmp_path_factory.mktemp("oip-plugin")
    servers = root / "server"
    servers.mkdir()
    port = free_port()
    config = write_config(servers, "TESTCLASSES", name="TESTCLASSES.toml", port=port, model={"max_top_k": 3})
    server = start_model_server(config, token="upstream", port=port)
    gateway = start_gateway(root, servers, key_entry("tenant-a", KEY), env={"SERVICE_UPSTREAM_TOKEN": "upstream"})
    yield {"gateway": gateway, "client": triton.InferenceServerClient(f"127.0.0.1:{gateway.port}")}
    gateway.stop()
    server.stop()


def test_a_classifier_whose_top_k_stops_short_of_its_classes_has_data_in_metadata_and_infer(stack):
    client = stack["client"]
    meta = client.get_model_metadata("TESTCLASSES", headers=auth())
    assert meta["outputs"] == [{"name": "DATA", "datatype": "BYTES", "shape": [-1]}]
    result = client.infer("TESTCLASSES", [images_input(*FILES)], headers=auth())  # no params: was a 400
    rows = [json.loads(row) for row in result.as_numpy("DATA")]
    same = contract(stack, "TESTCLASSES", [base64.b64encode(f).decode() for f in FILES])["results"]
    assert rows == [item["data"] for item in same] and len(rows[0]["class_ids"]) == 1  # top_k's default
    two = client.infer("TESTCLASSES", [images_input(*FILES)], parameters={"top_k": 3}, headers=auth())
    assert [len(json.loads(row)["class_ids"]) for row in two.as_numpy("DATA")] == [3, 3]


def test_the_classification_extension_and_a_top_k_past_the_maximum_are_400_naming_why(stack):
    client = stack["client"]
    asked = [triton.InferRequestedOutput("DATA", class_count=2)]
    assert status_of(lambda: client.infer("TESTCLASSES", [images_input(FILES[0])], outputs=asked,
                                          headers=auth())) == "400"
    reply = post(stack["gateway"].url + "/v2/models/TESTCLASSES/infer", {
        "inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": [base64.b64encode(FILES[0]).decode()]}],
        "outputs": [{"name": "DATA", "parameters": {"classification": 2}}]}, headers=auth())
    assert (reply.status, reply.json) == (400, {"error": "output DATA does not support the classification extension"})
    reply = post(stack["gateway"].url + "/v2/models/TESTCLASSES/infer", {
        "inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": [base64.b64encode(FILES[0]).decode()]}],
        "parameters": {"top_k": 4}}, headers=auth())
    assert reply.status == 400 and "/params/top_k: 4 is greater than the maximum of 3" in reply.json["error"]


def test_the_metadata_follows_a_model_restarted_with_another_config(tmp_path):
    """The gateway read a model's outputs once: after its model server restarted with ``max_top_k`` raised to
    the class count, the metadata still named ``DATA`` and an infer asking for it was 400 (an OIP probe)."""
    servers = tmp_path / "server"
    servers.mkdir()
    port = free_port()
    server = start_model_server(write_config(servers, "TESTCLASSES", name="TESTCLASSES.toml", port=port,
                                             model={"max_top_k": 3}), token="upstream", port=port)
    gateway = start_gateway(tmp_path, servers, key_entry("tenant-a", KEY), env={"SERVICE_UPSTREAM_TOKEN": "upstream"})
    try:
        client = triton.InferenceServerClient(f"127.0.0.1:{gateway.port}")
        assert client.get_model_metadata("TESTCLASSES", headers=auth())["outputs"] == [
            {"name": "DATA", "datatype": "BYTES", "shape": [-1]}]
        server.stop()
        server = start_model_server(write_config(servers, "TESTCLASSES", name="TESTCLASSES.toml", port=port,
                                                 model={"max_top_k": 4}), token="upstream", port=port)
        assert client.get_model_metadata("TESTCLASSES", headers=auth())["outputs"] == [
            {"name": "PROBABILITIES", "datatype": "FP32", "shape": [-1, 4]}]
        asked = [triton.InferRequestedOutput("PROBABILITIES")]
        result = client.infer("TESTCLASSES", [images_input(*FILES)], outputs=asked, headers=auth())
        assert result.as_numpy("PROBABILITIES").shape == (2, 4)
    finally:
        gateway.stop()
        server.stop()


def test_a_classifier_whose_top_k_reaches_every_class_has_probabilities(tmp_path):
    """The same plugin with ``top_k`` up to its 4 classes, straight to its model server (which answers the
    protocol itself): the plain tensor of every class, and ``classification: k`` up to the class count."""
    server = start_model_server(write_config(tmp_path, "TESTCLASSES"), token="upstream")
    try:
        client = triton.InferenceServerClient(f"127.0.0.1:{server.port}")
        headers = {"Authorization": "Bearer upstream"}
        plain = client.infer("TESTCLASSES", [images_input(*FILES)], headers=dict(headers))
        probabilities = plain.as_numpy("PROBABILITIES")
        assert probabilities.shape == (2, 4) and np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
        labels = client.infer("TESTCLASSES", [images_input(FILES[0])], headers=dict(headers),
                              outputs=[triton.InferRequestedOutput("PROBABILITIES", class_count=4)])
        assert labels.as_numpy("PROBABILITIES").shape == (1, 4)
        five = [triton.InferRequestedOutput("PROBABILITIES", class_count=5)]
        assert status_of(lambda: client.infer("TESTCLASSES", [images_input(FILES[0])], outputs=five,
                                              headers=dict(headers))) == "400"
    finally:
        server.stop()
