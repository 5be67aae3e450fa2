"""``svcctl weights import`` with files that are not ours: load-checked, never half-kept, named as the user named them.

Real plugins and real small weights: a tiny diffusers DDPM folder in the
google/ddpm-* layout (``tests.integration.test_weights_hub``), and
ultralytics-style ``.pt`` files written by ``tests.support.fake_ultralytics``.
The cache is a temporary ``SERVICE_WEIGHTS_DIR``; nothing touches a network.
"""

from __future__ import annotations

import json

import pytest
import torch

from models.yolov8_net import build_network
from svc.cli import commands as cli
from svc.weightstore.cache import read_record, variant_dir
from tests.integration.test_weights_hub import write_google_ddpm
from tests.support.fake_ultralytics import save_checkpoint
from tests.support.small_disk import read_only, small_disk


@pytest.fixture
def cache(monkeypatch, tmp_path):
    root = tmp_path / "cache"
    monkeypatch.setenv("SERVICE_WEIGHTS_DIR", str(root))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # a pull in these tests must not reach a hub
    return root


def svcctl(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["weights", *args])
    out, err = capsys.readouterr()
    return code, out, err


def everything_under(root) -> list[str]:
    """Every file and folder under ``root``: what a refused import must not have added."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else []


def test_a_folder_that_does_not_build_is_refused_named_and_leaves_nothing(cache, capsys, tmp_path):
    folder = tmp_path / "my-ddpm"
    folder.mkdir()
    (folder / "notes.txt").write_text("not a model")
    code, out, err = svcctl(capsys, "import", "DDPM", str(folder))  # nothing a pull would fetch
    assert (code, out, err) == (1, "", f"svcctl: DDPM cifar10-32: {folder}: no file matches *.json, *.safetensors, "
                                "*.bin (what a pull of google/ddpm-cifar10-32@main fetches) (nothing kept)\n")
    assert everything_under(cache) == []
    (folder / "config.json").write_text("{}")
    code, out, err = svcctl(capsys, "import", "DDPM", str(folder))
    assert (code, out) == (1, "")
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"svcctl: DDPM cifar10-32: {folder}: does not load as DDPM cifar10-32: "), err
    assert err.rstrip().endswith("(nothing kept)")
    assert str(cache) not in err  # the user's folder is named, not the cache's copy
    assert everything_under(cache) == []
    assert not cache.exists()  # nor the cache's own folder, made by this first import (an operator probe)
    assert svcctl(capsys, "verify")[:2] == (0, f"no cached variants in {cache}\n")


@pytest.mark.parametrize("index", [True, False])
def test_a_latent_models_folder_is_refused_as_a_pixel_models(cache, capsys, tmp_path, index):
    """A weights probe: CompVis' LDM folder imported as DDPM was recorded as google/ddpm-cifar10-32 (its latent UNet
    has three channels, as an image's, so it built) and would have sampled latents as pixels.  Its
    ``model_index.json`` names another pipeline; without one, its ``vqvae/`` says it is a latent model's."""
    from tests.integration.test_weights_hub import write_compvis_ldm

    folder = tmp_path / "ldm"
    folder.mkdir()
    write_compvis_ldm(folder)
    if not index:
        (folder / "model_index.json").unlink()
    code, out, err = svcctl(capsys, "import", "DDPM", str(folder))
    assert (code, out) == (1, "")
    why = ("model_index.json is a LDMPipeline, expected a DDPMPipeline or DDIMPipeline: the folder is another "
           "model's, not DDPM's" if index else
           "vqvae/ is a latent model's decoder and DDPM samples pixels: the folder is a latent diffusion model's")
    assert err.startswith(f"svcctl: DDPM cifar10-32: {folder}: does not load as DDPM cifar10-32: "), err
    assert why in err and len(err.splitlines()) == 1, err
    assert everything_under(cache) == []


def test_a_different_folder_replaces_a_cached_variant_only_with_replace(cache, capsys, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        folder.mkdir()
        write_google_ddpm(folder)
    torch.manual_seed(5)
    config = json.loads((second / "config.json").read_text())
    (second / "config.json").write_text(json.dumps({**config, "sample_size": 8}))  # another, loadable, folder
    code, out, err = svcctl(capsys, "import", "DDPM", str(first))
    assert code == 0, err
    assert out.splitlines()[-1] == (f"DDPM cifar10-32: imported: "
                                    f"{variant_dir('DDPM', 'cifar10-32') / 'hub' / 'ddpm-cifar10-32'}")
    recorded = read_record("DDPM", "cifar10-32")
    assert recorded.how == "import" and "hub/ddpm-cifar10-32/config.json" in recorded.files
    assert svcctl(capsys, "verify")[:2] == (0, f"DDPM cifar10-32: ok ({len(recorded.files)} files)\n")

    code, out, err = svcctl(capsys, "import", "DDPM", str(second))
    assert (code, out) == (1, "")
    assert err == (f"svcctl: DDPM cifar10-32: {second}: config.json: sha256 mismatch: got "
                   f"{err.split('got ')[1].split(',')[0]}, the first import recorded "
                   f"{recorded.files['hub/ddpm-cifar10-32/config.json']['sha256']}: pass --replace to replace the "
                   "cached variant (nothing kept)\n")
    assert read_record("DDPM", "cifar10-32") == recorded
    directory = variant_dir("DDPM", "cifar10-32")
    assert sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()) == sorted(
        ["record.json", *recorded.files])  # and no stage folder

    code, out, err = svcctl(capsys, "import", "DDPM", str(second), "--replace")
    assert code == 0, err
    replaced = read_record("DDPM", "cifar10-32")
    assert replaced.files["hub/ddpm-cifar10-32/config.json"] != recorded.files["hub/ddpm-cifar10-32/config.json"]
    assert svcctl(capsys, "verify")[0] == 0


def test_a_folder_of_other_files_is_not_a_silent_replacement(cache, capsys, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        folder.mkdir()
        write_google_ddpm(folder)
    (second / "scheduler_config.json").unlink()
    assert svcctl(capsys, "import", "DDPM", str(first))[0] == 0
    recorded = read_record("DDPM", "cifar10-32")
    code, out, err = svcctl(capsys, "import", "DDPM", str(second))
    assert (code, out) == (1, "")
    assert err == (f"svcctl: DDPM cifar10-32: {second}: other files than the cached DDPM cifar10-32 (1 differ, "
                   "first scheduler_config.json): pass --replace to replace it (nothing kept)\n")
    assert read_record("DDPM", "cifar10-32") == recorded


def test_a_refused_yolov8_import_names_the_users_file_and_leaves_nothing(cache, capsys, tmp_path):
    """A user's best.pt holding a YOLOv8s network, imported as the default yolov8n: refused in one line that
    names best.pt (not the cache's yolov8n.pt), and neither the copy nor its conversion stays in the cache."""
    best = tmp_path / "runs" / "best.pt"
    best.parent.mkdir()
    torch.manual_seed(2)
    save_checkpoint(best, build_network("s"), "s")
    code, out, err = svcctl(capsys, "import", "YOLOV8", str(best))
    assert (code, out) == (1, "")
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"svcctl: YOLOV8 yolov8n: {best}: does not load as YOLOV8 yolov8n: WeightsError: "
                          f"weights file {best}: tensor "), err
    assert "the architecture expects" in err and "the file name says" not in err and str(cache) not in err
    assert everything_under(cache) == []


def test_a_yolov8_file_that_is_no_checkpoint_leaves_nothing(cache, capsys, tmp_path):
    src = tmp_path / "yolov8n.pt"
    src.write_bytes(b"\x00" * 100_000)
    code, out, err = svcctl(capsys, "import", "YOLOV8", str(src))
    assert (code, out) == (1, "")
    assert err.startswith(f"svcctl: YOLOV8 yolov8n: {src}: converter 'ultralytics' failed: ") and str(cache) not in err
    assert everything_under(cache) == []


def test_verify_reports_stray_files(cache, capsys, tmp_path):
    folder = tmp_path / "ddpm"
    folder.mkdir()
    write_google_ddpm(folder)
    assert svcctl(capsys, "import", "DDPM", str(folder))[0] == 0
    directory = variant_dir("DDPM", "cifar10-32")
    (directory / "yolov8n.pt").write_bytes(b"left behind")
    (directory / "hub" / "extra.bin").write_bytes(b"x")
    (directory / "resume.part").write_bytes(b"a download to resume")  # kept on purpose: not stray
    orphan = variant_dir("YOLOV8", "yolov8n")
    orphan.mkdir(parents=True)
    (orphan / "yolov8n.pt").write_bytes(b"no record")
    code, out, err = svcctl(capsys, "verify")
    assert code == 1
    assert err.splitlines() == [
        f"svcctl: DDPM cifar10-32: {directory / 'yolov8n.pt'}: stray file (not in its record)",
        f"svcctl: DDPM cifar10-32: {directory / 'hub' / 'extra.bin'}: stray file (not in its record)",
        f"svcctl: YOLOV8 yolov8n: {orphan / 'yolov8n.pt'}: stray file (no record.json: not a cached variant)",
    ]


def test_an_import_into_a_read_only_cache_names_the_cache_not_the_file(capsys, monkeypatch, tmp_path):
    """The cache cannot take the copy (a read-only file system, root included): the line names the cache's
    folder the copy was to go to, not the user's file, and the cached variant stays."""
    first, second = tmp_path / "first" / "yolov8n.pt", tmp_path / "second" / "yolov8n.pt"
    for seed, path in ((11, first), (12, second)):
        path.parent.mkdir()
        torch.manual_seed(seed)
        save_checkpoint(path, build_network("n"), "n")
    with small_disk(tmp_path / "disk", 40 * 1024 * 1024) as disk:
        monkeypatch.setenv("SERVICE_WEIGHTS_DIR", str(disk / "cache"))
        assert svcctl(capsys, "import", "YOLOV8", str(first))[0] == 0
        recorded = read_record("YOLOV8", "yolov8n")
        before = everything_under(disk)
        read_only(disk)
        directory = variant_dir("YOLOV8", "yolov8n")
        assert svcctl(capsys, "import", "YOLOV8", str(second), "--replace") == (
            1, "", f"svcctl: YOLOV8 yolov8n: the weights cache cannot hold it: {directory / 'new.part'}: "
            "Read-only file system (nothing kept)\n")
        assert everything_under(disk) == before and read_record("YOLOV8", "yolov8n") == recorded


def without_file_permission_override(argv: list[str]) -> list[str]:
    """``argv`` run so that file modes bind: as root (CI), under setpriv without CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH; as anyone else, as it is."""
    import os
    import shutil

    if os.geteuid() != 0:
        return argv
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.fail("as root this test needs setpriv (util-linux) to run svcctl without CAP_DAC_OVERRIDE")
    return [setpriv, "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search", "--", *argv]


def test_a_fifo_in_an_imported_folder_is_refused_in_one_line_not_waited_on(cache, capsys, tmp_path):
    """A weights probe: a FIFO among a folder's files (one a pull would fetch, ``*.json``) blocked the import for
    ever, opened for reading with no writer; it is named as not a regular file, and nothing is kept."""
    import os

    folder = tmp_path / "ddpm"
    folder.mkdir()
    write_google_ddpm(folder)
    os.mkfifo(folder / "fifo.json")
    code, out, err = svcctl(capsys, "import", "DDPM", str(folder))
    assert (code, out) == (1, "")
    assert err == (f"svcctl: DDPM cifar10-32: {folder / 'fifo.json'}: not a regular file (a FIFO, a socket or a "
                   "device) (nothing kept)\n")
    assert everything_under(cache) == []
    (folder / "fifo.json").unlink()  # a socket: its open failed "No such device or address"
    import socket

    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(folder / "socket.json"))
        code, out, err = svcctl(capsys, "import", "DDPM", str(folder))
    assert (code, err) == (1, f"svcctl: DDPM cifar10-32: {folder / 'socket.json'}: not a regular file (a FIFO, a "
                              "socket or a device) (nothing kept)\n")
    # A single-file model given a FIFO was told its variant "is one file ..., not a folder", then that its variant
    # "is one file (...), not a regular file", as if the variant were the FIFO (a regression probe).
    os.mkfifo(tmp_path / "weights.pth")
    code, out, err = svcctl(capsys, "import", "MOBILENETV2", str(tmp_path / "weights.pth"))
    assert code == 1 and err.endswith(f"{tmp_path / 'weights.pth'}: not a regular file (a FIFO, a socket or a "
                                      "device)\n"), err
    assert everything_under(cache) == []


@pytest.mark.parametrize("unreadable", ["config.json", "images"])
def test_an_unreadable_file_in_an_imported_folder_is_named_in_one_line(cache, tmp_path, unreadable):
    """A file (or folder) of the user's that cannot be read: one line naming it and the cause (not a list of
    (source, staging copy, reason) tuples), and nothing in the cache."""
    import subprocess
    import sys

    from tests.support.processes import REPO, child_env

    folder = tmp_path / "ddpm"
    folder.mkdir()
    write_google_ddpm(folder)
    (folder / unreadable).chmod(0)
    try:
        done = subprocess.run(without_file_permission_override(
            [sys.executable, "-m", "svc.cli", "weights", "import", "DDPM", str(folder)]),
            env=child_env({"SERVICE_WEIGHTS_DIR": str(cache)}), cwd=REPO, capture_output=True, text=True,
            timeout=300)
    finally:
        (folder / unreadable).chmod(0o755)
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    assert done.stderr == f"svcctl: DDPM cifar10-32: {folder / unreadable}: Permission denied (nothing kept)\n"
    assert everything_under(cache) == []
