"""Supervisor settings observed on a real stack: ``profile = "auto"`` and ``log_backups``."""

from __future__ import annotations

import pytest

from svc.supervisor.config import nvidia_present
from tests.support.http import get, post
from tests.support.images import image_b64
from tests.support.stack import build_stack, stop_stack

LOG_MAX_BYTES = 4096
LOG_BACKUPS = 2


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("settings")
    # "auto" may pick either profile on this host: both list TESTFAULTS, and the gpu one runs it on the cpu
    # device too, so that the stack starts on a host with the NVIDIA driver and no GPU-ready torch.
    (root / "profiles").mkdir()
    (root / "profiles" / "gpu.toml").write_text('device = "cpu"\nmodels = ["TESTFAULTS"]\n#the gpu profile of this test\n')
    s = build_stack(root, {"TESTFAULTS": {}}, profile="auto",
                    supervisor_extra=f"log_max_bytes = {LOG_MAX_BYTES}\nlog_backups = {LOG_BACKUPS}\n")
    for name in ("__gateway", "TESTFAULTS"):
        s.wait_for(name, lambda c: c["state"] == "running" and c["ready"])
    yield s
    code, survivors = stop_stack(s)
    assert (code, survivors) == (0, []), s.supervisor.output()[-3000:]


def test_profile_auto_picks_gpu_only_with_an_nvidia_driver(stack):
    """The real supervisor resolves "auto" as this host says: gpu with the NVIDIA driver loaded, else cpu.

    Both branches of the choice are unit tests (tests/unit/test_supervisor_manager.py, injected detection).
    """
    expected = "gpu" if nvidia_present() else "cpu"
    status = get(stack.url + "/api/v1/status", headers=stack.auth).json
    assert (status["profile"], status["device"]) == (expected, "cpu")
    assert get(stack.url + "/api/v1/catalog", headers=stack.auth).json["profile"] == expected
    assert f"(profile {expected}, device cpu)" in stack.supervisor.output()


def test_rotated_logs_keep_log_backups_files(stack):
    """Past log_max_bytes the child's log rotates; only log_backups rotated files are kept."""
    logs = stack.root / "logs"
    headers = {"Authorization": f"Bearer {stack.key}"}
    body = {"images": [image_b64()]}
    # One access-log line per request (about 100 bytes): enough requests for more rotations than backups.
    for _ in range((LOG_BACKUPS + 3) * LOG_MAX_BYTES // 80):
        assert post(stack.gateway + "/v1/models/TESTFAULTS/infer", body, headers=headers).status == 200
    page = get(stack.url + "/api/v1/servers/TESTFAULTS/logs?offset=0&limit=2000", headers=stack.auth).json
    assert page["first_offset"] == 0  # the in-memory ring still has the first line ...
    names = sorted(p.name for p in logs.glob("TESTFAULTS.log*"))
    assert names == ["TESTFAULTS.log"] + [f"TESTFAULTS.log.{i}" for i in range(1, LOG_BACKUPS + 1)]
    kept = "".join((logs / name).read_text(errors="replace") for name in names)
    first = page["lines"][0]["line"]
    assert first not in kept  # ... the files do not: the oldest rotated file was deleted
    written = sum(len(line["line"]) + 1 for line in page["lines"])
    assert written > (LOG_BACKUPS + 2) * LOG_MAX_BYTES, written  # there was more to keep than the cap allows
    for name in names[1:]:
        assert (logs / name).stat().st_size <= LOG_MAX_BYTES + 1024  # rotated at the size (plus the last write)
