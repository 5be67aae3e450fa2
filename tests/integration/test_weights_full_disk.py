"""``svcctl weights pull|import`` on a weights cache that fills up: one line naming the cache, the cache as it was.

The cache is a real tmpfs (``tests.support.small_disk``) filled so that
only some of what a YOLOV8 pull or import writes fits: the ``.pt`` and its
conversion but not ``record.json``, or the ``.pt`` but not its conversion.
The ``.pt`` files are ultralytics-style checkpoints written by
``tests.support.fake_ultralytics``; a pull fetches one from
``tests.support.weight_source.FakeSource`` under its official URL.
"""

from __future__ import annotations

import errno
import os

import pytest
import torch

from models.yolov8 import yolov8
from models.yolov8_net import build_network
from svc.cli import commands as cli
from svc.weightstore.cache import read_record, variant_dir
from tests.support.fake_ultralytics import save_checkpoint
from tests.support.small_disk import BLOCK, blocks, fill_leaving, read_only, small_disk
from tests.support.weight_source import FakeSource

URL = "https://github.com/ultralytics/assets/releases/download/v8.1.0/yolov8n.pt"


@pytest.fixture
def disk(monkeypatch, tmp_path):
    """A 40 MB tmpfs holding the cache (``<disk>/cache``); a fake source serves nothing until told to."""
    with small_disk(tmp_path / "disk", 40 * 1024 * 1024) as mounted:
        monkeypatch.setenv("SERVICE_WEIGHTS_DIR", str(mounted / "cache"))
        source = FakeSource()
        monkeypatch.setenv("SERVICE_WEIGHTS_MIRROR", source.mirror)
        try:
            yield mounted, source
        finally:
            source.close()


def checkpoint(tmp_path, seed: int) -> tuple[os.PathLike, int, int]:
    """A yolov8n.pt of a seeded network (not on the small disk), its size and its conversion's."""
    folder = tmp_path / f"seed{seed}"
    path = folder / "yolov8n.pt"
    folder.mkdir()
    torch.manual_seed(seed)
    save_checkpoint(path, build_network("n"), "n")
    converted = folder / yolov8.convert("ultralytics", str(path), str(folder))
    return path, path.stat().st_size, converted.stat().st_size


def svcctl(capsys, *args: str) -> tuple[int, str, list[str]]:
    """Exit status, stdout and the ``svcctl:`` lines of stderr (a pull's plan and progress left out)."""
    code = cli.main(["weights", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, [line for line in err.splitlines() if line.startswith("svcctl:")]


def contents(root) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (folders by their files)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def store(capsys, how: str, path) -> tuple[int, str, list[str]]:
    if how == "pull":
        return svcctl(capsys, "pull", "YOLOV8", "--accept-licence", "AGPL-3.0")
    return svcctl(capsys, "import", "YOLOV8", str(path), "--replace")


@pytest.mark.parametrize("how", ["pull", "import"])
@pytest.mark.parametrize("fails_at", ["record", "conversion"])
def test_a_full_disk_is_one_line_naming_the_cache_and_leaves_nothing(disk, capsys, tmp_path, how, fails_at):
    mounted, source = disk
    path, size, converted = checkpoint(tmp_path, 11)
    source.serve(URL, path.read_bytes())
    fill_leaving(mounted, blocks(size, converted) if fails_at == "record" else blocks(size))
    directory = variant_dir("YOLOV8", "yolov8n")
    code, out, lines = store(capsys, how, path)
    assert (code, out) == (1, "")
    failed = directory / "record.json.tmp" if fails_at == "record" else directory / "new.part"
    assert lines == [f"svcctl: YOLOV8 yolov8n: the weights cache cannot hold it: {failed}: No space left on device "
                     "(nothing kept)"]
    assert contents(mounted) == {"filler": (mounted / "filler").read_bytes()}  # no folder, no file, no record
    assert svcctl(capsys, "verify")[:2] == (0, f"no cached variants in {mounted / 'cache'}\n")


@pytest.mark.parametrize("how", ["pull", "import"])
def test_a_full_disk_keeps_the_cached_variant_and_its_record(disk, capsys, tmp_path, how):
    """A variant cached before: a pull of it again (its files damaged) or an import of other content with
    --replace that fills the disk at the record keeps the cached files and record as they were."""
    mounted, source = disk
    first, _, _ = checkpoint(tmp_path, 11)
    assert svcctl(capsys, "import", "YOLOV8", str(first))[0] == 0
    directory = variant_dir("YOLOV8", "yolov8n")
    recorded = read_record("YOLOV8", "yolov8n")
    if how == "pull":  # the source has the same file; the cache's copy is damaged, so the pull fetches it again
        source.serve(URL, first.read_bytes())
        with open(directory / "yolov8n.pt", "r+b") as f:
            f.write(b"damaged")
        second, size, converted = first, first.stat().st_size, (directory / "yolov8n.safetensors").stat().st_size
    else:
        second, size, converted = checkpoint(tmp_path, 12)
    before = contents(directory)
    fill_leaving(mounted, blocks(size, converted))
    code, out, lines = store(capsys, how, second)
    assert (code, out) == (1, "")
    assert lines == [f"svcctl: YOLOV8 yolov8n: the weights cache cannot hold it: {directory / 'record.json.tmp'}: "
                     "No space left on device (nothing kept)"]
    assert contents(directory) == before
    assert read_record("YOLOV8", "yolov8n") == recorded
    if how == "import":
        assert svcctl(capsys, "verify")[:2] == (0, "YOLOV8 yolov8n: ok (2 files)\n")


def test_a_rename_that_fails_midway_puts_the_cached_variant_back(disk, capsys, tmp_path, monkeypatch):
    """A fault no small disk causes (the record's rename fails once the new files were renamed in): what was
    renamed is renamed back, so the cached variant stays whole."""
    mounted, _ = disk
    first, _, _ = checkpoint(tmp_path, 11)
    second, _, _ = checkpoint(tmp_path, 12)
    assert svcctl(capsys, "import", "YOLOV8", str(first))[0] == 0
    directory = variant_dir("YOLOV8", "yolov8n")
    before = contents(directory)
    replace = os.replace

    def failing(src, dst, *args, **kwargs):
        if str(dst).endswith("/record.json") and str(src).endswith(".tmp"):
            raise OSError(errno.EIO, "Input/output error")
        return replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", failing)
    code, out, lines = svcctl(capsys, "import", "YOLOV8", str(second), "--replace")
    monkeypatch.setattr(os, "replace", replace)
    assert (code, out) == (1, "")
    assert lines == [f"svcctl: YOLOV8 yolov8n: the weights cache cannot hold it: {directory / 'record.json'}: "
                     "Input/output error (nothing kept)"]
    assert contents(directory) == before
    assert svcctl(capsys, "verify")[:2] == (0, "YOLOV8 yolov8n: ok (2 files)\n")


def test_a_copy_that_fills_the_disk_names_the_cache_not_the_users_file(disk, capsys, tmp_path):
    """An import whose copy does not fit: the write to the cache failed, so the line names the cache's copy."""
    mounted, _ = disk
    path, size, _ = checkpoint(tmp_path, 11)
    fill_leaving(mounted, blocks(size) - 2 * BLOCK)
    directory = variant_dir("YOLOV8", "yolov8n")
    assert svcctl(capsys, "import", "YOLOV8", str(path)) == (1, "", [
        f"svcctl: YOLOV8 yolov8n: the weights cache cannot hold it: {directory / 'new.part' / 'yolov8n.pt'}: "
        "No space left on device (nothing kept)"])
    assert contents(mounted) == {"filler": (mounted / "filler").read_bytes()}


def test_a_full_disk_during_the_download_names_the_cache_not_the_url(disk, capsys, tmp_path):
    """It read "<URL>: [Errno 28] No space left on device": the source did nothing wrong."""
    mounted, source = disk
    path, size, _ = checkpoint(tmp_path, 11)
    source.serve(URL, path.read_bytes())
    fill_leaving(mounted, blocks(size // 2))
    code, out, lines = store(capsys, "pull", path)
    part = variant_dir("YOLOV8", "yolov8n") / "yolov8n.pt.part"
    assert (code, out) == (1, "")
    assert lines == [f"svcctl: YOLOV8 yolov8n: the weights cache cannot hold it: {part}: No space left on device"]
    (mounted / "filler").unlink()  # room again: the pull resumes the .part it kept and completes
    code, out, lines = store(capsys, "pull", path)
    assert (code, lines) == (0, []) and out.endswith(f"cached: {part.parent / 'yolov8n.safetensors'}\n"), out
    assert read_record("YOLOV8", "yolov8n").how == "pull"


def test_a_pull_into_a_read_only_cache_names_the_cache(disk, capsys, tmp_path):
    """The variant's folder already there (an earlier pull's, cut): the line named the URL, then the .part's
    PermissionError or EROFS, as if the download had failed."""
    mounted, source = disk
    path, _, _ = checkpoint(tmp_path, 11)
    source.serve(URL, path.read_bytes())
    directory = variant_dir("YOLOV8", "yolov8n")
    directory.mkdir(parents=True)
    read_only(mounted)
    code, out, lines = store(capsys, "pull", path)
    assert (code, out) == (1, "")
    assert len(lines) == 1 and lines[0].startswith("svcctl: YOLOV8 yolov8n: the weights cache cannot hold it: "), lines
    assert lines[0].endswith(": Read-only file system") and URL not in lines[0] and "mirror" not in lines[0], lines
