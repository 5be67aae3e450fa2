"""The Open Inference Protocol for the models whose outputs are not numbers: SAM_AMG's masks and a diffusion
model's images, through a real gateway and real model servers with tritonclient's HTTP client.

The smallest configurations the other tests use (``tests/browser/test_ui.py``): SAM_AMG's tiny
architecture with 4x4 point prompts and the thresholds under which its demo weights give masks, and a
16x16 DDPM with a 50-step schedule asked for 2 steps.  Each answer is checked against the same request on
the contract's route (``/v1/models/{id}/infer``), whose envelope the OIP outputs are translated from.
"""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
import tritonclient.http as triton
from PIL import Image

from tests.integration.test_gateway_oip import auth, contract, images_input
from tests.support.gateway import start_gateway
from tests.support.http import get, post
from tests.support.images import image_bytes
from tests.support.processes import free_port, spawn_model_server, until_all_ready, write_config
from tests.support.stack import key_entry

KEY = "a" * 64
#: SAM_AMG params under which the demo weights give masks (the defaults filter every one out).
SAM_PARAMS = {"pred_iou_thresh": 0, "stability_score_thresh": 0, "box_nms_thresh": 1}
DDPM_SIZE = 16
DDPM_PARAMS = {"timesteps": 2, "seed": 7}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """SAM_AMG and DDPM behind one gateway."""
    root = tmp_path_factory.mktemp("oip-generative")
    servers = root / "server"
    servers.mkdir()
    ports = {m: free_port() for m in ("SAM_AMG", "DDPM")}
    configs = {
        "SAM_AMG": write_config(servers, "SAM_AMG", name="SAM_AMG.toml", port=ports["SAM_AMG"],
                                model={"points_per_side": 4}),
        "DDPM": write_config(servers, "DDPM", name="DDPM.toml", port=ports["DDPM"], model={
            "sample_size": DDPM_SIZE, "block_out_channels": [16, 32], "num_train_timesteps": 50, "attention": False}),
    }
    procs = until_all_ready(*(spawn_model_server(c, token="upstream", port=ports[m]) for m, c in configs.items()))
    gateway = start_gateway(root, servers, key_entry("tenant-a", KEY), env={"SERVICE_UPSTREAM_TOKEN": "upstream"})
    yield {"gateway": gateway, "client": triton.InferenceServerClient(f"127.0.0.1:{gateway.port}")}
    gateway.stop()
    for proc in procs:
        proc.stop()


def test_the_server_is_ready_when_every_model_is(stack):
    """The protocol's server ready: all the models are ready for inferencing (here both are; the other stack has
    a stopped one, tests/integration/test_gateway_oip.py)."""
    client = stack["client"]
    assert client.is_server_ready(headers=auth()) is True
    reply = get(stack["gateway"].url + "/v2/health/ready", headers=auth())
    assert (reply.status, reply.json) == (200, {"ready": True})


def test_sam_amg_metadata_and_rle_masks_as_bytes(stack):
    client = stack["client"]
    meta = client.get_model_metadata("SAM_AMG", headers=auth())
    assert [(o["name"], o["datatype"], o["shape"]) for o in meta["outputs"]] == [
        ("MASKS", "BYTES", [-1]), ("ROWS", "INT32", [-1])]
    files = [image_bytes(width=64, height=48, seed=21), image_bytes(width=40, height=56, seed=22, fmt="JPEG")]
    result = client.infer("SAM_AMG", [images_input(*files)], parameters=SAM_PARAMS, headers=auth())
    assert [(o["name"], o["datatype"]) for o in result.get_response()["outputs"]] == [
        ("MASKS", "BYTES"), ("ROWS", "INT32")]
    masks, rows = result.as_numpy("MASKS"), result.as_numpy("ROWS")
    expected = [(r, m) for r, item in enumerate(rle_results(stack, files)) for m in item["data"]]
    assert len(expected) > 0 and masks.shape == (len(expected),) and rows.shape == (len(expected),)
    assert rows.dtype == np.int32 and rows.tolist() == [r for r, _ in expected]
    assert {r for r, _ in expected} == {0, 1}  # masks of both images, each row naming its image
    decoded = [json.loads(m) for m in masks]
    assert decoded == [m["segmentation"] for _, m in expected]
    for (r, _), rle in zip(expected, decoded):
        assert set(rle) == {"size", "counts"}
        assert rle["size"] == ([48, 64] if r == 0 else [56, 40])  # COCO's [height, width]


def rle_results(stack, files: list[bytes]) -> list[dict]:
    """The contract route's results for ``files`` with masks as COCO RLE (what OIP's MASKS carry)."""
    body = {"images": [base64.b64encode(f).decode() for f in files], "params": SAM_PARAMS,
            "options": {"mask_format": "rle"}}
    reply = post(stack["gateway"].url + "/v1/models/SAM_AMG/infer", body, headers=auth())
    assert reply.status == 200 and reply.json["status"] == 0, reply.body[:300]
    return reply.json["results"]


def test_ddpm_returns_generated_png_bytes_of_its_sample_size(stack):
    client = stack["client"]
    meta = client.get_model_metadata("DDPM", headers=auth())
    assert [(o["name"], o["datatype"], o["shape"]) for o in meta["outputs"]] == [("GENERATED", "BYTES", [-1])]
    ignored = [image_bytes(width=8, height=8, seed=1), image_bytes(width=8, height=8, seed=2)]
    result = client.infer("DDPM", [images_input(*ignored)], parameters=DDPM_PARAMS, headers=auth())
    out = result.get_output("GENERATED")
    assert (out["datatype"], out["shape"]) == ("BYTES", [2])
    generated = result.as_numpy("GENERATED")
    assert generated.shape == (2,)
    same = contract(stack, "DDPM", [base64.b64encode(f).decode() for f in ignored], DDPM_PARAMS)["results"]
    for png, item in zip(generated, same):
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        image = Image.open(io.BytesIO(png))
        assert (image.format, image.size, image.mode) == ("PNG", (DDPM_SIZE, DDPM_SIZE), "RGB")
        reference = Image.open(io.BytesIO(base64.b64decode(item["data"]["image"])))
        assert np.array_equal(np.asarray(image), np.asarray(reference))  # the seed: the contract's very image
