"""``svcctl cache list|prune``: the compiled cache's artefacts by last use (svc/optimize/prune.py).

Real artefacts: small torch nets converted by the pinned ONNX Runtime exporter into a real state directory,
read back as a model server's start reads them; ages are set with ``os.utime``. The one fault that cannot be
caused as root (a file that cannot be removed) is injected.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from svc.cli import commands as cli
from svc.optimize import cache, runtimes
from svc.optimize.apply import apply_mode
from svc.optimize.modes import mode
from tests.unit.test_optimize_runtimes import TwoHeads, target_of

DAY = 86400.0


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVICE_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(runtimes, "WORKERS", 1)
    monkeypatch.setattr(cache, "MADE_FOR", "")  # conversions outside an Optimizer run: made for no model
    return tmp_path


def convert(seed: int) -> None:
    """Convert a small net (weights from ``seed``: a key of its own) with onnxruntime, or read it from the cache."""
    torch.manual_seed(seed)
    module = TwoHeads().eval()
    with torch.no_grad():
        module.conv.weight.add_(seed)
    target, _ = target_of(module)
    apply_mode(target, mode("onnxruntime"), "cpu", 4)


def age(paths: list[Path], days: float) -> None:
    then = time.time() - days * DAY
    for path in paths:
        os.utime(path, (then, then))


def records(compiled: Path) -> list[Path]:
    return sorted(compiled.glob("heads-onnxruntime-*.json"))


def two_artefacts(state_dir: Path, days: float) -> tuple[Path, Path, Path]:
    """Two nets converted (one key each), the first's last use ``days`` ago: the folder, and the two records."""
    convert(1)
    convert(2)
    compiled = state_dir / "compiled"
    old, new = records(compiled)
    age([old, old.with_suffix(".onnx")], days)
    return compiled, old, new


def svcctl(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["cache", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_start_that_reads_an_artefact_from_the_cache_marks_it_used(state_dir):
    convert(1)
    [record] = records(state_dir / "compiled")
    onnx = record.with_suffix(".onnx")
    age([record, onnx], 40)
    before = runtimes.STATS["loaded"]
    convert(1)  # a restart: read from the cache, not converted again
    assert runtimes.STATS["loaded"] == before + 1
    assert time.time() - record.stat().st_mtime < 60
    assert time.time() - onnx.stat().st_mtime > 39 * DAY  # the files themselves are not rewritten


def test_list_shows_each_artefact_its_size_and_last_use_oldest_first(state_dir, capsys):
    compiled, old, new = two_artefacts(state_dir, 40)
    (compiled / "choices").mkdir()
    (compiled / "choices" / "MOBILENETV2-0123.json").write_text("{}")  # auto's records: not artefacts
    (compiled / f".converting-{os.getpid()}-abc.onnx").write_bytes(b"x")  # a build under way: not an artefact

    code, out, err = svcctl(capsys, "list", "--json")
    assert (code, err) == (0, "")
    listed = json.loads(out)
    assert listed["directory"] == str(compiled)
    assert [a["name"] for a in listed["artefacts"]] == [old.stem, new.stem]
    sizes = [old.stat().st_size + old.with_suffix(".onnx").stat().st_size,
             new.stat().st_size + new.with_suffix(".onnx").stat().st_size]
    assert [a["bytes"] for a in listed["artefacts"]] == sizes and listed["bytes"] == sum(sizes)
    assert listed["artefacts"][0]["files"] == [f"{old.stem}.onnx", f"{old.stem}.json"]
    assert listed["artefacts"][0]["recorded"] is True
    assert listed["artefacts"][0]["last_used"] == time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                                  time.gmtime(old.stat().st_mtime))

    code, out, err = svcctl(capsys, "list")
    lines = out.splitlines()
    assert (code, err, len(lines)) == (0, "", 3)
    assert lines[0].endswith(f"  {old.stem}") and lines[1].endswith(f"  {new.stem}")
    assert lines[2] == f"2 artefacts, {sum(sizes) / 1e6:.1f} MB in {compiled}"


def test_list_names_the_model_each_artefact_was_made_for(state_dir, capsys, monkeypatch):
    """Artefact names say only the target (``net-openvino-...``: an operator could not tell MOBILENETV2's from
    YOLOV8's): a record says which model's start made it, and the list shows it; a record from before says
    nothing, and the list shows nothing for it."""
    convert(1)
    monkeypatch.setattr(cache, "MADE_FOR", "MOBILENETV2")
    convert(2)
    compiled = state_dir / "compiled"
    made_before, made_now = records(compiled)
    if "made_for" in json.loads(made_before.read_text()):
        made_before, made_now = made_now, made_before
    age([made_before], 2)
    code, out, err = svcctl(capsys, "list", "--json")
    assert (code, err) == (0, "")
    assert [(a["name"], a["made_for"]) for a in json.loads(out)["artefacts"]] == [(made_before.stem, None),
                                                                                   (made_now.stem, "MOBILENETV2")]
    code, out, err = svcctl(capsys, "list")
    lines = out.splitlines()
    assert lines[0].endswith(f"  {made_before.stem}") and lines[1].endswith(f"  {made_now.stem}  (MOBILENETV2)")


def test_prune_removes_what_no_start_used_for_the_days_given_and_keeps_the_rest(state_dir, capsys):
    compiled, old, new = two_artefacts(state_dir, 31)
    leftover = compiled / "heads-openvino-0123456789abcdef.bin"  # its record was removed as unusable
    leftover.write_bytes(b"\0" * 1000)
    age([leftover], 31)
    being_made = compiled / "heads-openvino-fedcba9876543210.xml"  # its record is not written yet
    being_made.write_bytes(b"<net/>")
    everything = sorted(p.name for p in compiled.iterdir())

    code, out, err = svcctl(capsys, "prune", "--dry-run")
    assert (code, err) == (0, "")
    assert sorted(p.name for p in compiled.iterdir()) == everything
    freed = old.stat().st_size + old.with_suffix(".onnx").stat().st_size + 1000
    assert out.splitlines()[-1] == (f"would free {freed / 1e6:.1f} MB in {compiled}: 2 of 4 artefacts unused for "
                                    "30 days or more")

    code, out, err = svcctl(capsys, "prune")
    assert (code, err) == (0, "")
    assert sorted(line.split(" (")[0] for line in out.splitlines()[:-1]) == [f"removed {old.stem}",
                                                                             f"removed {leftover.stem}"]
    assert sorted(p.name for p in compiled.iterdir()) == sorted([new.name, new.with_suffix(".onnx").name,
                                                                 being_made.name])
    before = runtimes.STATS["loaded"], runtimes.STATS["converted"]
    convert(2)  # what was kept is still read from the cache
    convert(1)  # what was removed is made again
    assert (runtimes.STATS["loaded"], runtimes.STATS["converted"]) == (before[0] + 1, before[1] + 1)

    code, out, err = svcctl(capsys, "prune", "--unused-days", "0")
    assert (code, err) == (0, "")
    assert out.splitlines()[-1].endswith("2 of 3 artefacts unused for 0 days or more")  # the file being made stays
    assert sorted(p.name for p in compiled.iterdir() if p.is_file()) == [being_made.name]


def test_a_file_that_cannot_be_removed_is_one_line_and_exit_1(state_dir, capsys, monkeypatch):
    convert(1)
    [record] = records(state_dir / "compiled")
    original = Path.unlink

    def refuse(self, missing_ok=False):
        if self.suffix == ".onnx":
            raise PermissionError(13, "Permission denied")
        return original(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refuse)
    code, out, err = svcctl(capsys, "prune", "--unused-days", "0")
    assert code == 1
    assert err == f"svcctl: cache prune: cannot remove {record.with_suffix('.onnx')}: Permission denied\n"
    assert not record.exists()  # the record goes first: what is left never looks cached
    assert out.splitlines()[0].startswith(f"removed {record.stem} (")


@pytest.mark.parametrize("value", ["-1", "abc", "1e9"])
def test_an_unusable_number_of_days_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["cache", "prune", "--unused-days", value])
    assert exit_.value.code == 2
    assert "argument --unused-days: " in capsys.readouterr().err


def test_an_empty_or_missing_cache_lists_nothing(state_dir, capsys):
    code, out, err = svcctl(capsys, "list")
    assert (code, out, err) == (0, f"0 artefacts, 0.0 MB in {state_dir / 'compiled'}\n", "")
    code, out, err = svcctl(capsys, "prune")
    assert (code, err) == (0, "")
    assert out == f"freed 0.0 MB in {state_dir / 'compiled'}: 0 of 0 artefacts unused for 30 days or more\n"


@pytest.mark.parametrize("action", ["list", "prune"])
def test_a_file_where_the_cache_folder_should_be_is_one_line_and_exit_2(state_dir, capsys, action):
    """``<state>/compiled`` a plain file: a NotADirectoryError traceback and exit 1 before."""
    (state_dir / "compiled").write_text("not a folder")
    code, out, err = svcctl(capsys, action)
    assert (code, out) == (2, "")
    assert err == (f"svcctl: cache {action}: the compiled cache {state_dir / 'compiled'} is not a folder (a file is in "
                   "its place)\n")


@pytest.mark.parametrize("action", ["list", "prune"])
def test_a_state_directory_that_is_a_file_is_one_line_naming_it_and_exit_2(tmp_path, capsys, monkeypatch, action):
    state = tmp_path / "state"
    state.write_text("not a folder")
    monkeypatch.setenv("SERVICE_STATE_DIR", str(state))
    code, out, err = svcctl(capsys, action)
    assert (code, out) == (2, "")
    assert err == (f"svcctl: cache {action}: the state directory {state} is not a folder, so there is no compiled "
                   f"cache {state / 'compiled'} under it (set $SERVICE_STATE_DIR to a folder)\n")
    monkeypatch.setenv("SERVICE_STATE_DIR", str(state / "deeper"))  # a file further up: named as it is
    code, out, err = svcctl(capsys, action)
    assert (code, out) == (2, "")
    assert err == (f"svcctl: cache {action}: {state} is not a folder, so there is no compiled cache "
                   f"{state / 'deeper' / 'compiled'} under it (set $SERVICE_STATE_DIR to a folder)\n")


def test_a_cache_folder_that_cannot_be_read_is_one_line_with_the_reason_and_exit_2(state_dir, capsys, monkeypatch):
    """Another user's folder of mode 0700 (injected: root reads every folder)."""
    (state_dir / "compiled").mkdir()

    def refuse(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "scandir", refuse)
    code, out, err = svcctl(capsys, "list", "--json")
    assert (code, out) == (2, "")
    assert err == f"svcctl: cache list: cannot read the compiled cache {state_dir / 'compiled'}: Permission denied\n"
