"""``svcctl weights``: pull, resume, checks, mirror, import, verify, list against a fake source on loopback.

Test hook: ``MobileNetV2Factory.variants`` is monkeypatched to fixture
variants whose URLs keep the official host and path shape
(``https://download.pytorch.org/models/mobilenet_v2-<prefix>.pth``), with a
real MobileNetV2 state dict whose SHA-256 starts with ``<prefix>`` (a pull is
load-checked, so what it fetches must build); every fetch goes through
``SERVICE_WEIGHTS_MIRROR`` to :class:`FakeSource`.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import json
import re
import socket

import pytest
import torch
from torchvision.models import mobilenet_v2

from models.mobilenetv2 import VARIANTS, MobileNetV2Factory, mobilenetv2
from svc.cli import commands as cli
from svc.config import ConfigError
from svc.model.api import model_config
from svc.model.weights import WeightsError
from svc.weightstore.cache import RecordError, read_record, variant_dir
from svc.weightstore.catalog import FileSource, Variant
from svc.weightstore.fetch import Progress, mirrored
from tests.support.weight_source import FakeSource


def state_dict_bytes(seed: int, n: int = 60_000) -> bytes:
    """A small real state dict (torch.save), about 4n bytes, that does not fit MobileNetV2 (one tensor)."""
    buf = io.BytesIO()
    torch.save({"features.weight": torch.randn(n, generator=torch.Generator().manual_seed(seed))}, buf)
    return buf.getvalue()


@functools.lru_cache(maxsize=2)
def mobilenet_body(seed: int = 3) -> bytes:
    """A real torchvision MobileNetV2 state dict (torch.save, about 14 MB): what a pull or an import must load."""
    torch.manual_seed(seed)
    buf = io.BytesIO()
    torch.save(mobilenet_v2(weights=None).state_dict(), buf)
    return buf.getvalue()


BODY = mobilenet_body(1)  # every pull is load-checked: what the fixture source serves must build
SHA = hashlib.sha256(BODY).hexdigest()
PREFIX = SHA[:8]
URL = f"https://download.pytorch.org/models/mobilenet_v2-{PREFIX}.pth"
FILENAME = URL.rsplit("/", 1)[1]
TOFU_URL = "https://example.org/weights/mobilenet_v2-unpublished.pth"
FULL_URL = "https://example.org/weights/mobilenet_v2-full.pth"

FIXTURE_VARIANTS = (
    Variant("FIXTURE_V2", FileSource(url=URL, hash_prefix=PREFIX, size=len(BODY)), license="BSD-3-Clause",
            model={"resize": 232}, default=True),
    Variant("TOFU", FileSource(url=TOFU_URL), license="BSD-3-Clause"),
    Variant("FULL", FileSource(url=FULL_URL, sha256=SHA), license="BSD-3-Clause"),
)


@pytest.fixture
def source(monkeypatch, tmp_path):
    fake = FakeSource()
    fake.serve(URL, BODY)
    monkeypatch.setenv("SERVICE_WEIGHTS_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SERVICE_WEIGHTS_MIRROR", fake.mirror)
    monkeypatch.setattr(MobileNetV2Factory, "variants", FIXTURE_VARIANTS)
    yield fake
    fake.close()


def svcctl(capsys, *args: str) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of ``svcctl weights ARGS``, stderr without a pull's plan (tested apart)."""
    code = cli.main(["weights", *args])
    out, err = capsys.readouterr()
    lines = err.splitlines(keepends=True)
    if args and args[0] == "pull" and lines and lines[0].startswith("Pull: "):
        lines = lines[1:]
        while lines and lines[0].startswith("  "):
            lines = lines[1:]
    return code, out, "".join(lines)


def cache_files(tmp_path) -> list[str]:
    root = tmp_path / "cache"
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_pull_downloads_through_the_mirror_with_progress_and_records(source, capsys, tmp_path):
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2")
    assert code == 0, err
    assert source.requests == [(f"/download.pytorch.org/models/{FILENAME}", None)]
    directory = tmp_path / "cache" / "MOBILENETV2" / "FIXTURE_V2"
    assert out == f"MOBILENETV2 FIXTURE_V2: cached: {directory / FILENAME}\n"
    # The progress bar: size, percent, rate and ETA, on stderr.
    last = err.strip().splitlines()[-1]
    size = f"{len(BODY) / 1e6:.1f} MB"
    assert re.fullmatch(rf"MOBILENETV2 FIXTURE_V2  {size} / {size} 100\.0%  [\d.]+ [kMG]?B/s  ETA 0s", last), err
    assert (directory / FILENAME).read_bytes() == BODY
    assert cache_files(tmp_path) == [f"MOBILENETV2/FIXTURE_V2/{FILENAME}", "MOBILENETV2/FIXTURE_V2/record.json"]
    record = json.loads((directory / "record.json").read_text())
    assert record == {"model": "MOBILENETV2", "variant": "FIXTURE_V2", "source": URL, "weights": FILENAME,
                      "files": {FILENAME: {"sha256": SHA, "size": len(BODY)}}, "how": "pull",
                      "pulled_at": record["pulled_at"]}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["pulled_at"])
    # Pulling again checks the cached file and fetches nothing.
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2")
    assert code == 0 and len(source.requests) == 1
    assert out == f"MOBILENETV2 FIXTURE_V2: already cached and verified: {directory / FILENAME}\n"


def test_a_cached_variant_is_read_once_by_the_plan_and_not_pulled_again(source, capsys, monkeypatch):
    """A regression probe: the plan read every cached file for its digests, and the pull then read them all again
    (6 GB read for a no-op pull of a 3 GB variant)."""
    from svc.weightstore import store

    assert svcctl(capsys, "pull", "MOBILENETV2")[0] == 0
    monkeypatch.setattr(store, "pull", lambda *a, **k: pytest.fail("a verified variant was pulled again"))
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2")
    assert (code, out) == (0, "MOBILENETV2 FIXTURE_V2: already cached and verified: "
                              f"{variant_dir('MOBILENETV2', 'FIXTURE_V2') / FILENAME}\n"), err


def test_a_variant_named_twice_is_planned_and_pulled_once(source, capsys):
    """A weights probe: ``pull YOLOV8 YOLOV8:yolov8n`` (the default variant, then by its name) planned it twice, its
    size counted twice in the total said before the pull."""
    code = cli.main(["weights", "pull", "MOBILENETV2", "MOBILENETV2:FIXTURE_V2"])
    out, err = capsys.readouterr()
    size = f"{len(BODY) / 1e6:.1f} MB"
    assert code == 0, err
    assert err.splitlines()[:2] == [f"Pull: 1 of 1 variant(s) to fetch, {size} in all; licences: BSD-3-Clause",
                                    f"  MOBILENETV2 FIXTURE_V2: {size}; licence BSD-3-Clause"]
    assert out == f"MOBILENETV2 FIXTURE_V2: cached: {variant_dir('MOBILENETV2', 'FIXTURE_V2') / FILENAME}\n"
    assert len(source.requests) == 1


def test_the_quick_start_counts_a_damaged_variant_as_not_cached(source, capsys):
    """A weights probe: a truncated cached file was "cached, nothing to pull" to the quick start, which served it,
    and the model failed its start; judged as its model server judges it, it is pulled or runs on demo."""
    from svc.cli.quickstart_weights import is_cached

    assert svcctl(capsys, "pull", "MOBILENETV2")[0] == 0
    assert is_cached("MOBILENETV2:FIXTURE_V2")
    path = variant_dir("MOBILENETV2", "FIXTURE_V2") / FILENAME
    path.write_bytes(path.read_bytes()[:1000])
    assert not is_cached("MOBILENETV2:FIXTURE_V2")
    assert not is_cached("MOBILENETV2:TOFU")


def test_mirror_replaces_scheme_and_host():
    env = {"SERVICE_WEIGHTS_MIRROR": "http://mirror.internal:8000/pytorch/"}
    assert mirrored("https://download.pytorch.org/models/a-1.pth", env) == \
        "http://mirror.internal:8000/pytorch/download.pytorch.org/models/a-1.pth"
    assert mirrored("https://download.pytorch.org/models/a-1.pth", {}) == "https://download.pytorch.org/models/a-1.pth"


def test_a_cut_download_resumes_with_range(source, capsys, tmp_path):
    path = FakeSource.path_of(URL)
    source.cut_after[path] = 100_000
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2")
    assert code == 1 and out == ""
    failures = [line for line in err.splitlines() if line.startswith("svcctl:")]
    assert failures == [f"svcctl: MOBILENETV2 FIXTURE_V2: {source.mirror}{path}: the connection closed after "
                        f"100000 of {len(BODY)} bytes"]
    # Only a .part is left: nothing that looks complete, no record.
    assert cache_files(tmp_path) == [f"MOBILENETV2/FIXTURE_V2/{FILENAME}.part"]
    assert read_record("MOBILENETV2", "FIXTURE_V2") is None
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2")
    assert code == 0, err
    assert source.requests == [(path, None), (path, "bytes=100000-")]
    assert (variant_dir("MOBILENETV2", "FIXTURE_V2") / FILENAME).read_bytes() == BODY
    assert cache_files(tmp_path) == [f"MOBILENETV2/FIXTURE_V2/{FILENAME}", "MOBILENETV2/FIXTURE_V2/record.json"]


def test_a_server_ignoring_range_restarts_the_file(source, capsys, tmp_path):
    part = variant_dir("MOBILENETV2", "FIXTURE_V2") / (FILENAME + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(b"x" * (len(BODY) + 10))  # longer than the file: 416, start over
    code, _, err = svcctl(capsys, "pull", "MOBILENETV2")
    assert code == 0, err
    assert [r for _, r in source.requests] == [f"bytes={len(BODY) + 10}-", None]
    assert (variant_dir("MOBILENETV2", "FIXTURE_V2") / FILENAME).read_bytes() == BODY


def test_checksum_mismatch_leaves_nothing(source, capsys, tmp_path):
    source.serve(URL, state_dict_bytes(2))  # not the file the name's hash prefix promises
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2")
    assert code == 1 and out == ""
    got = hashlib.sha256(state_dict_bytes(2)).hexdigest()
    failures = [line for line in err.splitlines() if line.startswith("svcctl:")]
    assert failures == [f"svcctl: MOBILENETV2 FIXTURE_V2: {source.mirror}{FakeSource.path_of(URL)}: invalid hash "
                        f'value (expected prefix "{PREFIX}", got "{got}") (nothing kept)']
    assert cache_files(tmp_path) == []


def test_a_resumed_download_that_fails_its_check_leaves_no_empty_folder(source, capsys, tmp_path):
    path = FakeSource.path_of(URL)
    source.cut_after[path] = 100_000
    assert svcctl(capsys, "pull", "MOBILENETV2")[0] == 1  # cut: its .part and folder are kept to resume
    source.serve(URL, state_dict_bytes(2))  # the rest does not complete the file the name promises
    source.cut_after.pop(path, None)
    code, _, err = svcctl(capsys, "pull", "MOBILENETV2")
    assert code == 1 and "invalid hash value" in err
    assert cache_files(tmp_path) == [] and list((tmp_path / "cache").iterdir()) == []


def test_full_published_sha256_is_checked(source, capsys, tmp_path):
    source.serve(FULL_URL, BODY + b"!")
    code, _, err = svcctl(capsys, "pull", "MOBILENETV2", "--variant", "FULL")
    assert code == 1 and f"sha256 mismatch: got {hashlib.sha256(BODY + b'!').hexdigest()}, the source publishes {SHA}" in err
    assert cache_files(tmp_path) == []
    source.serve(FULL_URL, BODY)
    assert svcctl(capsys, "pull", "MOBILENETV2", "--variant", "FULL")[0] == 0


def test_offline_is_one_line_naming_the_url(source, capsys, monkeypatch, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("SERVICE_WEIGHTS_MIRROR", closed)
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2")
    assert code == 1 and out == ""
    assert err.splitlines() == [f"svcctl: MOBILENETV2 FIXTURE_V2: {closed}/download.pytorch.org/models/{FILENAME}: "
                                "connection refused"]
    assert read_record("MOBILENETV2", "FIXTURE_V2") is None


def test_redirects_are_followed(source, capsys):
    path = FakeSource.path_of(URL)
    source.files["/elsewhere/file.pth"] = source.files.pop(path)
    source.redirects[path] = source.mirror + "/elsewhere/file.pth"
    code, _, err = svcctl(capsys, "pull", "MOBILENETV2")
    assert code == 0, err
    assert [p for p, _ in source.requests] == [path, "/elsewhere/file.pth"]


def test_no_published_checksum_records_the_first_pull_and_checks_later_ones(source, capsys, tmp_path):
    source.serve(TOFU_URL, BODY)
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2", "--variant", "TOFU")
    assert code == 0, err
    assert out.splitlines()[0] == (f"MOBILENETV2 TOFU: {TOFU_URL} publishes no checksum: recorded sha256 {SHA} "
                                   "(later pulls, imports and verify check against it)")
    assert read_record("MOBILENETV2", "TOFU").files == {"mobilenet_v2-unpublished.pth": {"sha256": SHA, "size": len(BODY)}}
    # The source changes and the cached file is damaged: the new pull is checked against the record.
    other = state_dict_bytes(3)
    source.serve(TOFU_URL, other)
    (variant_dir("MOBILENETV2", "TOFU") / "mobilenet_v2-unpublished.pth").write_bytes(b"damaged")
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2", "--variant", "TOFU")
    assert code == 1 and out == ""
    assert f"sha256 mismatch: got {hashlib.sha256(other).hexdigest()}, the first pull recorded {SHA}" in err
    # The record stays, and with it the digest: the same pull again is refused again (it was recorded
    # the second time), and verify says the cached file is damaged.
    assert read_record("MOBILENETV2", "TOFU").files["mobilenet_v2-unpublished.pth"]["sha256"] == SHA
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2", "--variant", "TOFU")
    assert code == 1 and f"the first pull recorded {SHA}" in err
    code, out, err = svcctl(capsys, "verify")
    assert code == 1 and "mobilenet_v2-unpublished.pth: 7 bytes, the record says" in err
    # The source comes back as it was: the pull replaces the damaged file.
    source.serve(TOFU_URL, BODY)
    assert svcctl(capsys, "pull", "MOBILENETV2", "--variant", "TOFU")[0] == 0
    assert svcctl(capsys, "verify")[0] == 0


def test_a_digest_recorded_by_an_import_is_named_so(source, capsys, tmp_path):
    mine, other = tmp_path / "mine.pth", tmp_path / "other.pth"
    mine.write_bytes(BODY)
    other.write_bytes(state_dict_bytes(3))
    assert svcctl(capsys, "import", "MOBILENETV2", str(mine), "--variant", "TOFU")[0] == 0
    code, out, err = svcctl(capsys, "import", "MOBILENETV2", str(other), "--variant", "TOFU")
    assert (code, out) == (1, "")
    got = hashlib.sha256(other.read_bytes()).hexdigest()
    assert err == (f"svcctl: MOBILENETV2 TOFU: {other}: sha256 mismatch: got {got}, the first import recorded {SHA}: "
                   "pass --replace to replace the cached variant (nothing kept)\n")


@pytest.mark.parametrize("action, part, line", [
    ("pull", True, "interrupted (a partial download is kept as .part: pull again to resume)"),
    # before any byte came (the licence question, the connection): a CLI probe read of a .part that was not there
    ("pull", False, "interrupted (nothing fetched)"),
    ("import", False, "interrupted (nothing kept)")])
def test_ctrl_c_says_what_is_left_for_the_command_it_stopped(source, capsys, monkeypatch, tmp_path, action, part,
                                                             line):
    import svc.weightstore.store

    def stop(*args, **kwargs):
        if part:  # pull(factory, variant) cut after its first bytes
            folder = variant_dir(args[0].catalog_id, args[1].name)
            folder.mkdir(parents=True)
            (folder / "weights.pth.part").write_bytes(BODY[:10])
        raise KeyboardInterrupt

    monkeypatch.setattr(svc.weightstore.store, "pull" if action == "pull" else "import_path", stop)
    mine = tmp_path / "mine.pth"
    mine.write_bytes(BODY)
    code, out, err = svcctl(capsys, action, "MOBILENETV2", *([str(mine)] if action == "import" else []))
    assert (code, out, err.splitlines()[-1]) == (130, "", f"svcctl: {line}")


@pytest.mark.parametrize("mirror", ["notaurl", "ftp://mirror.internal/", "http://"])
def test_a_mirror_that_is_not_an_http_url_is_one_line_exit_2_before_the_plan(source, capsys, monkeypatch, mirror):
    """It printed the pull's plan and licences, then failed each file's download, exit 1: a CLI probe."""
    monkeypatch.setenv("SERVICE_WEIGHTS_MIRROR", mirror)
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2")
    assert (code, out, err) == (2, "", f"svcctl: $SERVICE_WEIGHTS_MIRROR {mirror!r} is not an http:// or https:// URL "
                                       "with a host\n")


def test_a_pull_that_fails_offline_keeps_the_record_and_the_plan_says_it_fetches(source, capsys, monkeypatch):
    source.serve(TOFU_URL, BODY)
    assert svcctl(capsys, "pull", "MOBILENETV2", "--variant", "TOFU")[0] == 0
    recorded = read_record("MOBILENETV2", "TOFU")
    (variant_dir("MOBILENETV2", "TOFU") / "mobilenet_v2-unpublished.pth").write_bytes(b"damaged")
    monkeypatch.setenv("SERVICE_WEIGHTS_MIRROR", "http://127.0.0.1:9")  # nothing listens: connection refused
    code = cli.main(["weights", "pull", "MOBILENETV2", "--variant", "TOFU"])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err.splitlines()[:2] == ["Pull: 1 of 1 variant(s) to fetch, 0.0 MB in all, plus 1 of unpublished size; "
                                    "licences: BSD-3-Clause", "  MOBILENETV2 TOFU: size unpublished; licence BSD-3-Clause"]
    assert err.splitlines()[-1].endswith("connection refused")
    assert read_record("MOBILENETV2", "TOFU") == recorded


def test_an_unusable_cache_is_one_line_that_names_the_cache_not_the_users_file(source, capsys, tmp_path,
                                                                                 monkeypatch):
    cache = tmp_path / "cache-file"
    cache.write_text("not a folder")
    monkeypatch.setenv("SERVICE_WEIGHTS_DIR", str(cache))
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2")
    assert (code, out) == (1, "")
    assert err == (f"svcctl: MOBILENETV2 FIXTURE_V2: the weights cache cannot hold it: "
                   f"{cache / 'MOBILENETV2' / 'FIXTURE_V2'}: Not a directory\n")
    mine = tmp_path / "mine.pth"
    mine.write_bytes(BODY)
    code, out, err = svcctl(capsys, "import", "MOBILENETV2", str(mine))
    assert (code, out) == (1, "")
    assert err == (f"svcctl: MOBILENETV2 FIXTURE_V2: the weights cache cannot hold it: "
                   f"{cache / 'MOBILENETV2' / 'FIXTURE_V2'}: Not a directory\n")
    code, out, err = svcctl(capsys, "verify")
    assert (code, out, err) == (1, "", f"svcctl: the weights cache {cache} is not a directory (SERVICE_WEIGHTS_DIR)\n")
    assert cache.read_text() == "not a folder"


def test_a_record_in_another_variants_folder_is_refused_not_verified_ok(source, capsys):
    import shutil

    source.serve(TOFU_URL, BODY)
    assert svcctl(capsys, "pull", "MOBILENETV2", "--variant", "TOFU")[0] == 0
    copy = variant_dir("MOBILENETV2", "FULL")
    shutil.copytree(variant_dir("MOBILENETV2", "TOFU"), copy)
    (copy / "mobilenet_v2-unpublished.pth").write_bytes(b"damaged")
    code, out, err = svcctl(capsys, "verify")
    assert code == 1 and out == "MOBILENETV2 TOFU: ok (1 files)\n"
    assert f"{copy / 'record.json'}: not a weights record (ValueError: it names MOBILENETV2 TOFU, not its " \
           "folder's MOBILENETV2 FULL)" in err
    with pytest.raises(RecordError):
        read_record("MOBILENETV2", "FULL")


def test_exit_status_counts_every_failure(source, capsys):
    source.serve(FULL_URL, BODY)
    code, out, err = svcctl(capsys, "pull", "--all", "--variant", "FULL")
    assert code == 0 and "MOBILENETV2 FULL: cached" in out
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2", "--variant", "TOFU")  # not served: 404
    assert code == 1
    assert err.splitlines() == [f"svcctl: MOBILENETV2 TOFU: {source.mirror}/example.org/weights/"
                                "mobilenet_v2-unpublished.pth: HTTP 404 Not Found"]
    assert svcctl(capsys, "pull", "MOBILENETV2", "--variant", "NOPE")[0] == 2
    assert svcctl(capsys, "pull", "NOSUCHMODEL")[0] == 2
    assert svcctl(capsys, "pull")[0] == 2


def real_variant(monkeypatch, source) -> tuple[Variant, str]:
    """A variant REAL served with a real MobileNetV2 state dict under a torch.hub name; (variant, file name)."""
    body = mobilenet_body()
    prefix = hashlib.sha256(body).hexdigest()[:8]
    url = f"https://download.pytorch.org/models/mobilenet_v2-{prefix}.pth"
    source.serve(url, body)
    variant = Variant("REAL", FileSource(url=url, hash_prefix=prefix, size=len(body)), license="BSD-3-Clause")
    monkeypatch.setattr(MobileNetV2Factory, "variants", (*FIXTURE_VARIANTS, variant))
    return variant, url.rsplit("/", 1)[1]


def test_import_stores_exactly_what_a_pull_stores(source, capsys, tmp_path, monkeypatch):
    _, filename = real_variant(monkeypatch, source)
    assert svcctl(capsys, "pull", "MOBILENETV2:REAL")[0] == 0
    pulled = read_record("MOBILENETV2", "REAL")
    expected_files = [f"MOBILENETV2/REAL/{filename}", "MOBILENETV2/REAL/record.json"]
    copied = tmp_path / "usb" / "whatever-name.pth"
    copied.parent.mkdir()
    copied.write_bytes(state_dict_bytes(2))
    code, out, err = svcctl(capsys, "import", "MOBILENETV2", str(copied), "--variant", "REAL")
    assert code == 1 and "invalid hash value" in err and out == ""
    assert read_record("MOBILENETV2", "REAL") == pulled  # a failed import changes nothing
    assert cache_files(tmp_path) == expected_files
    copied.write_bytes(mobilenet_body())
    code, out, err = svcctl(capsys, "import", "MOBILENETV2", str(copied), "--variant", "REAL")
    assert code == 0, err
    directory = variant_dir("MOBILENETV2", "REAL")
    assert out == f"MOBILENETV2 REAL: imported: {directory / filename}\n"
    imported = read_record("MOBILENETV2", "REAL")
    assert imported.how == "import"
    assert (imported.source, imported.weights, imported.files) == (pulled.source, pulled.weights, pulled.files)
    assert cache_files(tmp_path) == expected_files
    assert svcctl(capsys, "import", "MOBILENETV2", str(tmp_path / "nothing"))[0] == 1
    assert svcctl(capsys, "import", "MOBILENETV2", str(copied.parent))[0] == 1  # a folder for a file variant
    assert cache_files(tmp_path) == expected_files


def test_verify_finds_a_tampered_file(source, capsys, tmp_path):
    assert svcctl(capsys, "verify") == (0, f"no cached variants in {tmp_path / 'cache'}\n", "")
    assert svcctl(capsys, "pull", "MOBILENETV2")[0] == 0
    assert svcctl(capsys, "verify") == (0, "MOBILENETV2 FIXTURE_V2: ok (1 files)\n", "")
    path = variant_dir("MOBILENETV2", "FIXTURE_V2") / FILENAME
    tampered = bytearray(BODY)
    tampered[-100] ^= 1
    path.write_bytes(bytes(tampered))
    code, out, err = svcctl(capsys, "verify")
    assert code == 1 and out == ""
    assert err.splitlines() == [f"svcctl: MOBILENETV2 FIXTURE_V2: {path}: sha256 "
                                f"{hashlib.sha256(tampered).hexdigest()}, the record says {SHA}"]
    # A pull repairs it.
    assert svcctl(capsys, "pull", "MOBILENETV2")[0] == 0
    assert svcctl(capsys, "verify")[0] == 0
    path.unlink()
    code, _, err = svcctl(capsys, "verify")
    assert code == 1 and err == f"svcctl: MOBILENETV2 FIXTURE_V2: {path}: missing\n"
    # A stray file named with a newline and a terminal escape: one line, escaped (it cleared the screen).
    assert svcctl(capsys, "pull", "MOBILENETV2")[0] == 0
    stray = path.parent / "x\ny\x1b[2J"
    stray.write_bytes(b"?")
    code, _, err = svcctl(capsys, "verify")
    assert code == 1 and len(err.splitlines()) == 1 and "\x1b" not in err and "x\\ny\\x1b[2J" in err, err


def test_list_json_says_what_is_cached(source, capsys):
    code, out, _ = svcctl(capsys, "list", "--json")
    rows = {(r["model"], r["variant"]): r for r in json.loads(out)}
    row = rows["MOBILENETV2", "FIXTURE_V2"]
    assert code == 0 and row["cached"] is False and row["path"] is None
    assert (row["source"], row["hash_prefix"], row["license"], row["default"], row["size"]) == (
        URL, PREFIX, "BSD-3-Clause", True, len(BODY))
    assert row["model_keys"] == {"resize": 232}
    assert svcctl(capsys, "pull", "MOBILENETV2")[0] == 0
    row = {(r["model"], r["variant"]): r for r in json.loads(svcctl(capsys, "list", "--json")[1])}["MOBILENETV2", "FIXTURE_V2"]
    assert row["cached"] is True and row["how"] == "pull" and row["recorded_sha256"] == SHA
    code, out, _ = svcctl(capsys, "list")
    line = next(x for x in out.splitlines() if "FIXTURE_V2" in x)
    assert line.split() == ["MOBILENETV2", "FIXTURE_V2", "(default)", f"{len(BODY) / 1e6:.1f}", "MB",
                            f"prefix:{PREFIX}", "BSD-3-Clause", "yes", URL]


def test_progress_line_has_size_rate_and_eta():
    now = [0.0]
    stream = io.StringIO()
    progress = Progress("M V", stream, interval=1.0, clock=lambda: now[0])
    progress.begin(10_000_000, already=2_000_000)
    now[0] = 2.0
    progress.update(4_000_000)
    assert stream.getvalue() == "M V  4.0 MB / 10.0 MB  40.0%  1.0 MB/s  ETA 6s\n"
    now[0] = 2.5
    progress.update(5_000_000)  # within the interval: not drawn
    progress.finish()
    assert stream.getvalue().splitlines()[-1] == "M V  5.0 MB / 10.0 MB  50.0%  1.2 MB/s  ETA 4s"


# -- the catalog and serving configuration -------------------------------------------------


def test_mobilenetv2_variants_are_torchvisions():
    from torch.hub import HASH_REGEX
    from torchvision.models import MobileNet_V2_Weights

    for variant in VARIANTS:
        weights = MobileNet_V2_Weights[variant.name]
        assert variant.source.url == weights.url
        assert variant.source.hash_prefix == HASH_REGEX.search(variant.source.filename).group(1)
        assert variant.model == {"resize": weights.transforms().resize_size[0]}
        assert weights.transforms().crop_size == [224]
    assert [v.name for v in VARIANTS if v.default] == ["IMAGENET1K_V2"]
    assert [v.model["resize"] for v in VARIANTS] == [256, 232]


def test_every_catalog_variant_has_a_size_for_the_pulls_plan():
    """The plan's total counts every variant: none is left "of unpublished size" (YOLOV8's were)."""
    from svc.model.api import factories
    from svc.weightstore.catalog import variants_of
    from svc.weightstore.licences import plan_lines

    chosen = [(f, v, False) for f in factories().values() for v in variants_of(f)]
    assert len(chosen) >= 16 and all(v.size for _, v, _ in chosen)
    head, *lines = plan_lines(chosen)
    assert "unpublished" not in head and not any("unpublished" in line for line in lines)
    yolo = {line.split(":")[0].strip(): line for line in lines if line.lstrip().startswith("YOLOV8")}
    assert yolo["YOLOV8 yolov8n"].startswith("  YOLOV8 yolov8n: 6.5 MB; licence AGPL-3.0")
    assert yolo["YOLOV8 yolov8x"].startswith("  YOLOV8 yolov8x: 139.1 MB;")


def pulled(tmp_path, monkeypatch, name: str = "IMAGENET1K_V2"):
    """A fake cache entry for a real variant name (as a pull leaves it)."""
    from svc.weightstore.cache import Record, write_record

    monkeypatch.setenv("SERVICE_WEIGHTS_DIR", str(tmp_path / "cache"))
    directory = variant_dir("MOBILENETV2", name)
    directory.mkdir(parents=True)
    (directory / "w.pth").write_bytes(BODY)
    write_record(Record("MOBILENETV2", name, "u", "w.pth", {"w.pth": {"sha256": SHA, "size": len(BODY)}}))
    return directory / "w.pth"


def test_pretrained_config_resolves_from_the_cache(tmp_path, monkeypatch):
    path = pulled(tmp_path, monkeypatch)
    config = model_config(mobilenetv2, {"weights": "pretrained"}, "m.toml")
    assert (config["weights"], config["resize"], config["version"]) == (str(path), 232, "IMAGENET1K_V2")
    config = model_config(mobilenetv2, {"weights": "pretrained:IMAGENET1K_V2", "resize": 232, "version": "mine"},
                          "m.toml")
    assert (config["resize"], config["version"]) == (232, "mine")
    with pytest.raises(ConfigError) as e:
        model_config(mobilenetv2, {"weights": "pretrained:IMAGENET1K_V2", "resize": 256}, "m.toml")
    assert str(e.value) == ("m.toml: model.resize: 256 conflicts with weights = 'pretrained:IMAGENET1K_V2': "
                            "the variant IMAGENET1K_V2 implies resize = 232")
    with pytest.raises(ConfigError) as e:
        model_config(mobilenetv2, {"weights": "pretrained:V3"}, "m.toml")
    assert str(e.value) == ("m.toml: model.weights: MOBILENETV2 has no pretrained variant 'V3'; "
                            "known: IMAGENET1K_V1, IMAGENET1K_V2")
    with pytest.raises(ConfigError, match="model.resize: 100 is less than the minimum of 224"):
        model_config(mobilenetv2, {"resize": 100}, "m.toml")
    assert model_config(mobilenetv2, {}, "m.toml")["resize"] == 256


def test_a_variant_not_in_the_cache_names_the_file_and_the_command(tmp_path, monkeypatch):
    pulled(tmp_path, monkeypatch)
    directory = tmp_path / "cache" / "MOBILENETV2" / "IMAGENET1K_V1"
    with pytest.raises(WeightsError) as e:
        model_config(mobilenetv2, {"weights": "pretrained:IMAGENET1K_V1"}, "m.toml")
    assert str(e.value) == (f"weights 'pretrained:IMAGENET1K_V1' (from m.toml): {directory}/mobilenet_v2-b0353104.pth "
                            "is missing: MOBILENETV2 variant IMAGENET1K_V1 is not in the weights cache; run "
                            "`svcctl weights pull MOBILENETV2 --variant IMAGENET1K_V1` first")
    path = variant_dir("MOBILENETV2", "IMAGENET1K_V2") / "w.pth"
    path.write_bytes(BODY[:100])
    with pytest.raises(WeightsError) as e:
        model_config(mobilenetv2, {"weights": "pretrained"}, "m.toml")
    assert str(e.value) == (f"weights 'pretrained' (from m.toml): {path}: 100 bytes, record.json says {len(BODY)}: "
                            "MOBILENETV2 variant IMAGENET1K_V2 is damaged; run `svcctl weights pull MOBILENETV2` again")


def test_two_pulls_of_one_variant_do_not_mix(source, capsys):
    import fcntl
    import os

    directory = variant_dir("MOBILENETV2", "FIXTURE_V2")
    directory.mkdir(parents=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another pull holds the variant
        code, out, err = svcctl(capsys, "pull", "MOBILENETV2")
        assert code == 1 and err == (f"svcctl: MOBILENETV2 FIXTURE_V2: {URL}: another pull or import of this variant "
                                     f"is running ({directory})\n")
        assert source.requests == []
    finally:
        os.close(fd)
    assert svcctl(capsys, "pull", "MOBILENETV2")[0] == 0


def test_an_unreadable_record_is_reported_and_replaced(source, capsys):
    assert svcctl(capsys, "pull", "MOBILENETV2")[0] == 0
    record = variant_dir("MOBILENETV2", "FIXTURE_V2") / "record.json"
    record.write_text("{not json")
    code, out, err = svcctl(capsys, "verify")
    assert code == 1 and len(err.splitlines()) == 1
    assert err.startswith(f"svcctl: {record}: not a weights record (JSONDecodeError: ")
    row = {(r["model"], r["variant"]): r for r in json.loads(svcctl(capsys, "list", "--json")[1])}["MOBILENETV2", "FIXTURE_V2"]
    assert row["cached"] is False
    with pytest.raises(WeightsError, match=r"not a weights record .*: run `svcctl weights pull MOBILENETV2` again$"):
        model_config(mobilenetv2, {"weights": "pretrained"}, "m.toml")
    assert svcctl(capsys, "pull", "MOBILENETV2")[0] == 0
    assert svcctl(capsys, "verify")[0] == 0


def test_a_converted_variant_records_the_download_and_what_build_loads(source, capsys, monkeypatch):
    calls = []

    def convert(self, name: str, src: str, dst: str) -> str:
        """A real conversion (torch file to safetensors): the pull builds the model on what it returns."""
        import os

        from safetensors.torch import save_file

        calls.append((name, src, dst))
        os.makedirs(f"{dst}/converted")
        save_file(torch.load(src, weights_only=True), f"{dst}/converted/model.safetensors")
        return "converted/model.safetensors"

    monkeypatch.setattr(MobileNetV2Factory, "convert", convert, raising=False)
    variant = Variant("CONVERTED", FileSource(url=URL, hash_prefix=PREFIX, convert="fixture"), license="MIT")
    monkeypatch.setattr(MobileNetV2Factory, "variants", (*FIXTURE_VARIANTS, variant))
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2", "--variant", "CONVERTED")
    assert code == 0, err
    directory = variant_dir("MOBILENETV2", "CONVERTED")
    # Converted in a stage folder, moved into place once done.
    assert calls == [("fixture", str(directory / "new.part" / FILENAME), str(directory / "new.part"))]
    record = read_record("MOBILENETV2", "CONVERTED")
    converted = (directory / "converted" / "model.safetensors").read_bytes()
    assert record.weights == "converted/model.safetensors"
    assert record.files == {FILENAME: {"sha256": SHA, "size": len(BODY)},
                            "converted/model.safetensors": {"sha256": hashlib.sha256(converted).hexdigest(),
                                                            "size": len(converted)}}
    assert out.endswith(f"cached: {directory / 'converted' / 'model.safetensors'}\n")
    assert svcctl(capsys, "verify")[0] == 0


def test_hub_variants_import_a_folder_and_a_failed_hub_pull_is_one_line(source, capsys, monkeypatch, tmp_path):
    from tests.integration.test_weights_hub import write_google_ddpm

    monkeypatch.setenv("HF_ENDPOINT", source.mirror)  # answers 404 to every hub request
    folder = tmp_path / "repo"
    folder.mkdir()
    write_google_ddpm(folder)  # a real (tiny) DDPM: an import must build
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("x")
    code, out, err = svcctl(capsys, "import", "DDPM", str(folder))
    assert code == 0, err
    record = read_record("DDPM", "cifar10-32")
    # What a pull fetches and where it puts it: no README.md, images/ or .bin twin; not .git.
    expected = [f"hub/ddpm-cifar10-32/{name}" for name in (
        "config.json", "diffusion_pytorch_model.safetensors", "model_index.json", "scheduler_config.json")]
    assert (record.source, record.weights, record.how, sorted(record.files)) == (
        "google/ddpm-cifar10-32@main", "hub/ddpm-cifar10-32", "import", expected)
    assert out.splitlines()[0] == (f"DDPM cifar10-32: google/ddpm-cifar10-32@main: recorded the sha256 of "
                                   f"{len(expected)} files (later pulls, imports and verify check against them)")
    assert svcctl(capsys, "verify")[0] == 0
    (folder / "model_index.json").write_text('{"a": 2}')
    code, _, err = svcctl(capsys, "import", "DDPM", str(folder))
    assert code == 1 and f"{folder}: model_index.json: sha256 mismatch" in err
    assert read_record("DDPM", "cifar10-32") == record
    assert not (variant_dir("DDPM", "cifar10-32") / "new.part").exists()
    loaded = variant_dir("DDPM", "cifar10-32") / "hub" / "ddpm-cifar10-32"
    assert svcctl(capsys, "pull", "DDPM")[:2] == (0, f"DDPM cifar10-32: already cached and verified: {loaded}\n")
    (loaded / "model_index.json").write_text("damaged")
    code, out, err = svcctl(capsys, "pull", "DDPM")
    assert code == 1 and len(err.splitlines()) == 1
    assert err.startswith("svcctl: DDPM cifar10-32: google/ddpm-cifar10-32@main: ")


def test_pull_takes_id_colon_variant_specs(source, capsys, tmp_path):
    """`pull ID:VARIANT` (what the quick start passes for a profile) names the variant per model; an unknown
    variant is one usage line and nothing is fetched."""
    source.serve(FULL_URL, BODY)
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2:FULL")
    assert code == 0, err
    assert out == f"MOBILENETV2 FULL: cached: {tmp_path / 'cache' / 'MOBILENETV2' / 'FULL' / 'mobilenet_v2-full.pth'}\n"
    assert read_record("MOBILENETV2", "FIXTURE_V2") is None
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2:NOPE")
    assert (code, out) == (2, "")
    assert err == ("svcctl: MOBILENETV2 has no pretrained variant 'NOPE'; known: FIXTURE_V2, TOFU, FULL\n")


def test_an_unknown_model_or_variant_is_one_usage_line_for_pull_and_import(source, capsys, tmp_path):
    """pull and import resolve a model and its variant the same way: an unknown one is one line, exit 2, no file."""
    code, out, err = svcctl(capsys, "pull", "NOPE")
    assert (code, out, len(err.splitlines())) == (2, "", 1) and "NOPE" in err
    code, out, err = svcctl(capsys, "import", "NOPE", str(tmp_path / "x.pth"))
    assert (code, out, len(err.splitlines())) == (2, "", 1) and "NOPE" in err
    code, out, err = svcctl(capsys, "import", "MOBILENETV2", str(tmp_path / "x.pth"), "--variant", "NOPE")
    assert (code, out) == (2, "")
    assert err == "svcctl: MOBILENETV2 has no pretrained variant 'NOPE'; known: FIXTURE_V2, TOFU, FULL\n"
    assert cache_files(tmp_path) == []


AGPL_URL = "https://example.org/weights/mobilenet_v2-agpl.pth"


def test_a_pull_says_its_size_and_licences_first_and_needs_a_non_permissive_one_accepted(source, capsys,
                                                                                         monkeypatch, tmp_path):
    """Before anything is fetched: one line with the total and the licences, one per variant; a variant under a
    licence that is not permissive is refused (nothing fetched) unless --accept-licence names it."""
    agpl = Variant("AGPL", FileSource(url=AGPL_URL, sha256=SHA, size=len(BODY)), license="AGPL-3.0")
    monkeypatch.setattr(MobileNetV2Factory, "variants", (*FIXTURE_VARIANTS, agpl))
    source.serve(AGPL_URL, BODY)
    code = cli.main(["weights", "pull", "MOBILENETV2:FIXTURE_V2", "MOBILENETV2:AGPL"])
    out, err = capsys.readouterr()
    size = f"{len(BODY) / 1e6:.1f} MB"
    assert code == 1
    lines = err.splitlines()
    assert lines[:3] == [
        f"Pull: 2 of 2 variant(s) to fetch, {2 * len(BODY) / 1e6:.1f} MB in all; licences: AGPL-3.0, BSD-3-Clause",
        f"  MOBILENETV2 FIXTURE_V2: {size}; licence BSD-3-Clause",
        f"  MOBILENETV2 AGPL: {size}; licence AGPL-3.0  (needs acceptance)"]
    assert lines[-1] == ("svcctl: MOBILENETV2 AGPL: licence AGPL-3.0 not accepted, nothing pulled: pass "
                         "--accept-licence AGPL-3.0 to pull it")
    assert [path for path, _ in source.requests] == [f"/download.pytorch.org/models/{FILENAME}"]
    assert out.splitlines() == [f"MOBILENETV2 FIXTURE_V2: cached: {variant_dir('MOBILENETV2', 'FIXTURE_V2') / FILENAME}"]
    assert read_record("MOBILENETV2", "AGPL") is None
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2:FIXTURE_V2", "MOBILENETV2:AGPL", "--accept-licence", "agpl-3.0")
    assert code == 0, err
    assert read_record("MOBILENETV2", "AGPL") is not None
    assert "MOBILENETV2 FIXTURE_V2: already cached and verified" in out
    # A weights probe: one byte flipped (the same size) made a damaged variant "cached: checked, not fetched" in
    # the plan, and the pull then fetched it again without the licence accepted.
    cached = variant_dir("MOBILENETV2", "AGPL") / read_record("MOBILENETV2", "AGPL").weights
    data = bytearray(cached.read_bytes())
    data[0] ^= 0xFF
    cached.write_bytes(bytes(data))
    before = len(source.requests)
    code = cli.main(["weights", "pull", "MOBILENETV2:AGPL"])
    err = capsys.readouterr().err
    assert code == 1 and err.splitlines() == [
        f"Pull: 1 of 1 variant(s) to fetch, {size} in all; licences: AGPL-3.0",
        f"  MOBILENETV2 AGPL: {size}; licence AGPL-3.0  (needs acceptance)",
        "svcctl: MOBILENETV2 AGPL: licence AGPL-3.0 not accepted, nothing pulled: pass --accept-licence AGPL-3.0 to "
        "pull it"]
    assert len(source.requests) == before and cached.read_bytes() == bytes(data)  # nothing fetched


def test_the_licence_question_on_a_terminal(monkeypatch):
    from svc.weightstore.licences import accepted, terminal_question

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    agpl = Variant("AGPL", FileSource(url=AGPL_URL), license="AGPL-3.0")
    out = Tty()
    assert accepted(agpl, [], terminal_question(Tty("y\n"), out, "MOBILENETV2 AGPL"))
    assert out.getvalue() == ("MOBILENETV2 AGPL is licensed AGPL-3.0, not a permissive licence: check what it allows "
                              "you before serving it. Accept AGPL-3.0 and pull? [y/N] ")
    assert not accepted(agpl, [], terminal_question(Tty("\n"), Tty(), "MOBILENETV2 AGPL"))
    assert terminal_question(io.StringIO("y\n"), Tty(), "x") is None  # not a terminal: no question, refused
    assert not accepted(agpl, ["CC-BY-NC-4.0"], None)
    assert accepted(FIXTURE_VARIANTS[0], [], None)  # BSD-3-Clause: nothing to accept
    # Declarations as the plugins write them: the SPDX id first, words after it.
    from models.diffusion import cls_cond_ddim
    from models.mobilenetv2 import VARIANTS as MOBILENET_VARIANTS
    from svc.weightstore.catalog import find_variant

    assert accepted(MOBILENET_VARIANTS[0], [], None)  # "BSD-3-Clause (torchvision)"
    dit = find_variant(cls_cond_ddim, None)
    assert not accepted(dit, ["AGPL-3.0"], None) and accepted(dit, ["CC-BY-NC-4.0"], None)
    assert accepted(dit, ["cc-by-nc-4.0"], None)  # without regard to case


PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "no_proxy",
                   "NO_PROXY")


@pytest.fixture
def proxy(monkeypatch):
    from tests.support.proxy import LoopbackProxy

    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    running = LoopbackProxy()
    yield running
    running.close()


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "ALL_PROXY"])
def test_a_file_pull_goes_through_http_proxy_with_its_credentials(source, proxy, capsys, monkeypatch, variable):
    """``ALL_PROXY`` too, as curl and httpx (so hub pulls) take it (a regression probe: file pulls went direct)."""
    monkeypatch.setenv(variable, proxy.url.replace("http://", "http://me:s%40cret@"))
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2")
    assert code == 0, err
    assert proxy.requests == [("GET", f"{source.mirror}/download.pytorch.org/models/{FILENAME}",
                               "Basic " + base64.b64encode(b"me:s@cret").decode())]
    assert (variant_dir("MOBILENETV2", "FIXTURE_V2") / FILENAME).read_bytes() == BODY


@pytest.mark.parametrize("no_proxy", ["example.org,127.0.0.1", "10.0.0.0/8, 127.0.0.0/8"], ids=["host", "network"])
def test_no_proxy_keeps_a_pull_direct(source, proxy, capsys, monkeypatch, no_proxy):
    """A network (``127.0.0.0/8``) too, as hub pulls honour it (a weights probe: file pulls went to the proxy)."""
    monkeypatch.setenv("http_proxy", proxy.url)
    monkeypatch.setenv("NO_PROXY", no_proxy)
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2")
    assert code == 0, err
    assert proxy.requests == []
    assert source.requests == [(f"/download.pytorch.org/models/{FILENAME}", None)]


def test_an_https_pull_tunnels_through_https_proxy(source, proxy, capsys, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    monkeypatch.setenv("SERVICE_WEIGHTS_MIRROR", f"https://127.0.0.1:{closed}")
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2")
    assert code == 1 and out == ""
    assert proxy.requests == [("CONNECT", f"127.0.0.1:{closed}", None)]
    assert err.splitlines() == [f"svcctl: MOBILENETV2 FIXTURE_V2: https://127.0.0.1:{closed}/download.pytorch.org/"
                                f"models/{FILENAME}: the proxy refused the tunnel: 502 Bad Gateway"]


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_dead_proxy_is_named_not_taken_for_the_source(source, proxy, capsys, monkeypatch, scheme):
    """Nothing listens at the proxy's port: the line names the proxy (without its credentials), not the source
    refusing; an https URL (a CONNECT tunnel) the same."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    if scheme == "https":
        monkeypatch.setenv("SERVICE_WEIGHTS_MIRROR", source.mirror.replace("http://", "https://"))
    monkeypatch.setenv(f"{scheme.upper()}_PROXY", f"http://me:s%40cret@127.0.0.1:{dead}")
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2")
    assert (code, out) == (1, "")
    fetched = f"{scheme}://{source.mirror.split('://')[1]}/download.pytorch.org/models/{FILENAME}"
    assert err.splitlines() == [f"svcctl: MOBILENETV2 FIXTURE_V2: {fetched}: the proxy http://127.0.0.1:{dead} "
                                "refused the connection"]
    assert source.requests == []


def test_a_mirror_with_credentials_is_named_without_them(source, capsys, monkeypatch):
    """``SERVICE_WEIGHTS_MIRROR=http://u:p@host`` printed ``u:p@`` in the pull's failure line, a refused connection
    or a file that fails its check: a URL is printed without its ``user:password@``, as a proxy's is."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    monkeypatch.setenv("SERVICE_WEIGHTS_MIRROR", f"http://me:s%40cret@127.0.0.1:{dead}")
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2")
    assert (code, out) == (1, "")
    assert err.splitlines() == [f"svcctl: MOBILENETV2 FIXTURE_V2: http://127.0.0.1:{dead}/download.pytorch.org/models/"
                                f"{FILENAME}: connection refused"]
    monkeypatch.setenv("SERVICE_WEIGHTS_MIRROR", source.mirror.replace("http://", "http://me:s%40cret@"))
    source.serve(URL, state_dict_bytes(2))  # not the file the name's hash prefix promises
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2")
    got = hashlib.sha256(state_dict_bytes(2)).hexdigest()
    assert (code, out) == (1, "")
    failures = [line for line in err.splitlines() if line.startswith("svcctl:")]  # under the progress lines
    assert failures == [f"svcctl: MOBILENETV2 FIXTURE_V2: {source.mirror}{FakeSource.path_of(URL)}: invalid hash "
                        f'value (expected prefix "{PREFIX}", got "{got}") (nothing kept)']
    assert "cret" not in err and "me:" not in err


@pytest.mark.parametrize("scheme", ["https", "socks5"])
def test_a_proxy_of_another_scheme_is_refused_without_its_credentials(source, proxy, capsys, monkeypatch, scheme):
    """Only http:// proxies are supported: the line says so naming the proxy, and (as every proxy line) without
    its ``user:password@`` (a probe found an https:// proxy's password printed)."""
    monkeypatch.setenv("HTTP_PROXY", f"{scheme}://me:s%40cret@127.0.0.1:3128")
    code, out, err = svcctl(capsys, "pull", "MOBILENETV2")
    assert (code, out) == (1, "")
    assert err.splitlines() == [f"svcctl: MOBILENETV2 FIXTURE_V2: {source.mirror}/download.pytorch.org/models/"
                                f"{FILENAME}: proxy {scheme}://127.0.0.1:3128 (HTTP_PROXY): only http:// proxies are "
                                "supported (set HTTPS_PROXY and HTTP_PROXY to one, or unset HTTP_PROXY to connect "
                                "directly)"]
    assert "cret" not in err and proxy.requests == [] and source.requests == []


def test_list_shows_what_an_imported_hub_variant_recorded(source, capsys, monkeypatch, tmp_path):
    """A hub variant has no one digest: once imported (or pulled), `list` says how many files' sha256 its record
    holds, not "first pull" (which it says before)."""
    from tests.integration.test_weights_hub import write_google_ddpm

    def ddpm_row() -> dict:
        rows = json.loads(svcctl(capsys, "list", "--json")[1])
        return next(r for r in rows if (r["model"], r["variant"]) == ("DDPM", "cifar10-32"))

    def ddpm_line() -> list[str]:
        return next(x for x in svcctl(capsys, "list")[1].splitlines() if x.startswith("DDPM ")).split()

    monkeypatch.setenv("HF_ENDPOINT", source.mirror)
    assert ddpm_line()[5:7] == ["first", "pull"] and ddpm_row().get("recorded_files") is None
    folder = tmp_path / "repo"
    folder.mkdir()
    write_google_ddpm(folder)
    code, _, err = svcctl(capsys, "import", "DDPM", str(folder))
    assert code == 0, err
    recorded = len(read_record("DDPM", "cifar10-32").files)
    assert svcctl(capsys, "verify")[1] == f"DDPM cifar10-32: ok ({recorded} files)\n"
    assert ddpm_line()[:9] == ["DDPM", "cifar10-32", "(default)", "143.0", "MB", f"recorded:{recorded}", "files",
                               "Apache-2.0", "yes"]
    assert ddpm_row()["recorded_files"] == recorded
