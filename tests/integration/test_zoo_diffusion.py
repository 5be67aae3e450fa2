"""DDPM, DDIM, CLS_COND_DDIM and LDM on real model servers loading diffusers
folders written by ``save_pretrained``: end to end through the job routes,
images identical to diffusers' own pipelines for the same seed and steps,
and every params rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import (
    DDIMPipeline,
    DDIMScheduler,
    DDPMPipeline,
    DDPMScheduler,
    LDMPipeline,
    UNet2DModel,
    VQModel,
)

from tests.support.extreme import GENERATIVE, check_extreme_aspect_ratios
from tests.support.http import post
from tests.support.processes import (
    child_env,
    model_server_args,
    run_to_exit,
    start_model_server,
    write_config,
)
from tests.support.zoo import IGNORED_IMAGE, assert_invalid, assert_ok, decode_image, infer, load_error, run_job

SCHEDULE = 50  # the folders' schedule length; the [model] table says 1000 and must not win
CLASSES = 5
SIZE = {"DDPM": 16, "DDIM": 16, "CLS_COND_DDIM": 16, "LDM": 32}  # LDM: 8x8 latents, decoded x4


def tiny_unet(in_channels: int, sample_size: int, num_classes: int | None = None) -> UNet2DModel:
    return UNet2DModel(
        sample_size=sample_size,
        in_channels=in_channels,
        out_channels=in_channels,
        block_out_channels=(16, 32),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
        attention_head_dim=8,
        num_class_embeds=num_classes,
    )


def write_folder(model_id: str, folder: Path) -> None:
    """A seeded small model of ``model_id`` saved with save_pretrained."""
    torch.manual_seed({"DDPM": 1, "DDIM": 2, "CLS_COND_DDIM": 3, "LDM": 4}[model_id])
    if model_id == "DDPM":
        DDPMPipeline(tiny_unet(3, 16), DDPMScheduler(num_train_timesteps=SCHEDULE)).save_pretrained(folder)
    elif model_id == "DDIM":
        DDIMPipeline(tiny_unet(3, 16), DDIMScheduler(num_train_timesteps=SCHEDULE)).save_pretrained(folder)
    elif model_id == "LDM":
        vqvae = VQModel(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 3,
                        up_block_types=("UpDecoderBlock2D",) * 3, block_out_channels=(16, 16, 32),
                        latent_channels=3, num_vq_embeddings=32, norm_num_groups=8, sample_size=32)
        LDMPipeline(vqvae, tiny_unet(3, 8), DDIMScheduler(num_train_timesteps=SCHEDULE)).save_pretrained(folder)
    else:  # no pipeline class in diffusers: the components' own save_pretrained
        tiny_unet(3, 16, CLASSES).save_pretrained(folder / "unet")
        DDIMScheduler(num_train_timesteps=SCHEDULE).save_pretrained(folder / "scheduler")


def reference(model_id: str, folder: Path, seed: int, steps: int, eta: float = 0.0, class_id: int = 0) -> np.ndarray:
    """The same sample from diffusers directly: its pipelines, or (CLS_COND_DDIM) its components."""
    generator = torch.Generator().manual_seed(seed)
    if model_id == "DDPM":
        images = DDPMPipeline.from_pretrained(folder)(generator=generator, num_inference_steps=steps,
                                                      output_type="np").images
    elif model_id == "DDIM":
        images = DDIMPipeline.from_pretrained(folder)(generator=generator, num_inference_steps=steps, eta=eta,
                                                      output_type="np").images
    elif model_id == "LDM":
        assert eta == 0.0  # LDMPipeline draws eta noise without the generator
        images = LDMPipeline.from_pretrained(folder)(generator=generator, num_inference_steps=steps,
                                                     output_type="np").images
    else:
        unet = UNet2DModel.from_pretrained(folder / "unet").eval()
        scheduler = DDIMScheduler.from_pretrained(folder / "scheduler")
        x = torch.randn((1, 3, 16, 16), generator=generator)
        scheduler.set_timesteps(steps)
        labels = torch.tensor([class_id])
        with torch.no_grad():
            for t in scheduler.timesteps:
                out = unet(x, t, class_labels=labels).sample
                x = scheduler.step(out, t, x, eta=eta, generator=generator).prev_sample
        images = (x / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).numpy()
    return (images[0] * 255).round().astype("uint8")


@pytest.fixture(scope="module", params=GENERATIVE)
def diffusion(request, tmp_path_factory):
    model_id = request.param
    directory = tmp_path_factory.mktemp(model_id.lower())
    folder = directory / "weights"
    write_folder(model_id, folder)
    config = write_config(directory, model_id, max_queue_depth=0, model={"weights": str(folder)})
    server = start_model_server(config)
    server.extra.update(id=model_id, folder=folder, uri=f"/{model_id.lower()}/predict")
    yield server
    server.stop()


def params_for(server, **params) -> dict:
    if server.extra["id"] == "CLS_COND_DDIM":
        params.setdefault("class_id", 3)
    return params


def test_a_job_samples_the_pipelines_image_for_a_seed_and_step_count(diffusion):
    model_id = diffusion.extra["id"]
    params = params_for(diffusion, timesteps=4, seed=1234)
    result = run_job(diffusion, {"images": [IGNORED_IMAGE], "params": params})
    assert result["status"] == 0 and result["model"]["name"] == model_id
    assert result["model"]["version"].startswith("weights@")
    data = result["results"][0]["data"]
    size = SIZE[model_id]
    assert (data["width"], data["height"], data["seed"]) == (size, size, 1234)
    image = decode_image(data["image"])
    assert image.format == "PNG" and image.size == (size, size) and image.mode == "RGB"
    expected = reference(model_id, diffusion.extra["folder"], 1234, 4, class_id=params.get("class_id", 0))
    assert np.array_equal(np.asarray(image), expected)
    if model_id == "CLS_COND_DDIM":
        assert data["class_id"] == 3


def test_the_same_seed_gives_the_same_image_and_another_seed_another(diffusion):
    uri = diffusion.extra["uri"]
    eta = {} if diffusion.extra["id"] == "DDPM" else {"eta": 0.7}  # stochastic steps too
    body = {"images": [IGNORED_IMAGE], "params": params_for(diffusion, timesteps=3, seed=99, **eta)}
    first = assert_ok(infer(diffusion, uri, body))[0]
    again = run_job(diffusion, body)["results"][0]["data"]
    other = assert_ok(infer(diffusion, uri, {**body, "params": {**body["params"], "seed": 100}}))[0]
    assert first == again
    assert first["image"] != other["image"]


def test_without_a_seed_one_is_drawn_reported_and_reproducible(diffusion):
    uri = diffusion.extra["uri"]
    drawn = assert_ok(infer(diffusion, uri, {"images": [IGNORED_IMAGE] * 2, "params": params_for(diffusion, timesteps=2)}), 2)
    assert drawn[0]["seed"] != drawn[1]["seed"]
    for data in drawn:
        assert 0 <= data["seed"] < 2**32
        again = assert_ok(infer(diffusion, uri, {"images": [IGNORED_IMAGE],
                                                 "params": params_for(diffusion, timesteps=2, seed=data["seed"])}))[0]
        assert again == data


def test_the_default_is_the_folders_schedule_length(diffusion):
    """No timesteps: the whole schedule of the folder (50 steps), not the [model] table's 1000."""
    seed = 5
    data = run_job(diffusion, {"images": [IGNORED_IMAGE], "params": params_for(diffusion, seed=seed)})["results"][0]["data"]
    if diffusion.extra["id"] != "LDM":  # LDM's reference is checked with 4 steps above
        expected = reference(diffusion.extra["id"], diffusion.extra["folder"], seed, SCHEDULE,
                             class_id=3 if diffusion.extra["id"] == "CLS_COND_DDIM" else 0)
        assert np.array_equal(np.asarray(decode_image(data["image"])), expected)
    assert data["seed"] == seed


@pytest.mark.parametrize("image_format, pil_format", [("jpeg", "JPEG"), ("webp", "WEBP"), ("png", "PNG")])
def test_image_format_option(diffusion, image_format, pil_format):
    body = {"images": [IGNORED_IMAGE], "params": params_for(diffusion, timesteps=1, seed=3),
            "options": {"image_format": image_format}}
    data = assert_ok(infer(diffusion, diffusion.extra["uri"], body))[0]
    image = decode_image(data["image"])
    assert image.format == pil_format and image.size == (data["width"], data["height"])


@pytest.mark.parametrize("timesteps", [0, SCHEDULE + 1, 1000])
def test_timesteps_out_of_range_is_422_on_both_routes(diffusion, timesteps):
    body = {"images": [IGNORED_IMAGE], "params": params_for(diffusion, timesteps=timesteps)}
    assert_invalid(infer(diffusion, diffusion.extra["uri"], body), "/params/timesteps")
    reply = post(diffusion.url + "/jobs", body, headers=diffusion.auth)
    assert_invalid(reply, "/params/timesteps")
    assert str(SCHEDULE) in reply.json["errors"][0]["message"] or timesteps == 0


COMMON_RULES = [
    ({"steps": 5}, "/params/steps"),
    ({"timesteps": "5"}, "/params/timesteps"),
    ({"timesteps": 2.5}, "/params/timesteps"),
    ({"seed": -1}, "/params/seed"),
    ({"seed": 2**32}, "/params/seed"),
    ({"seed": "7"}, "/params/seed"),
]
ETA_RULES = [({"eta": 1.5}, "/params/eta"), ({"eta": -0.1}, "/params/eta"), ({"eta": "0"}, "/params/eta")]
RULES = {
    "DDPM": COMMON_RULES + [({"eta": 0.5}, "/params/eta"), ({"class_id": 1}, "/params/class_id")],
    "DDIM": COMMON_RULES + ETA_RULES + [({"class_id": 1}, "/params/class_id")],
    "LDM": COMMON_RULES + ETA_RULES + [({"class_id": 1}, "/params/class_id")],
    "CLS_COND_DDIM": COMMON_RULES + ETA_RULES + [
        ({"class_id": CLASSES}, "/params/class_id"),  # the folder's UNet has 5 classes
        ({"class_id": -1}, "/params/class_id"),
        ({"class_id": True}, "/params/class_id"),
    ],
}


def test_params_rules(diffusion):
    for params, pointer in RULES[diffusion.extra["id"]]:
        body = {"images": [IGNORED_IMAGE], "params": {"timesteps": 1, **params}}
        assert_invalid(infer(diffusion, diffusion.extra["uri"], body), pointer)
    assert_invalid(infer(diffusion, diffusion.extra["uri"], {"images": [IGNORED_IMAGE],
                                                             "options": {"image_format": "gif"}}), "/options/image_format")
    assert_invalid(infer(diffusion, diffusion.extra["uri"], {"images": [IGNORED_IMAGE],
                                                             "options": {"max_results": 2}}), "/options/max_results")


def test_extreme_aspect_ratios_cost_bounded_memory(diffusion):
    """tests/support/extreme.check_extreme_aspect_ratios: the image is ignored, whatever its shape."""
    check_extreme_aspect_ratios(diffusion, diffusion.extra["id"], diffusion.extra["uri"],
                                params_for(diffusion, timesteps=1, seed=0))


def test_the_image_must_still_be_valid_base64(diffusion):
    reply = infer(diffusion, diffusion.extra["uri"], {"images": ["not base64!"], "params": params_for(diffusion, timesteps=1)})
    assert reply.status == 400 and reply.json["status"] == 5 and reply.json["results"][0]["data"] is None


def refusal(tmp_path, model_id, folder) -> str:
    config = write_config(tmp_path, model_id, model={"weights": str(folder)})
    code, output = run_to_exit(model_server_args(config, 0), env=child_env({"SERVICE_AUTH_TOKEN": "t"}))
    assert code == 1, output
    return output


def test_a_folder_whose_weights_do_not_fit_its_config_stops_the_server(tmp_path):
    folder = tmp_path / "ddpm"
    write_folder("DDPM", folder)
    torch.manual_seed(0)
    wider = tmp_path / "wider"
    UNet2DModel(sample_size=16, block_out_channels=(32, 32), layers_per_block=1, norm_num_groups=8,
                down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                up_block_types=("AttnUpBlock2D", "UpBlock2D")).save_pretrained(wider)
    weights = folder / "unet" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes((wider / "diffusion_pytorch_model.safetensors").read_bytes())
    # In this process (tests/support/zoo.load_error); the next test shows a folder's refusal with a real one.
    assert load_error(tmp_path, "DDPM", weights=str(folder)) == (
        f"weights file {weights}: tensor 'conv_in.weight' has shape [32, 3, 3, 3], the architecture expects [16, 3, 3, 3]")


def test_a_folder_without_its_unet_or_vqvae_stops_the_server(tmp_path):
    (tmp_path / "empty").mkdir()
    output = refusal(tmp_path, "DDIM", tmp_path / "empty")
    assert f"weights folder {tmp_path / 'empty'}: missing unet/config.json" in output
    folder = tmp_path / "ddim"
    write_folder("DDIM", folder)  # no vqvae/
    assert (f"weights folder {folder}: model_index.json is a DDIMPipeline, expected a LDMPipeline: the folder is "
            "another model's, not LDM's") in load_error(tmp_path, "LDM", weights=str(folder))
    (folder / "model_index.json").unlink()  # its components alone: what LDM misses is said
    assert f"weights folder {folder}: missing vqvae/config.json" in load_error(tmp_path, "LDM", weights=str(folder))
    assert "unet/config.json has no num_class_embeds" in load_error(tmp_path, "CLS_COND_DDIM", weights=str(folder))


def test_a_fifo_behind_a_linked_component_folder_stops_the_server_too(tmp_path):
    """A regression probe: ``unet/`` a link to a folder whose ``config.json`` is a FIFO hung the server at
    "loading" (the check walked the folder without following links; diffusers reads through them)."""
    import os

    folder = tmp_path / "ddpm"
    write_folder("DDPM", folder)
    (folder / "unet").rename(tmp_path / "elsewhere_unet")
    (tmp_path / "elsewhere_unet" / "config.json").unlink()
    os.mkfifo(tmp_path / "elsewhere_unet" / "config.json")
    (folder / "unet").symlink_to(tmp_path / "elsewhere_unet")
    (folder / "loop").symlink_to(folder)  # a link back up the tree is walked once
    config = write_config(tmp_path, "DDPM", model={"weights": str(folder)})
    code, output = run_to_exit(model_server_args(config, 0), env=child_env({"SERVICE_AUTH_TOKEN": "t"}), timeout=60)
    assert code == 1, output
    assert f"weights folder {folder}: unet/config.json: not a regular file (a FIFO, a socket or a device)" in output


@pytest.mark.parametrize("name", ["scheduler/scheduler_config.json", "README.md"])
def test_a_fifo_in_the_folder_stops_the_server_instead_of_hanging_it(tmp_path, name):
    """A regression probe: a FIFO as a config (read first) or as any other file (the version hash reads every
    file) hung the model server for good at "loading"; the tensors' file alone was checked."""
    import os

    folder = tmp_path / "ddpm"
    write_folder("DDPM", folder)
    (folder / name).unlink(missing_ok=True)
    os.mkfifo(folder / name)
    config = write_config(tmp_path, "DDPM", model={"weights": str(folder)})
    code, output = run_to_exit(model_server_args(config, 0), env=child_env({"SERVICE_AUTH_TOKEN": "t"}), timeout=60)
    assert code == 1, output
    assert f"weights folder {folder}: {name}: not a regular file (a FIFO, a socket or a device)" in output, output


@pytest.mark.parametrize("model_id, table, said", [
    ("DDIM", {"sample_size": 18}, "model.sample_size: 18 is not a multiple of 4: each of the 2 levels below the "
                                  "first of block_out_channels halves the side"),
    ("LDM", {"sample_size": 12, "block_out_channels": [32, 32, 32, 32]},
     "model.sample_size: 12 is not a multiple of 8: each of the 3 levels below the first of block_out_channels "
     "halves the side"),
])
def test_a_sample_size_the_levels_cannot_halve_stops_the_server_with_a_line_that_says_so(tmp_path, model_id, table,
                                                                                        said):
    """``sample_size = 18`` with three levels (inside the documented 8..1024) stopped the server with torch's
    "Sizes of tensors must match except in dimension 1" (diffusion probe), once the model loaded: it is refused
    with the config check, naming the file and the key (an upgrade probe), as the supervisor's start checks
    every config."""
    config = write_config(tmp_path, model_id, model=table)
    code, output = run_to_exit(model_server_args(config, 0), env=child_env({"SERVICE_AUTH_TOKEN": "t"}))
    assert code == 1 and f"{config}: {said}" in output and "Sizes of tensors" not in output, output
    assert "model failed to load" not in output  # before any model is built
