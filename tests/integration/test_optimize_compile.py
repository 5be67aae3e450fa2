"""The ``compile`` mode for real: AOTInductor packages built with the machine's C++ compiler (svc/optimize/aot.py).

Tiny nets, so that each build takes seconds; the same checks on a served
model and its state directory are in test_optimize_cache.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile

import pytest
import torch

from models.testfaults import NetFaultModel
from svc.optimize import aot
from svc.optimize.select import optimize_model
from tests.support.images import uint8_tensors


def test_compile_builds_a_package_once_and_a_second_load_reads_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVICE_STATE_DIR", str(tmp_path))
    model = NetFaultModel()
    eager = model.means(uint8_tensors(5))
    report = optimize_model(model, "classification", "cpu", "compile", 4, "TESTFAULTS")
    assert report.mode == "compile" and not report.fell_back, report.line
    assert report.line.startswith("TESTFAULTS: optimize compile: gate passed [top-1 4/4")
    assert report.line.endswith("; compiled packages: 1 built, 0 loaded from the cache)")
    [package] = (tmp_path / "compiled").glob("net-compile-*.pt2")
    assert json.loads(package.with_suffix(".json").read_text()) == {  # 2 x max_batch_size
        "batches": [1, 8], "made_for": "TESTFAULTS",  # for svcctl cache list
        "sha256": {package.name: hashlib.sha256(package.read_bytes()).hexdigest()}}
    for n in (1, 2, 3, 5):  # one program for every batch size
        assert torch.allclose(model.means(uint8_tensors(n)), eager[:n], atol=1e-3)

    again = NetFaultModel()  # a restart: the same weights, the same key
    report = optimize_model(again, "classification", "cpu", "compile", 4, "TESTFAULTS")
    assert report.line.endswith("; compiled packages: 0 built, 1 loaded from the cache)"), report.line
    assert torch.allclose(again.means(uint8_tensors(5)), eager, atol=1e-3)

    # a package cut short (a full disk, a copy that stopped) failed compile on every start: built again, once
    package.write_bytes(package.read_bytes()[: package.stat().st_size // 2])
    healed = NetFaultModel()
    report = optimize_model(healed, "classification", "cpu", "compile", 4, "TESTFAULTS")
    assert report.mode == "compile" and report.line.endswith(
        "; compiled packages: 1 built, 0 loaded from the cache (1 in the cache unusable: made again))"), report.line
    assert torch.allclose(healed.means(uint8_tensors(5)), eager, atol=1e-3)


class BatchOfOneApart(torch.nn.Module):
    """A model whose code treats a batch of one apart (its own answer): a compiled batch dimension must not start at 1."""

    def forward(self, x):
        if x.shape[0] == 1:
            return x * 3
        return x * 2 + 1


def test_a_batch_outside_the_compiled_sizes_runs_eager(tmp_path):
    module = BatchOfOneApart()

    def example_of(n):
        return (torch.rand(n, 3, generator=torch.Generator().manual_seed(n)),)

    package = aot.compiled(module, example_of, 4, "cpu", True, "compile", "apart", tmp_path)
    assert package.batches[0] == 2 and package.batches[1] >= 4  # the warm-up batch is compiled, one is not
    calls = []
    package.fallback = lambda *args: calls.append(args[0].shape[0]) or module(*args)
    x = torch.rand(5, 3)
    assert torch.allclose(package(x[:1]), x[:1] * 3) and calls == [1]  # eager: the model's own answer
    assert torch.allclose(package(x), x * 2 + 1) and calls == [1]
    alone = aot.compiled(module, example_of, 1, "cpu", True, "compile", "apart", tmp_path)
    assert alone.batches == (1, 1)  # a warm-up batch of one, outside the dynamic range: compiled alone
    assert torch.allclose(alone(x[:1]), x[:1] * 3)
    assert json.loads(alone.path.with_suffix(".json").read_text())["batches"] == [1, 1]


def test_a_package_is_neither_read_from_nor_built_in_a_folder_of_another_user(tmp_path, monkeypatch):
    """A package is code: one in a compiled/ another user owns (there under this key's name, its record matching)
    was loaded, or on failing replaced there.  It is neither read nor replaced; the build goes to the process's
    private folder."""
    from svc.optimize import cache

    state = tmp_path / "st"
    monkeypatch.setenv("SERVICE_STATE_DIR", str(state))
    monkeypatch.setattr(cache, "_WARNED", set(), raising=False)
    (tmp_path / "scratch").mkdir(mode=0o700)
    monkeypatch.setattr(cache, "_scratch", tmp_path / "scratch", raising=False)
    module = BatchOfOneApart()

    def example_of(n):
        return (torch.rand(n, 3, generator=torch.Generator().manual_seed(n)),)

    compiled = state / "compiled"
    compiled.mkdir(parents=True)
    key = aot.package_key(module, example_of(4), "cpu", "compile|batch 4")
    theirs = compiled / f"apart-compile-{key[:32]}.pt2"
    theirs.write_bytes(b"PK\x03\x04 their code")
    cache.write_record(theirs.with_suffix(".json"), [theirs], {"batches": [1, 8]})
    for path in (compiled, theirs, theirs.with_suffix(".json")):
        os.chown(path, 65534, 65534)
    before = {p.name: p.read_bytes() for p in compiled.iterdir()}
    built = aot.STATS["built"]
    package = aot.compiled(module, example_of, 4, "cpu", True, "compile", "apart", compiled)
    assert aot.STATS["built"] == built + 1 and package.path == tmp_path / "scratch" / "compiled" / theirs.name
    assert {p.name: p.read_bytes() for p in compiled.iterdir()} == before
    x = torch.rand(5, 3)
    assert torch.allclose(package(x), x * 2 + 1)


def test_a_loaded_package_leaves_no_unpacked_copy_behind(tmp_path, monkeypatch):
    """torch unpacks a package into ``$TMPDIR/aotinductor_*`` and keeps it until the runner dies: a killed server
    left 7 to 16 MB in /tmp at every start. A CPU package's copy goes once it is loaded; a CUDA package's copy
    stays while its process runs, and the next load removes those of processes that ended."""
    module = BatchOfOneApart()

    def example_of(n):
        return (torch.rand(n, 3, generator=torch.Generator().manual_seed(n)),)

    aot.compiled(module, example_of, 4, "cpu", True, "compile", "apart", tmp_path / "packages")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    ended = subprocess.Popen(["true"])
    ended.wait()
    gone = scratch / f"svc-aot-{ended.pid}-x1y2z3"  # a CUDA package's copy whose process has ended
    (gone / "aotinductor_abc").mkdir(parents=True)
    foreign = scratch / "aotinductor_not_ours"  # not ours to remove
    foreign.mkdir()

    loaded = aot.compiled(module, example_of, 4, "cpu", True, "compile", "apart", tmp_path / "packages")
    assert sorted(p.name for p in scratch.iterdir()) == ["aotinductor_not_ours"]
    x = torch.rand(5, 3)
    assert torch.allclose(loaded(x), x * 2 + 1)  # it runs with its copy gone

    kept = aot.load_runner(loaded.path, "cuda")  # the device decides only whether the copy stays
    [copy] = [p for p in scratch.iterdir() if p != foreign]
    assert copy.name.startswith(f"svc-aot-{os.getpid()}-") and [p.name[:12] for p in copy.iterdir()] == ["aotinductor_"]
    assert torch.allclose(kept(x), x * 2 + 1)
    aot.sweep_unpacked()  # a running process's copy stays
    assert copy.exists()


def test_a_package_that_does_not_load_leaves_no_folder_behind(tmp_path, monkeypatch):
    """A cut or foreign file given to the loader fails the load; the folder it was to unpack into goes too."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    broken = tmp_path / "broken.pt2"
    broken.write_bytes(b"PK\x03\x04 not a package")
    with pytest.raises(Exception):  # noqa: B017 - whatever torch's loader raises for a file that is no package
        aot.load_runner(broken, "cpu")
    # (torch's import may make its own torchinductor_<user> there: not a package's)
    assert [p.name for p in scratch.iterdir() if p.name.startswith(("svc-aot-", "aotinductor_"))] == []
    assert os.environ.get("TMPDIR") != str(scratch) and not os.environ.get("TMPDIR", "").startswith(str(scratch))


def test_a_changed_model_table_converts_again_and_an_unchanged_one_reads_the_cache(tmp_path, monkeypatch):
    """A plugin author's probe: a [model] value the network keeps as a plain attribute changed, and the restart
    read the model converted with the old value (its results silently the old ones).  The table is in the key."""
    monkeypatch.setenv("SERVICE_STATE_DIR", str(tmp_path))

    def start(config: dict) -> str:
        report = optimize_model(NetFaultModel(), "classification", "cpu", "onnxruntime", 4, "TESTFAULTS",
                                config=config)
        assert report.mode == "onnxruntime", report.line
        return report.line.split("converted models: ")[1]

    assert start({"seed": 1}) == "1 converted, 0 read from the cache)"
    assert start({"seed": 1}) == "0 converted, 1 read from the cache)"
    assert start({"seed": 1, "scale": 5.0}) == "1 converted, 0 read from the cache)"

