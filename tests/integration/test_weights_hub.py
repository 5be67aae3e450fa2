"""Pretrained diffusion variants from a Hugging Face hub, without the internet.

A fake hub on 127.0.0.1 (tests/support/fakehub.py, set as ``HF_ENDPOINT``)
serves small diffusers repositories under the real repository ids, in the
layouts the hub has them: ``google/ddpm-*`` flat (the UNet's ``config.json``
and weights and ``scheduler_config.json`` at the root, attention tensors under
their pre-rename names, a ``.bin`` twin next to the safetensors file), and
``CompVis/ldm-celebahq-256`` and ``facebook/DiT-XL-2-256`` as a pipeline's
``save_pretrained`` writes them (``unet/``, ``vqvae/``, ``scheduler/``;
``transformer/`` under its pre-split class name ``Transformer2DModel``,
``vae/``, ``scheduler/``).  ``svc.weightstore.hub.fetch_hub``
downloads them, and model servers sample from what it fetched.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import (
    AutoencoderKL,
    DDIMScheduler,
    DDPMPipeline,
    DDPMScheduler,
    DiTPipeline,
    DiTTransformer2DModel,
    LDMPipeline,
    UNet2DModel,
    VQModel,
)
from safetensors.torch import save_file

from models.diffusion import cls_cond_ddim, ddim, ddpm, ldm
from svc.model.api import reporting_progress
from svc.weightstore.catalog import find_variant
from svc.weightstore.hub import HubError, fetch_hub, select_files
from tests.support.fakehub import FakeHub
from tests.support.http import post
from tests.support.processes import free_port, start_model_server, write_config
from tests.support.zoo import IGNORED_IMAGE, decode_image, run_job

SCHEDULE = 40
LEGACY = {"to_q": "query", "to_k": "key", "to_v": "value", "to_out.0": "proj_attn"}


def tiny_unet(sample_size: int) -> UNet2DModel:
    return UNet2DModel(sample_size=sample_size, in_channels=3, out_channels=3, block_out_channels=(16, 32),
                       layers_per_block=1, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8, attention_head_dim=8)


def legacy_names(state: dict) -> dict:
    """The attention tensor names of checkpoints written before diffusers renamed them."""
    renamed = {}
    for name, tensor in state.items():
        for new, old in LEGACY.items():
            if f".{new}." in name and ".attentions." in name:
                name = name.replace(f".{new}.", f".{old}.")
        renamed[name] = tensor.contiguous()
    return renamed


def write_google_ddpm(root: Path) -> None:
    """The flat layout of google/ddpm-*: the UNet and the scheduler at the root, legacy attention names."""
    torch.manual_seed(11)
    unet = tiny_unet(16)
    unet.save_pretrained(root)
    state = unet.state_dict()
    assert any(".to_q." in n for n in state)
    save_file(legacy_names(state), str(root / "diffusion_pytorch_model.safetensors"))
    (root / "diffusion_pytorch_model.bin").write_bytes(b"not fetched: the safetensors twin is")
    DDPMScheduler(num_train_timesteps=SCHEDULE).save_pretrained(root)
    (root / "model_index.json").write_text(json.dumps(
        {"_class_name": "DDPMPipeline", "scheduler": ["diffusers", "DDPMScheduler"], "unet": ["diffusers", "UNet2DModel"]}))
    (root / "README.md").write_text("---\nlicense: apache-2.0\n---\n")
    (root / "images").mkdir()
    (root / "images" / "sample.png").write_bytes(b"\x89PNG not fetched")


def write_compvis_ldm(root: Path) -> None:
    torch.manual_seed(12)
    vqvae = VQModel(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 3,
                    up_block_types=("UpDecoderBlock2D",) * 3, block_out_channels=(16, 16, 32), latent_channels=3,
                    num_vq_embeddings=32, norm_num_groups=8, sample_size=32)
    LDMPipeline(vqvae, tiny_unet(8), DDIMScheduler(num_train_timesteps=SCHEDULE)).save_pretrained(root)


def write_facebook_dit(root: Path) -> None:
    """A tiny DiT with ImageNet's 1000 classes (DiTPipeline's null class is 1000)."""
    torch.manual_seed(13)
    transformer = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8,
                                        num_layers=1, sample_size=8, patch_size=2, num_embeds_ada_norm=1000)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(16, 32), latent_channels=4,
                        norm_num_groups=8, sample_size=16)
    DiTPipeline(transformer, vae, DDIMScheduler(num_train_timesteps=SCHEDULE)).save_pretrained(root)
    config = root / "transformer" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "_class_name": "Transformer2DModel"}))


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    base = tmp_path_factory.mktemp("hub")
    repos = {"google/ddpm-cifar10-32": base / "ddpm", "CompVis/ldm-celebahq-256": base / "ldm",
             "facebook/DiT-XL-2-256": base / "dit"}
    for folder in repos.values():
        folder.mkdir()
    write_google_ddpm(repos["google/ddpm-cifar10-32"])
    write_compvis_ldm(repos["CompVis/ldm-celebahq-256"])
    write_facebook_dit(repos["facebook/DiT-XL-2-256"])
    fake = FakeHub(repos)
    yield fake
    fake.close()


@pytest.fixture
def endpoint(hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    return hub.url


@pytest.fixture(scope="module")
def fetched(hub, tmp_path_factory):
    """The default variants of DDPM and LDM, fetched once for the model-server tests."""
    import os

    cache = tmp_path_factory.mktemp("cache")
    saved = os.environ.get("HF_ENDPOINT")
    os.environ["HF_ENDPOINT"] = hub.url
    try:
        out = {}
        for factory in (ddpm, ldm, cls_cond_ddim):
            dest = cache / factory.catalog_id / find_variant(factory, None).name
            out[factory.catalog_id] = dest / fetch_hub(find_variant(factory, None), dest)
    finally:
        if saved is None:
            os.environ.pop("HF_ENDPOINT")
        else:
            os.environ["HF_ENDPOINT"] = saved
    return out


def files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


# -- the variants declared ---------------------------------------------------------------------


def test_the_diffusion_variants_name_the_official_repositories():
    assert [(v.name, v.source.repo_id, v.license, v.default) for v in ddpm.variants] == [
        ("cifar10-32", "google/ddpm-cifar10-32", "Apache-2.0", True),
        ("celebahq-256", "google/ddpm-celebahq-256", "Apache-2.0", False)]
    assert [(v.name, v.source.repo_id) for v in ddim.variants] == [(v.name, v.source.repo_id) for v in ddpm.variants]
    assert [(v.name, v.source.repo_id, v.license, v.default) for v in ldm.variants] == [
        ("celebahq-256", "CompVis/ldm-celebahq-256", "Apache-2.0", True)]
    assert [(v.name, v.source.repo_id, v.license, v.default) for v in cls_cond_ddim.variants] == [
        ("dit-xl-2-256", "facebook/DiT-XL-2-256", "CC-BY-NC-4.0", True)]


def test_select_files_prefers_safetensors_and_keeps_the_patterns():
    sizes = {"config.json": 1, "a.safetensors": 2, "a.bin": 2, "unet/b.bin": 3, "README.md": 4, "images/x.png": 5}
    assert select_files(sizes, ("*.json", "*.safetensors", "*.bin")) == {
        "config.json": 1, "a.safetensors": 2, "unet/b.bin": 3}
    assert select_files(sizes, ()) == {k: v for k, v in sizes.items() if k != "a.bin"}


# -- fetch_hub ---------------------------------------------------------------------------------


def test_fetch_hub_downloads_the_snapshot_into_place(hub, endpoint, tmp_path):
    variant = find_variant(ddpm, None)
    dest = tmp_path / "DDPM" / "cifar10-32"
    leftover = tmp_path / "DDPM" / ".cifar10-32.partial-999999999-0bad"  # of a fetch that was killed
    (leftover / "ddpm-cifar10-32").mkdir(parents=True)
    seen = []
    assert fetch_hub(variant, dest, lambda done, total: seen.append((done, total))) == "ddpm-cifar10-32"
    root = hub.repos["google/ddpm-cifar10-32"]
    expected = ["config.json", "diffusion_pytorch_model.safetensors", "model_index.json", "scheduler_config.json"]
    assert files_under(dest) == [f"ddpm-cifar10-32/{name}" for name in expected]
    for name in expected:
        assert (dest / "ddpm-cifar10-32" / name).read_bytes() == (root / name).read_bytes()
    total = sum((root / name).stat().st_size for name in expected)
    assert seen[-1] == (total, total) and all(t == total and 0 <= d <= total for d, t in seen)
    assert [p.name for p in dest.parent.iterdir()] == ["cifar10-32"]  # no temporary sibling left, nor the old one
    fetched = {path.rsplit("/", 1)[-1] for method, path in hub.requests if method == "GET" and "/resolve/" in path}
    assert "diffusion_pytorch_model.bin" not in fetched and "README.md" not in fetched


def test_a_second_fetch_replaces_the_folder(endpoint, tmp_path):
    variant = find_variant(ldm, None)
    dest = tmp_path / "LDM" / "celebahq-256"
    dest.mkdir(parents=True)
    (dest / "stale.txt").write_text("from an older pull")
    assert fetch_hub(variant, dest) == "ldm-celebahq-256"
    assert files_under(dest) == [f"ldm-celebahq-256/{name}" for name in (
        "model_index.json", "scheduler/scheduler_config.json", "unet/config.json",
        "unet/diffusion_pytorch_model.safetensors", "vqvae/config.json", "vqvae/diffusion_pytorch_model.safetensors")]


def test_offline_mode_fails_in_one_line_and_leaves_nothing(endpoint, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    dest = tmp_path / "DDPM" / "cifar10-32"
    with pytest.raises(HubError) as raised:
        fetch_hub(find_variant(ddpm, None), dest)
    assert str(raised.value) == ("hub repository google/ddpm-cifar10-32@main: HF_HUB_OFFLINE is set, nothing "
                                 "downloaded (unset it to pull)")
    assert list(tmp_path.iterdir()) == []


def test_an_unreachable_hub_fails_in_one_line_and_keeps_what_was_there(monkeypatch, tmp_path):
    port = free_port()  # nothing listens there
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    dest = tmp_path / "LDM" / "celebahq-256"
    dest.mkdir(parents=True)
    (dest / "keep.txt").write_text("an earlier complete pull")
    with pytest.raises(HubError) as raised:
        fetch_hub(find_variant(ldm, None), dest)
    message = str(raised.value)
    assert message.startswith("hub repository CompVis/ldm-celebahq-256@main: ConnectError: ")
    assert "Connection refused" in message and "\n" not in message
    assert files_under(tmp_path) == ["LDM/celebahq-256/keep.txt"]


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "ALL_PROXY"])
def test_an_unreachable_proxy_of_a_hub_pull_is_named(endpoint, monkeypatch, tmp_path, variable):
    """A weights probe: ``HTTP_PROXY`` naming a proxy that is not there made a hub pull fail with "ConnectError:
    Connection refused" after the repository's name, which reads as the hub refusing; a file pull's line names
    the proxy (without its credentials)."""
    port = free_port()  # nothing listens there
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, f"http://u:pw@127.0.0.1:{port}")
    with pytest.raises(HubError) as raised:
        fetch_hub(find_variant(ddpm, None), tmp_path / "DDPM" / "cifar10-32")
    message = str(raised.value)
    assert message.startswith(f"hub repository google/ddpm-cifar10-32@main: the proxy http://127.0.0.1:{port} could "
                              "not be reached: ConnectError: "), message
    assert "pw" not in message and "\n" not in message
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # the hub itself, not through the proxy: fetched
    assert fetch_hub(find_variant(ddpm, None), tmp_path / "DDPM" / "cifar10-32") == "ddpm-cifar10-32"


def test_a_socks_proxy_of_a_hub_pull_is_said_with_the_way_on(endpoint, monkeypatch, tmp_path):
    """A regression probe: ``ALL_PROXY=socks5://...``, its usual form, made a hub pull fail with httpx's "ImportError:
    Using SOCKS proxy, but the 'socksio' package is not installed"; a file pull says which proxies it takes."""
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ALL_PROXY", f"socks5://u:pw@127.0.0.1:{free_port()}")
    with pytest.raises(HubError) as raised:
        fetch_hub(find_variant(ddpm, None), tmp_path / "DDPM" / "cifar10-32")
    assert str(raised.value).startswith("hub repository google/ddpm-cifar10-32@main: proxy socks5://127.0.0.1:")
    assert str(raised.value).endswith(" (ALL_PROXY): only http:// proxies are supported (set HTTPS_PROXY and "
                                      "HTTP_PROXY to one, or unset ALL_PROXY to connect directly)")
    # Beside an http proxy of the hub's scheme (this hub's is http), which takes its URL, httpx still makes the
    # SOCKS proxy's transport and failed with its ImportError (a regression probe): the same line.
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(HubError) as raised:
        fetch_hub(find_variant(ddpm, None), tmp_path / "DDPM" / "cifar10-32")
    assert "socksio" not in str(raised.value) and str(raised.value).endswith(" (ALL_PROXY): only http:// proxies "
                                                                            "are supported (set HTTPS_PROXY and "
                                                                            "HTTP_PROXY to one, or unset ALL_PROXY "
                                                                            "to connect directly)"), str(raised.value)
    monkeypatch.delenv("HTTP_PROXY")
    monkeypatch.delenv("ALL_PROXY")
    assert fetch_hub(find_variant(ddpm, None), tmp_path / "DDPM" / "cifar10-32") == "ddpm-cifar10-32"


def test_a_hub_that_never_answers_fails_in_one_line_within_its_silence_limit(monkeypatch, tmp_path):
    """A CLI probe: ``weights pull DDPM`` against an ``HF_ENDPOINT`` that accepted and never answered printed its
    header and nothing more for 581 s, until killed (huggingface_hub's client has no timeout).  The hub may stay
    silent ``SILENCE_TIMEOUT_S`` (60 s; 1 s here), then the pull fails in one line and leaves nothing."""
    import socket
    import threading
    import time

    import svc.weightstore.hub as hub

    monkeypatch.setattr(hub, "SILENCE_TIMEOUT_S", 1.0)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts (the kernel does), never answers
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    outcome: list = []

    def pull() -> None:
        try:
            fetch_hub(find_variant(ddpm, None), tmp_path / "DDPM" / "cifar10-32")
        except HubError as e:
            outcome.append(str(e))

    started = time.monotonic()
    worker = threading.Thread(target=pull, daemon=True)
    worker.start()
    worker.join(30)
    silent.close()
    assert not worker.is_alive(), "the pull still waits on a silent hub"
    assert time.monotonic() - started < 15
    assert len(outcome) == 1 and outcome[0].startswith("hub repository google/ddpm-cifar10-32@main: ReadTimeout"), \
        outcome
    assert "\n" not in outcome[0] and files_under(tmp_path) == []


def test_a_hub_silent_after_its_first_answer_fails_within_the_silence_limit(monkeypatch, tmp_path):
    """The listing (``list_repo_tree``) takes no timeout of its own: the silence limit is the client's, so a hub
    that gives the revision and then never lists its files fails as one that never answers."""
    import json as json_module
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import svc.weightstore.hub as hub

    released = threading.Event()

    class RevisionThenSilence(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if "/tree/" in self.path:
                released.wait(30)  # the listing: no answer
                return
            body = json_module.dumps({"id": "google/ddpm-cifar10-32", "sha": "a" * 40}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), RevisionThenSilence)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(hub, "SILENCE_TIMEOUT_S", 1.0)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    try:
        with pytest.raises(HubError) as raised:
            fetch_hub(find_variant(ddpm, None), tmp_path / "DDPM" / "cifar10-32")
    finally:
        released.set()
        server.shutdown()
        server.server_close()
    assert str(raised.value).startswith("hub repository google/ddpm-cifar10-32@main: ReadTimeout"), raised.value
    assert files_under(tmp_path) == []


def test_an_unknown_repository_is_named(endpoint, tmp_path):
    from svc.weightstore.catalog import HubSource, Variant

    variant = Variant("x", HubSource("google/ddpm-nowhere"), "apache-2.0")
    with pytest.raises(HubError) as raised:
        fetch_hub(variant, tmp_path / "x")
    assert str(raised.value).startswith("hub repository google/ddpm-nowhere@main: RepositoryNotFoundError: 404")
    assert "\n" not in str(raised.value) and list(tmp_path.iterdir()) == []


# -- model servers on fetched snapshots --------------------------------------------------------


def test_ddim_builds_the_google_layout_with_its_own_scheduler(fetched):
    folder = fetched["DDPM"]
    config = {"weights": str(folder), "version": "v"}
    model = ddim.build(config, "cpu")
    assert type(model.scheduler) is DDIMScheduler and model.scheduler.config.num_train_timesteps == SCHEDULE
    assert ddim.schedule_length(config) == SCHEDULE
    reference = DDPMPipeline.from_pretrained(folder)  # diffusers loads the same flat layout and legacy names
    for name, tensor in reference.unet.state_dict().items():
        assert torch.equal(tensor, model.unet.state_dict()[name]), name


@pytest.mark.parametrize("model_id, size", [("DDPM", 16), ("LDM", 32), ("CLS_COND_DDIM", 16)])
def test_a_model_server_samples_from_a_fetched_snapshot(fetched, tmp_path, model_id, size):
    """The image is diffusers' own pipeline's for the seed (DiTPipeline's for the class and guidance)."""
    folder = fetched[model_id]
    config = write_config(tmp_path, model_id, max_queue_depth=0, model={"weights": str(folder)})
    params = {"timesteps": 3, "seed": 7}
    if model_id == "CLS_COND_DDIM":
        params.update(class_id=207, guidance_scale=3.0)
    server = start_model_server(config)
    try:
        result = run_job(server, {"images": [IGNORED_IMAGE], "params": params})
        if model_id == "CLS_COND_DDIM":
            refused = post(server.url + "/cls_cond_ddim/predict",
                           {"images": [IGNORED_IMAGE], "params": {**params, "class_id": 1000}}, headers=server.auth)
            assert refused.status == 422 and refused.json["errors"][0]["pointer"] == "/params/class_id"
    finally:
        server.stop()
    assert result["status"] == 0 and result["model"]["version"].startswith(f"{folder.name}@")
    data = result["results"][0]["data"]
    assert (data["width"], data["height"], data["seed"]) == (size, size, 7)
    generator = torch.Generator().manual_seed(7)
    if model_id == "CLS_COND_DDIM":
        assert data["class_id"] == 207
        images = dit_pipeline(folder)(class_labels=[207], guidance_scale=3.0, generator=generator,
                                      num_inference_steps=3, output_type="np").images
    else:
        pipeline = (DDPMPipeline if model_id == "DDPM" else LDMPipeline).from_pretrained(folder)
        images = pipeline(generator=generator, num_inference_steps=3, output_type="np").images
    assert np.array_equal(np.asarray(decode_image(data["image"])), (images[0] * 255).round().astype("uint8"))


def dit_pipeline(folder: Path) -> DiTPipeline:
    """diffusers' DiTPipeline on the components CLS_COND_DDIM builds from ``folder``.

    Not ``DiTPipeline.from_pretrained``: its loader keeps the tensors where
    it read them, and the transformer's matrix products then round a few
    values differently in the last bit (2e-7 here, one 8-bit level in a few
    pixels) although every tensor is equal; the tensors are compared with
    that loader's exactly below.
    """
    model = cls_cond_ddim.build({"weights": str(folder), "version": "v"}, "cpu")
    return DiTPipeline(model.unet, model.vqvae, DDIMScheduler.from_config(model.scheduler.config))


def test_the_dit_params_come_from_the_folder(fetched):
    table = {"weights": str(fetched["CLS_COND_DDIM"]), "num_train_timesteps": 1000, "num_classes": 10}
    props = cls_cond_ddim.params_schema(table)["properties"]
    assert props["class_id"]["maximum"] == 999 and props["timesteps"]["maximum"] == SCHEDULE
    assert props["guidance_scale"] == {
        "type": "number", "minimum": 1, "maximum": 20, "default": 4.0,
        "description": "Classifier-free guidance of the DiT weights (1: none; DiTPipeline's default 4)."}
    model = cls_cond_ddim.build({**table, "version": "v"}, "cpu")
    assert type(model.unet) is DiTTransformer2DModel and model.dit and type(model.scheduler) is DDIMScheduler
    reference = DiTPipeline.from_pretrained(fetched["CLS_COND_DDIM"])  # reads transformer/ as Transformer2DModel
    for mine, theirs in ((model.unet, reference.transformer), (model.vqvae, reference.vae)):
        ours = mine.state_dict()
        assert all(torch.equal(tensor, ours[name]) for name, tensor in theirs.state_dict().items())
        assert set(ours) == set(theirs.state_dict())
    assert dict(model.scheduler.config) == dict(reference.scheduler.config)
    unguided = DiTPipeline(model.unet, model.vqvae, DDIMScheduler.from_config(model.scheduler.config))(
        class_labels=[3], guidance_scale=1.0, generator=torch.Generator().manual_seed(1), num_inference_steps=2,
        output_type="np").images
    reports: list[tuple[int, int]] = []
    with reporting_progress(lambda step, steps: reports.append((step, steps))):
        pixels = model.sample([1], 2, 0.0, [3], 1.0)
    assert np.array_equal(pixels[0], (unguided[0] * 255).round().astype("uint8"))
    # A job's progress, and where work nobody waits for stops: the DiT loop reported no step (diffusion probe).
    assert reports == [(1, 2), (2, 2)]


def test_svcctl_pulls_a_hub_variant_and_a_model_server_serves_it_as_pretrained(hub, tmp_path):
    """The documented path end to end for a hub model: `svcctl weights pull DDPM` (HF_ENDPOINT on the fake hub)
    records the snapshot, `weights verify` agrees, and `weights = "pretrained"` serves it with the variant's name
    as the version and diffusers' own pipeline's image."""
    import subprocess
    import sys

    from tests.support.processes import REPO, child_env

    cache = tmp_path / "cache"
    env = child_env({"SERVICE_WEIGHTS_DIR": str(cache), "HF_ENDPOINT": hub.url}, drop=("HF_HUB_OFFLINE",))
    pull = subprocess.run([sys.executable, "-m", "svc.cli", "weights", "pull", "DDPM"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert pull.returncode == 0, pull.stderr
    record = json.loads((cache / "DDPM" / "cifar10-32" / "record.json").read_text())
    assert (record["source"], record["weights"], record["how"]) == (
        "google/ddpm-cifar10-32@main", "hub/ddpm-cifar10-32", "pull")
    assert not [p for p in (cache / "DDPM" / "cifar10-32").iterdir() if p.name not in ("hub", "record.json")]
    verify = subprocess.run([sys.executable, "-m", "svc.cli", "weights", "verify"], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0 and "DDPM cifar10-32: ok" in verify.stdout, verify.stdout + verify.stderr

    config = write_config(tmp_path, "DDPM", max_queue_depth=0, model={"weights": "pretrained"})
    server = start_model_server(config, env={"SERVICE_WEIGHTS_DIR": str(cache)})
    try:
        result = run_job(server, {"images": [IGNORED_IMAGE], "params": {"timesteps": 3, "seed": 7}})
    finally:
        server.stop()
    assert result["status"] == 0 and result["model"]["version"] == "cifar10-32"
    folder = cache / "DDPM" / "cifar10-32" / "hub" / "ddpm-cifar10-32"
    images = DDPMPipeline.from_pretrained(folder)(generator=torch.Generator().manual_seed(7), num_inference_steps=3,
                                                 output_type="np").images
    got = np.asarray(decode_image(result["results"][0]["data"]["image"]))
    assert np.array_equal(got, (images[0] * 255).round().astype("uint8"))


def test_an_imported_copy_of_a_pulled_repository_is_stored_as_the_pull_and_loads_the_same(
        hub, endpoint, monkeypatch, capsys, tmp_path):
    """`weights import` of a byte-identical copy of what a pull stored, or of the repository as the hub has it
    (README.md, images/, the .bin twin), is stored as the pull stores it: the same files in the same place,
    so it compares equal to the pull, and a model server loads the same folder.  A variant imported before
    imports were stored so (the whole folder as hub/) still loads, and --replace moves it to the pull's layout."""
    import hashlib
    import shutil

    from svc.cli import commands as cli
    from svc.model.api import model_config
    from svc.weightstore.cache import Record, read_record, variant_dir, write_record

    def svcctl(*args: str) -> tuple[int, str, str]:
        code = cli.main(["weights", *args])
        out, err = capsys.readouterr()
        return code, out, err

    monkeypatch.setenv("SERVICE_WEIGHTS_DIR", str(tmp_path / "cache"))
    assert svcctl("pull", "DDPM")[0] == 0
    pulled = read_record("DDPM", "cifar10-32")
    folder = variant_dir("DDPM", "cifar10-32") / "hub" / "ddpm-cifar10-32"
    copy = tmp_path / "x" / "ddpm-cifar10-32"
    shutil.copytree(folder, copy)
    for source in (copy, hub.repos["google/ddpm-cifar10-32"]):
        code, out, err = svcctl("import", "DDPM", str(source))
        assert (code, out, err) == (0, f"DDPM cifar10-32: imported: {folder}\n", "")
        imported = read_record("DDPM", "cifar10-32")
        assert (imported.how, imported.weights, imported.files) == ("import", pulled.weights, pulled.files)
    assert svcctl("verify")[:2] == (0, "DDPM cifar10-32: ok (4 files)\n")
    config = model_config(ddpm, {"weights": "pretrained"}, "DDPM.toml")
    assert config["weights"] == str(folder)
    ddpm.build(config, "cpu")

    # An import made before: the whole folder under hub/, loaded from there.
    shutil.rmtree(variant_dir("DDPM", "cifar10-32"))
    shutil.copytree(hub.repos["google/ddpm-cifar10-32"], variant_dir("DDPM", "cifar10-32") / "hub")
    files = {f"hub/{rel}": {"sha256": hashlib.sha256((variant_dir("DDPM", "cifar10-32") / "hub" / rel).read_bytes())
                            .hexdigest(), "size": (variant_dir("DDPM", "cifar10-32") / "hub" / rel).stat().st_size}
             for rel in files_under(variant_dir("DDPM", "cifar10-32") / "hub")}
    write_record(Record("DDPM", "cifar10-32", "google/ddpm-cifar10-32@main", "hub", files, "2026-11-01T00:00:00Z",
                        "import"))
    assert svcctl("verify")[:2] == (0, "DDPM cifar10-32: ok (7 files)\n")
    config = model_config(ddpm, {"weights": "pretrained"}, "DDPM.toml")
    assert config["weights"] == str(variant_dir("DDPM", "cifar10-32") / "hub")
    ddpm.build(config, "cpu")
    assert svcctl("import", "DDPM", str(copy)) == (1, "", (
        f"svcctl: DDPM cifar10-32: {copy}: other files than the cached DDPM cifar10-32 (3 differ, first "
        "README.md): pass --replace to replace it (nothing kept)\n"))
    assert svcctl("import", "DDPM", str(copy), "--replace")[0] == 0
    assert read_record("DDPM", "cifar10-32").files == pulled.files
    assert svcctl("verify")[:2] == (0, "DDPM cifar10-32: ok (4 files)\n")  # nothing of the old layout stays
