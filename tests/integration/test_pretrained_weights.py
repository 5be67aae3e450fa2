"""``weights = "pretrained:IMAGENET1K_V2"``: a real model server on a pulled file, and one without it.

The file is pulled with ``svcctl weights`` from a fake source on loopback
(``SERVICE_WEIGHTS_MIRROR``); the catalog's ``IMAGENET1K_V2`` entry is
monkeypatched (in this process only) to a URL of the official shape whose
hash prefix matches the test's own state dict.  The model server runs with
the real catalog: it reads the cache only.
"""

from __future__ import annotations

import hashlib
import io

import pytest
import torch
from PIL import Image
from torchvision.models import MobileNet_V2_Weights, mobilenet_v2

from models.mobilenetv2 import MobileNetV2Factory
from svc.cli import commands as cli
from svc.model.weights import calibrate_batchnorm
from svc.weightstore.catalog import FileSource, Variant
from tests.support.http import post
from tests.support.images import b64, image_bytes
from tests.support.processes import (
    child_env,
    model_server_args,
    run_to_exit,
    start_model_server,
    write_config,
)
from tests.support.weight_source import FakeSource


def test_served_pretrained_variant_equals_torchvision_with_the_v2_preset(tmp_path, monkeypatch, capsys):
    torch.manual_seed(11)
    net = mobilenet_v2(weights=None)
    calibrate_batchnorm(net, (4, 3, 224, 224), 11)  # input-dependent outputs
    net.eval()
    buf = io.BytesIO()
    torch.save(net.state_dict(), buf)
    body = buf.getvalue()
    url = f"https://download.pytorch.org/models/mobilenet_v2-{hashlib.sha256(body).hexdigest()[:8]}.pth"
    cache = tmp_path / "cache"
    source = FakeSource()
    try:
        source.serve(url, body)
        monkeypatch.setenv("SERVICE_WEIGHTS_DIR", str(cache))
        monkeypatch.setenv("SERVICE_WEIGHTS_MIRROR", source.mirror)
        variant = Variant("IMAGENET1K_V2", FileSource(url=url, hash_prefix=url[-12:-4]), license="BSD-3-Clause",
                          model={"resize": 232}, default=True)
        monkeypatch.setattr(MobileNetV2Factory, "variants", (variant,))
        assert cli.main(["weights", "pull", "MOBILENETV2"]) == 0, capsys.readouterr().err
    finally:
        source.close()

    config = write_config(tmp_path, "MOBILENETV2", model={"weights": "pretrained:IMAGENET1K_V2"})
    server = start_model_server(config, env={"SERVICE_WEIGHTS_DIR": str(cache)})
    try:
        raw = [image_bytes(width=300, height=200, seed=s) for s in (1, 2)]
        reply = post(server.url + "/mobilenetv2/predict", {"images": [b64(r) for r in raw], "params": {"top_k": 10}},
                     headers=server.auth)
        assert reply.status == 200, reply.body
        assert reply.json["model"]["version"] == "IMAGENET1K_V2"
        assert reply.header("X-Service-Weights") == "pretrained"
        transform = MobileNet_V2_Weights.IMAGENET1K_V2.transforms()
        assert transform.resize_size == [232]
        reference = mobilenet_v2(weights=None)
        reference.load_state_dict(torch.load(io.BytesIO(body), weights_only=True))
        reference.eval()
        batch = torch.stack([transform(Image.open(io.BytesIO(r)).convert("RGB")) for r in raw])
        with torch.inference_mode():
            probabilities = torch.softmax(reference(batch), dim=1)
        for item, expected in zip(reply.json["results"], probabilities):
            scores, ids = expected.topk(10)
            assert item["data"]["class_ids"] == ids.tolist()
            assert item["data"]["scores"] == pytest.approx(scores.tolist(), rel=1e-4, abs=1e-7)
    finally:
        server.stop()


@pytest.mark.parametrize("choice, named", [("pretrained", "pretrained"), ("pretrained:NOPE", None)])
def test_weights_chosen_by_the_option_are_named_by_it_not_by_the_config_file(tmp_path, choice, named):
    """A docs probe: under ``--weights pretrained`` (the supervisor passes the profile's choice on) a variant missing
    from the cache was said to come "from conf/server/DDIM.toml", a file that said ``random``."""
    config = write_config(tmp_path, "MOBILENETV2")  # weights = "random"
    cache = tmp_path / "empty-cache"
    code, output = run_to_exit(model_server_args(config, 0, "--weights", choice),
                               env=child_env({"SERVICE_AUTH_TOKEN": "t", "SERVICE_WEIGHTS_DIR": str(cache)}))
    assert code == 1, output
    lines = [line for line in output.splitlines() if line.strip()]
    if named:
        assert lines == [
            f"service-model: weights 'pretrained' (from --weights {choice}): {cache}/MOBILENETV2/IMAGENET1K_V2/"
            "mobilenet_v2-7ebf99e0.pth is missing: MOBILENETV2 variant IMAGENET1K_V2 is not in the weights cache; "
            "run `svcctl weights pull MOBILENETV2` first"]
    else:
        assert len(lines) == 1 and lines[0].startswith("service-model: --weights pretrained:NOPE: ") and str(config) \
            not in lines[0], lines


def test_a_variant_missing_from_the_cache_stops_the_server_with_one_line(tmp_path):
    config = write_config(tmp_path, "MOBILENETV2", model={"weights": "pretrained"})
    cache = tmp_path / "empty-cache"
    code, output = run_to_exit(model_server_args(config, 0),
                               env=child_env({"SERVICE_AUTH_TOKEN": "t", "SERVICE_WEIGHTS_DIR": str(cache)}))
    assert code == 1, output
    assert [line for line in output.splitlines() if line.strip()] == [
        f"service-model: weights 'pretrained' (from {config}): {cache}/MOBILENETV2/IMAGENET1K_V2/"
        "mobilenet_v2-7ebf99e0.pth is missing: MOBILENETV2 variant IMAGENET1K_V2 is not in the weights cache; "
        "run `svcctl weights pull MOBILENETV2` first"]
