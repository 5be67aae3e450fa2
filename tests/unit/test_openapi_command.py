"""``svcctl openapi check|write`` on a copy of the committed documents and shipped configs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from svc.cli.commands import main

REPO = Path(__file__).resolve().parents[2]
NAMES = sorted(p.name for p in (REPO / "openapi").glob("*.json"))


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A folder with openapi/ and conf/server/ as committed; the command works from the current directory."""
    shutil.copytree(REPO / "openapi", tmp_path / "openapi")
    shutil.copytree(REPO / "conf" / "server", tmp_path / "conf" / "server")
    shutil.copy(REPO / "conf" / "service.toml", tmp_path / "conf" / "service.toml")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(capsys, mode: str) -> tuple[int, list[str], list[str]]:
    code = main(["openapi", mode])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def test_check_passes_on_the_committed_documents(checkout, capsys):
    assert len(NAMES) == 8
    assert run(capsys, "check") == (0, ["openapi documents are current"], [])


def test_check_names_every_stale_missing_and_extra_document_and_exits_1(checkout, capsys):
    gateway = checkout / "openapi" / "gateway.json"
    gateway.write_text(gateway.read_text().replace('"openapi"', '"openapi" ', 1))
    (checkout / "openapi" / "model-DDPM.json").unlink()
    (checkout / "openapi" / "model-OLD.json").write_text("{}\n")
    assert run(capsys, "check") == (1, [], [
        "openapi/gateway.json: differs from what the code generates",
        "openapi/model-DDPM.json: missing",
        "openapi/model-OLD.json: no longer generated",
        "run: svcctl openapi write",  # it advised the module's own command
    ])


@pytest.mark.parametrize("edit", ["port = 9199", "port = 8080"], ids=["moved", "unchanged"])
def test_each_document_names_its_process_port_so_a_moved_gateway_is_a_difference(checkout, capsys, edit):
    """An operator probe: a model's port edited made its document differ, but the gateway's named 8080 whatever
    ``[gateway] port`` said (the check passed, and the live gateway's document named 8080 too)."""
    service = checkout / "conf" / "service.toml"
    service.write_text(service.read_text().replace("port = 8080", edit, 1))
    if edit == "port = 8080":
        assert run(capsys, "check") == (0, ["openapi documents are current"], [])
        return
    assert run(capsys, "check") == (1, [], ["openapi/gateway.json: differs from what the code generates",
                                            "run: svcctl openapi write"])
    assert run(capsys, "write")[0] == 0
    assert json.loads((checkout / "openapi" / "gateway.json").read_text())["servers"] == [
        {"url": "http://127.0.0.1:9199"}]


def test_a_gateway_port_that_is_no_port_is_one_line_and_exit_2(checkout, capsys):
    service = checkout / "conf" / "service.toml"
    service.write_text(service.read_text().replace("port = 8080", 'port = "8080"', 1))
    assert run(capsys, "check") == (2, [], ["svcctl: openapi check: conf/service.toml: gateway.port: must be a "
                                            "port number from 1 to 65535, got '8080'"])  # in the checkout: no hint to run it there


def test_write_regenerates_the_committed_bytes(checkout, capsys):
    for name in NAMES[:3]:
        (checkout / "openapi" / name).write_text("stale\n")
    (checkout / "openapi" / "model-YOLOV8.json").unlink()
    code, out, err = run(capsys, "write")
    assert (code, err) == (0, [])
    assert sorted(out) == [f"wrote openapi/{name}" for name in NAMES]  # every document, each once
    for name in NAMES:
        assert (checkout / "openapi" / name).read_bytes() == (REPO / "openapi" / name).read_bytes(), name
    assert run(capsys, "check") == (0, ["openapi documents are current"], [])



def test_write_removes_the_documents_no_longer_generated_that_check_reports(checkout, capsys):
    """A model's config removed: check said ``no longer generated`` and ``run: python -m svc.openapi --write``,
    but the write left the file, and the check kept failing. The write removes it (and says so); a JSON file of
    another name is not one it made: it stays, and the check names it apart."""
    (checkout / "conf" / "server" / "YOLOV8.toml").unlink()
    (checkout / "openapi" / "model-OLD.json").write_text("{}\n")
    (checkout / "openapi" / "notes.json").write_text("{}\n")
    assert run(capsys, "check") == (1, [], [
        "openapi/gateway.json: differs from what the code generates",  # it lists the models
        "openapi/model-OLD.json: no longer generated",
        "openapi/model-YOLOV8.json: no longer generated",
        "openapi/notes.json: not a generated document (remove it by hand)",
        "run: svcctl openapi write",
    ])
    code, out, err = run(capsys, "write")
    assert (code, err) == (0, [])
    assert out[-2:] == ["removed openapi/model-OLD.json (no longer generated)",
                        "removed openapi/model-YOLOV8.json (no longer generated)"]
    left = sorted(p.name for p in (checkout / "openapi").iterdir())
    assert left == sorted([*(n for n in NAMES if n != "model-YOLOV8.json"), "notes.json"])
    (checkout / "openapi" / "notes.json").unlink()
    assert run(capsys, "check") == (0, ["openapi documents are current"], [])


def test_a_write_refused_outside_the_checkout_creates_nothing(tmp_path, capsys, monkeypatch):
    """``svcctl openapi write`` where there is no conf/server said so, and left an empty openapi/ folder behind."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "write")
    assert (code, out, len(err)) == (2, [], 1) and err[0].startswith("svcctl: openapi write: ")
    assert err[0].endswith("(run it in the checkout)") and "conf/server" in err[0]
    assert list(tmp_path.iterdir()) == []


def test_a_documented_model_whose_plugin_breaks_is_one_line_and_exit_1(checkout, capsys, monkeypatch):
    """A plugin of a documented config whose params_schema raises: the check and the write ended in a traceback."""
    import svc.openapi.committed
    from models.diffusion import DDPMFactory
    from svc.model.api import factories

    class Broken(DDPMFactory):
        def params_schema(self, config: dict) -> dict:
            raise KeyError("max_top_k")

    monkeypatch.setattr(svc.openapi.committed, "factories", lambda: {**factories(), "DDPM": Broken()})
    problem = f"DDPM: its plugin {__name__} raised KeyError in params_schema(config): 'max_top_k'"
    for mode in ("check", "write"):  # named as the user typed it (it said "python -m svc.openapi:")
        assert run(capsys, mode) == (1, [], [f"svcctl: openapi {mode}: {problem}"])
    assert svc.openapi.committed.main(["--check"]) == 1
    assert capsys.readouterr().err == f"python -m svc.openapi: {problem}\n"


def test_a_shipped_model_claimed_by_a_second_plugin_is_refused_not_removed(checkout):
    """A third party's plugin claiming MOBILENETV2 (a folder on PYTHONPATH): the id was left out of the plugins
    found, so ``--write`` removed model-MOBILENETV2.json as no longer generated and exited 0, and ``--check``
    advised that ``--write``.  Both now exit 1 naming the clash, and nothing is written."""
    import os
    import subprocess
    import sys

    vendor = checkout / "vendor" / "models"
    vendor.mkdir(parents=True)
    (vendor / "acme_dupe.py").write_text("from models.mobilenetv2 import MobileNetV2Factory\n\n"
                                         "again = MobileNetV2Factory()\n")
    before = {name: (checkout / "openapi" / name).read_bytes() for name in NAMES}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(checkout / "vendor")])}
    for mode in ("--check", "--write"):
        done = subprocess.run([sys.executable, "-m", "svc.openapi", mode], cwd=checkout, env=env,
                              capture_output=True, text=True, timeout=300)
        assert (done.returncode, done.stdout) == (1, ""), done
        assert done.stderr.splitlines()[-1] == (
            "python -m svc.openapi: two model plugins serve catalog id 'MOBILENETV2': models.acme_dupe and "
            "models.mobilenetv2; remove one"), done.stderr
    assert {name: (checkout / "openapi" / name).read_bytes() for name in NAMES} == before
