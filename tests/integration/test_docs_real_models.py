"""docs/models.md's "Real models in three commands", run as written against a loopback source.

The three lines are read from docs/models.md.  ``svcctl weights pull MOBILENETV2``
runs in this process, through ``SERVICE_WEIGHTS_MIRROR`` to a fake source
serving a torchvision MobileNetV2 state dict (the official format) under the
official URL; the catalog entry is the real one but for its torch.hub hash
prefix, which a test file cannot have, so the sha256 is recorded at this
first pull.  The ``sed`` line runs as it is on a copy of the shipped config,
and ``./bin/quickstart`` is its last step, ``python -m svc.cli.quickstart`` (the
virtual environment and ``pip install`` are not what is tested here), on the
shipped profile's ``weights = "demo"``.  The reply must carry the version
the page's comment promises, and the status API the variant.
"""

from __future__ import annotations

import dataclasses
import io
import re
import shlex
import signal
import subprocess
from pathlib import Path

import torch
from torchvision.models import mobilenet_v2

from models.mobilenetv2 import MobileNetV2Factory
from svc.cli import commands as cli
from svc.weightstore.catalog import find_variant
from tests.integration.test_quickstart_run import quickstart_tree, run_quickstart
from tests.support.http import get, post
from tests.support.images import image_b64
from tests.support.weight_source import FakeSource

PAGE = Path(__file__).resolve().parents[2] / "docs" / "models.md"


def readme_block() -> list[tuple[list[str], str]]:
    """The block's commands, each as (argv, its comment)."""
    text = PAGE.read_text()
    section = text[text.index("## Real models in three commands"):]
    start = section.index("```sh\n") + 6
    block = section[start:section.index("\n```", start)]
    lines = []
    for line in block.splitlines():
        command, _, comment = line.partition("#")
        lines.append((shlex.split(command), comment.strip()))
    return lines


def test_real_models_in_three_commands_serve_the_pulled_variant(tmp_path, monkeypatch, capsys):
    (pull, _), (sed, _), (start, promise) = readme_block()
    assert pull == [".venv/bin/svcctl", "weights", "pull", "MOBILENETV2"]
    assert sed[0] == "sed" and sed[-1] == "conf/server/MOBILENETV2.toml"
    assert start == ["./bin/quickstart"]
    version = re.search(r'"version": "([^"]+)"', promise).group(1)

    net = mobilenet_v2(weights=None)
    buf = io.BytesIO()
    torch.save(net.state_dict(), buf)
    official = find_variant(MobileNetV2Factory, None)
    variant = dataclasses.replace(official, source=dataclasses.replace(official.source, hash_prefix=None))
    monkeypatch.setattr(MobileNetV2Factory, "variants", (variant,))
    cache = tmp_path / "cache"
    env = {"SERVICE_WEIGHTS_DIR": str(cache)}
    gateway_port, supervisor_port = quickstart_tree(tmp_path, "MOBILENETV2")
    source = FakeSource()
    try:
        source.serve(official.source.url, buf.getvalue())
        monkeypatch.setenv("SERVICE_WEIGHTS_DIR", str(cache))
        monkeypatch.setenv("SERVICE_WEIGHTS_MIRROR", source.mirror)
        assert cli.main(pull[1:]) == 0, capsys.readouterr().err
    finally:
        source.close()
    subprocess.run(sed, cwd=tmp_path, check=True)
    popen, log = run_quickstart(tmp_path, env)
    try:
        out = log.read_text()
        assert "== All models ready: 1 on the cpu profile" in out, out[-3000:]
        secrets = dict(line.split("=", 1) for line in (tmp_path / "secrets" / "local.env").read_text().split()
                       if "=" in line)
        status = get(f"http://127.0.0.1:{supervisor_port}/api/v1/status",
                     headers={"Authorization": f"Bearer {secrets['SERVICE_API_TOKEN']}"}).json
        assert status["weights"] == "demo"  # the shipped profile's
        assert status["servers"][0]["weights"] == {"kind": "pretrained", "variant": version}
        reply = post(f"http://127.0.0.1:{gateway_port}/v1/models/MOBILENETV2/infer", {"images": [image_b64()]},
                     headers={"Authorization": f"Bearer {secrets['SERVICE_API_KEY']}"})
        assert (reply.status, reply.json["status"], reply.json["model"]["version"]) == (200, 0, version)
    finally:
        popen.send_signal(signal.SIGTERM)
        code = popen.wait(60)
    assert code == 0, log.read_text()[-3000:]
