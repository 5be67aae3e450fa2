"""Real weights files: the served answer equals a direct torch forward pass."""

from __future__ import annotations

import pytest
import torch
from PIL import Image
from torchvision.models import MobileNet_V2_Weights, mobilenet_v2

from svc.model.weights import calibrate_batchnorm
from tests.support.http import post
from tests.support.images import b64, image_bytes
from tests.support.processes import start_model_server, write_config


def seeded_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    net = mobilenet_v2(weights=None)
    calibrate_batchnorm(net, (4, 3, 224, 224), seed)  # input-dependent outputs
    return net.eval()


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_served_classes_and_scores_equal_a_direct_forward_pass(tmp_path, suffix):
    net = seeded_model(7)
    path = tmp_path / f"mobilenet{suffix}"
    if suffix == ".pth":
        torch.save(net.state_dict(), path)
    else:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path))
    server = start_model_server(write_config(tmp_path, "MOBILENETV2", model={"weights": str(path)}))
    try:
        raw = [image_bytes(width=300, height=200, seed=s) for s in (1, 2)]
        reply = post(server.url + "/mobilenetv2/predict", {"images": [b64(r) for r in raw], "params": {"top_k": 10}},
                     headers=server.auth)
        assert reply.status == 200, reply.body
        body = reply.json
        assert body["model"]["version"].startswith(f"mobilenet{suffix}@")
        assert reply.header("X-Service-Weights") == "file"
        transform = MobileNet_V2_Weights.IMAGENET1K_V1.transforms()
        import io

        batch = torch.stack([transform(Image.open(io.BytesIO(r)).convert("RGB")) for r in raw])
        with torch.inference_mode():
            probabilities = torch.softmax(net(batch), dim=1)
        for item, expected in zip(body["results"], probabilities):
            scores, ids = expected.topk(10)
            assert item["data"]["class_ids"] == ids.tolist()
            assert item["data"]["class_id"] == ids[0].item()
            assert item["data"]["scores"] == pytest.approx(scores.tolist(), rel=1e-4, abs=1e-7)
    finally:
        server.stop()


def test_an_upstream_pt_in_a_config_is_one_line_saying_to_import_it(tmp_path):
    """An ultralytics .pt (a pickled model object) put straight into [model] weights: the server stops with one
    line naming the file and `svcctl weights import YOLOV8 FILE`, not PyTorch's advice about weights_only."""
    from models.yolov8_net import build_network
    from tests.support.fake_ultralytics import save_checkpoint
    from tests.support.processes import child_env, model_server_args, run_to_exit

    src = tmp_path / "yolov8n.pt"
    save_checkpoint(src, build_network("n"))
    config = write_config(tmp_path, "YOLOV8", model={"weights": str(src)})
    code, output = run_to_exit(model_server_args(config, 0), env=child_env({"SERVICE_AUTH_TOKEN": "t"}))
    assert code == 1, output
    critical = [line.split("] ", 1)[1] for line in output.splitlines() if "#critical]" in line]
    assert critical == [f"service-model: weights '{src}' (from {config}): weights file {src}: a pickled model "
                        "object (ultralytics.nn.tasks.DetectionModel), not a state dict: save the model's "
                        "state_dict() with torch.save or as safetensors; an upstream checkpoint that the import "
                        "converts (an ultralytics .pt for YOLOV8) goes into the weights cache with `svcctl weights "
                        f'import YOLOV8 {src}`, then weights = "pretrained"'], output
    assert "weights_only" not in output
