"""A pull is load-checked before it is recorded, as an import is: weights that do not fit are refused.

The fake sources of the other weights tests: :class:`FakeSource` behind
``SERVICE_WEIGHTS_MIRROR`` for a file variant, :class:`FakeHub` behind
``HF_ENDPOINT`` for a hub snapshot.  A refused pull prints one line naming
the model, the variant and the tensor that does not fit, leaves the cache as
it was (no record, no file, no folder), and ``verify`` stays ok.
"""

from __future__ import annotations

import io

import torch
from safetensors.torch import load_file, save_file

from models.mobilenetv2 import MobileNetV2Factory
from svc.weightstore.cache import read_record
from svc.weightstore.catalog import FileSource, Variant
from tests.support.fakehub import FakeHub
from tests.support.weight_source import FakeSource
from tests.unit import test_weights_cli
from tests.unit.test_weights_cli import (
    FIXTURE_VARIANTS,
    cache_files,
    mobilenet_body,
    svcctl,
)

#: The fake source and cache of test_weights_cli (the same fixture).
source = test_weights_cli.source

MISFIT_URL = "https://example.org/weights/mobilenet_v2-ten-classes.pth"


def ten_class_body() -> bytes:
    """A MobileNetV2 state dict fine-tuned to 10 classes: every name is right, the classifier's shape is not."""
    state = torch.load(io.BytesIO(mobilenet_body(4)), weights_only=True)
    state["classifier.1.weight"] = torch.zeros(10, 1280)
    state["classifier.1.bias"] = torch.zeros(10)
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def test_a_pull_whose_tensors_do_not_fit_is_refused_and_leaves_the_cache_as_it_was(source, capsys, monkeypatch,
                                                                                   tmp_path):
    misfit = Variant("MISFIT", FileSource(url=MISFIT_URL), license="BSD-3-Clause")
    monkeypatch.setattr(MobileNetV2Factory, "variants", (*FIXTURE_VARIANTS, misfit))
    assert svcctl(capsys, "pull", "MOBILENETV2")[0] == 0
    before = cache_files(tmp_path)
    source.serve(MISFIT_URL, ten_class_body())
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2:MISFIT")
    where = source.mirror + FakeSource.path_of(MISFIT_URL)
    failures = [line for line in err.splitlines() if line.startswith("svcctl:")]
    assert (code, out) == (1, "")
    assert failures == [f"svcctl: MOBILENETV2 MISFIT: {where}: does not load as MOBILENETV2 MISFIT: WeightsError: "
                        f"weights file {where}: tensor 'classifier.1.weight' has shape [10, 1280], the architecture "
                        "expects [1000, 1280] (nothing kept)"]
    assert [p for p, _ in source.requests][-1] == FakeSource.path_of(MISFIT_URL)  # it was downloaded, then refused
    assert cache_files(tmp_path) == before
    assert not (tmp_path / "cache" / "MOBILENETV2" / "MISFIT").exists()
    assert read_record("MOBILENETV2", "MISFIT") is None
    assert svcctl(capsys, "verify") == (0, "MOBILENETV2 FIXTURE_V2: ok (1 files)\n", "")


def test_a_hub_pull_whose_tensors_do_not_fit_is_refused_and_leaves_nothing(source, capsys, monkeypatch, tmp_path):
    from tests.integration.test_weights_hub import write_google_ddpm

    repo = tmp_path / "repo"
    repo.mkdir()
    write_google_ddpm(repo)
    weights = repo / "diffusion_pytorch_model.safetensors"
    state = load_file(str(weights))
    state["conv_in.weight"] = torch.zeros(16, 4, 3, 3)  # four input channels: not the architecture's three
    save_file(state, str(weights))
    hub = FakeHub({"google/ddpm-cifar10-32": repo})
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    try:
        code, out, err = svcctl(capsys, "pull", "DDPM")
    finally:
        hub.close()
    assert any(path.endswith("diffusion_pytorch_model.safetensors") for _, path in hub.requests), hub.requests
    failures = [line for line in err.splitlines() if line.startswith("svcctl:")]
    assert (code, out, len(failures)) == (1, "", 1), err
    assert failures[0].startswith("svcctl: DDPM cifar10-32: google/ddpm-cifar10-32@main: does not load as DDPM "
                                  "cifar10-32: "), failures
    assert failures[0].endswith("tensor 'conv_in.weight' has shape [16, 4, 3, 3], the architecture expects "
                                "[16, 3, 3, 3] (nothing kept)"), failures
    assert cache_files(tmp_path) == []
    assert not (tmp_path / "cache" / "DDPM").exists()
    assert svcctl(capsys, "verify") == (0, f"no cached variants in {tmp_path / 'cache'}\n", "")
