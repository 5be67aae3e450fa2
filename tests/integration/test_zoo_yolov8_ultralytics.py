"""YOLOV8 from an ultralytics-style ``.pt`` without ultralytics: a fake
checkpoint with the upstream YOLOv8n tensors (random values, half precision,
pickled as ultralytics pickles its model objects) is converted by the
factory's ``convert`` in a fresh process, served by a real model server, and
the served detections equal our module loaded with the same tensors in
float32.  Pickles that name code are refused with one line and run nothing."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from models.yolov8 import VARIANTS, yolov8
from models.yolov8_net import build_network
from svc.model.api import model_config
from svc.model.weights import WeightsError, load_into
from svc.weightstore.catalog import find_variant
from tests.integration.test_zoo_yolov8 import IMGSZ, assert_same_detections, direct, seeded_network
from tests.support.fake_ultralytics import save_checkpoint, tripwire_of, upstream_names_and_shapes
from tests.support.images import b64, image_bytes
from tests.support.processes import REPO, child_env, start_model_server, write_config
from tests.support.zoo import assert_ok, infer

URI = "/yolov8/predict"


def as_saved(net: torch.nn.Module) -> dict:
    """The tensors of ``net`` as an ultralytics checkpoint holds them (half), back in float32."""
    return {k: v.detach().clone().half().float() if v.is_floating_point() else v.detach().clone()
            for k, v in net.state_dict().items()}


def reference(state: dict) -> torch.nn.Module:
    net = build_network("n")
    load_into(net, state, "reference")
    return net.eval()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(path of the fake yolov8n.pt, the float32 tensors it holds)."""
    net = seeded_network(11)
    assert [(k, tuple(v.shape)) for k, v in net.state_dict().items()] == upstream_names_and_shapes("n")
    state = as_saved(net)
    path = tmp_path_factory.mktemp("ultralytics") / "yolov8n.pt"
    save_checkpoint(path, net)
    assert "ultralytics" not in sys.modules
    return path, state


@pytest.fixture(scope="module")
def converted(checkpoint, tmp_path_factory):
    """The factory's convert run in a fresh process, where no ultralytics (fake or real) exists."""
    src, _ = checkpoint
    dst = tmp_path_factory.mktemp("converted")
    code = (
        "import sys; from models.yolov8 import yolov8; "
        f"print(yolov8.convert('ultralytics', {str(src)!r}, {str(dst)!r})); "
        "assert not any(m.split('.')[0] == 'ultralytics' for m in sys.modules), 'ultralytics imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], env=child_env(), cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "yolov8n.safetensors"
    assert not tripwire_of(src).exists()  # no code of the pickled classes ran
    return dst / "yolov8n.safetensors"


@pytest.fixture(scope="module")
def yolo(converted, tmp_path_factory):
    config = write_config(tmp_path_factory.mktemp("yolo-conf"), "YOLOV8", max_queue_depth=0,
                          model={"weights": str(converted), "scale": "n", "imgsz": IMGSZ})
    server = start_model_server(config)
    yield server
    server.stop()


def test_the_converted_file_holds_the_checkpoints_tensors_in_float32(checkpoint, converted):
    _, state = checkpoint
    got = load_file(str(converted))
    assert sorted(got) == sorted(name for name, _ in upstream_names_and_shapes("n"))
    for name, tensor in state.items():
        assert got[name].dtype == (torch.float32 if tensor.is_floating_point() else tensor.dtype), name
        assert torch.equal(got[name], tensor), name


@pytest.mark.parametrize("size", [(320, 240), (200, 400)])
def test_served_detections_equal_the_same_tensors_in_our_module(yolo, checkpoint, size):
    _, state = checkpoint
    raw = image_bytes(width=size[0], height=size[1], seed=sum(size))
    params = {"score_threshold": 0.3, "nms_threshold": 0.5, "top_k": 25}
    reply = infer(yolo, URI, {"images": [b64(raw)], "params": params})
    assert reply.json["model"]["version"].startswith("yolov8n.safetensors@")
    assert_same_detections(assert_ok(reply)[0], direct(reference(state), raw, 0.3, 0.5, 25))


def test_ema_is_taken_when_model_is_none(tmp_path):
    torch.manual_seed(5)
    net = build_network("n")  # random init: only the tensors' way through matters here
    state = as_saved(net)
    src = tmp_path / "yolov8n-ema.pt"
    save_checkpoint(src, net, key="ema")
    assert yolov8.convert("ultralytics", str(src), str(tmp_path)) == "yolov8n.safetensors"
    got = load_file(str(tmp_path / "yolov8n.safetensors"))
    assert all(torch.equal(got[name], tensor) for name, tensor in state.items())
    assert not tripwire_of(src).exists()


def test_a_checkpoint_without_a_network_is_one_line(tmp_path):
    src = tmp_path / "empty.pt"
    torch.save({"model": None, "ema": None, "epoch": -1}, src)
    with pytest.raises(WeightsError) as error:
        yolov8.convert("ultralytics", str(src), str(tmp_path))
    assert str(error.value) == f"weights file {src}: neither 'model' nor 'ema' of the checkpoint holds a network"


def test_a_network_of_another_scale_than_its_name_is_refused(tmp_path):
    src = tmp_path / "yolov8n.pt"
    save_checkpoint(src, build_network("s"), "s")
    with pytest.raises(WeightsError) as error:
        yolov8.convert("ultralytics", str(src), str(tmp_path))
    assert str(error.value) == f"weights file {src}: holds a YOLOv8s network, the file name says yolov8n"
    assert not (tmp_path / "yolov8s.safetensors").exists()


@pytest.mark.parametrize("where", ["archive", "raw"])
def test_a_checkpoint_that_runs_a_command_is_refused_and_nothing_runs(tmp_path, where):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    src = tmp_path / "yolov8n.pt"
    checkpoint = {"model": None, "ema": None, "train_args": Payload()}
    if where == "archive":
        torch.save(checkpoint, src)
    else:
        src.write_bytes(pickle.dumps(checkpoint, protocol=2))
    with pytest.raises(WeightsError) as error:
        yolov8.convert("ultralytics", str(src), str(tmp_path))
    assert str(error.value) == (f"weights file {src}: cannot be read as an ultralytics checkpoint: refused global "
                                "posix.system: not on the allow-list, so it was not imported or called")
    assert not marker.exists()
    assert os.listdir(tmp_path) == ["yolov8n.pt"]


def test_a_web_page_or_a_plain_state_dict_is_refused_with_what_it_is(tmp_path):
    page = tmp_path / "yolov8x.pt"  # what a proxy's error page saved under the release name looks like
    page.write_bytes(b"<!DOCTYPE html><html><body>404 Not Found</body></html>")
    with pytest.raises(WeightsError) as error:
        yolov8.convert("ultralytics", str(page), str(tmp_path))
    assert str(error.value) == (f"weights file {page}: cannot be read as an ultralytics checkpoint: not a pickle (a "
                                "web page or another file saved under this name?)")
    plain = tmp_path / "best.pt"
    torch.save(build_network("n").state_dict(), plain)
    with pytest.raises(WeightsError) as error:
        yolov8.convert("ultralytics", str(plain), str(tmp_path))
    assert str(error.value).endswith("; this is a plain state dict, which needs no conversion: name it in [model] "
                                     "weights (svcctl weights import takes the official yolov8*.pt)")
    assert sorted(os.listdir(tmp_path)) == ["best.pt", "yolov8x.pt"]


def test_an_unknown_converter_is_refused(tmp_path):
    with pytest.raises(WeightsError, match="^YOLOV8 has no converter 'onnx'; known: ultralytics$"):
        yolov8.convert("onnx", str(tmp_path / "x.pt"), str(tmp_path))


def test_the_variants_are_the_official_release_files(tmp_path):
    assert [v.name for v in VARIANTS] == ["yolov8n", "yolov8s", "yolov8m", "yolov8l", "yolov8x"]
    assert find_variant(yolov8, None).name == "yolov8n"
    for variant, scale in zip(VARIANTS, "nsmlx"):
        assert variant.source.url == f"https://github.com/ultralytics/assets/releases/download/v8.1.0/yolov8{scale}.pt"
        assert variant.source.convert == "ultralytics"
        assert (variant.source.sha256, variant.source.hash_prefix) == (None, None)  # recorded at the first pull
        assert variant.license == "AGPL-3.0" and "AGPL-3.0" in variant.description
        assert dict(variant.model) == {"scale": scale}
        config = model_config(yolov8, dict(variant.model), str(tmp_path / "YOLOV8.toml"))
        assert config["scale"] == scale


def test_pulled_official_file_is_converted_and_served_as_pretrained(yolo, checkpoint, tmp_path):
    """The documented path end to end: `svcctl weights pull YOLOV8` fetches the release file (here from a fake
    source under its official URL, through SERVICE_WEIGHTS_MIRROR), converts it without ultralytics, records it,
    `weights verify` agrees, and a model server with `weights = "pretrained"` serves it as version `yolov8n` with
    the same detections as the converted file served directly."""
    from tests.support.weight_source import FakeSource

    src, _ = checkpoint
    cache = tmp_path / "cache"
    source = FakeSource()
    try:
        source.serve("https://github.com/ultralytics/assets/releases/download/v8.1.0/yolov8n.pt", src.read_bytes())
        env = child_env({"SERVICE_WEIGHTS_DIR": str(cache), "SERVICE_WEIGHTS_MIRROR": source.mirror})
        refused = subprocess.run([sys.executable, "-m", "svc.cli", "weights", "pull", "YOLOV8"], env=env, cwd=REPO,
                                 capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        pull = subprocess.run([sys.executable, "-m", "svc.cli", "weights", "pull", "YOLOV8", "--accept-licence",
                               "AGPL-3.0"], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    finally:
        source.close()
    # AGPL-3.0 is pulled only once accepted: without --accept-licence (and no terminal to ask) nothing is fetched.
    assert refused.returncode == 1 and refused.stderr.splitlines()[-1] == (
        "svcctl: YOLOV8 yolov8n: licence AGPL-3.0 not accepted, nothing pulled: pass --accept-licence AGPL-3.0 "
        "to pull it"), refused.stderr
    assert "licences: AGPL-3.0" in refused.stderr.splitlines()[0]
    assert pull.returncode == 0, pull.stderr
    assert not tripwire_of(src).exists()
    record = json.loads((cache / "YOLOV8" / "yolov8n" / "record.json").read_text())
    assert (record["model"], record["variant"], record["weights"], record["how"]) == (
        "YOLOV8", "yolov8n", "yolov8n.safetensors", "pull")
    assert record["source"] == "https://github.com/ultralytics/assets/releases/download/v8.1.0/yolov8n.pt"
    verify = subprocess.run([sys.executable, "-m", "svc.cli", "weights", "verify"], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0 and "YOLOV8 yolov8n: ok" in verify.stdout, verify.stdout + verify.stderr

    config = write_config(tmp_path, "YOLOV8", max_queue_depth=0, model={"weights": "pretrained", "imgsz": IMGSZ})
    server = start_model_server(config, env={"SERVICE_WEIGHTS_DIR": str(cache)})
    try:
        raw = image_bytes(width=320, height=240, seed=5)
        params = {"score_threshold": 0.3, "nms_threshold": 0.5, "top_k": 25}
        pretrained = infer(server, URI, {"images": [b64(raw)], "params": params})
        direct_file = infer(yolo, URI, {"images": [b64(raw)], "params": params})
    finally:
        server.stop()
    assert pretrained.json["model"]["version"] == "yolov8n"
    assert assert_ok(pretrained)[0] == assert_ok(direct_file)[0]
