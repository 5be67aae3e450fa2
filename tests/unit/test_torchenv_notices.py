"""torch's "No CUDA runtime is found" on a CPU model server: an info line, not an error-level stderr line."""

from __future__ import annotations

import logging

import pytest
import torch  # noqa: F401 - installs torch's own stderr handler on the "torch" logger
from twisted.logger import globalLogPublisher

from svc.model import torchenv

NOTICE = "No CUDA runtime is found, using CUDA_HOME='%s'"


@pytest.fixture
def events():
    seen = []
    globalLogPublisher.addObserver(seen.append)
    logger = logging.getLogger("torch.utils.cpp_extension")
    filters = list(logger.filters)
    yield seen
    globalLogPublisher.removeObserver(seen.append)
    logger.filters[:] = filters


def test_on_the_cpu_the_notice_is_an_info_line_and_stays_off_stderr(events, capsys):
    torchenv.quiet_cuda_notice("cpu")
    torchenv.quiet_cuda_notice("cpu")  # once per process, however often it is asked
    logger = logging.getLogger("torch.utils.cpp_extension")
    logger.warning(NOTICE, "/usr/local/cuda")
    logger.warning("something else")
    err = capsys.readouterr().err
    assert "No CUDA runtime" not in err and "something else" in err
    notices = [e for e in events if "No CUDA runtime" in str(e.get("message", ""))]
    assert [(e["log_level"].name, e["log_namespace"], e["message"]) for e in notices] == [
        ("info", "torch.utils.cpp_extension", "No CUDA runtime is found, using CUDA_HOME='/usr/local/cuda'")]


def test_on_a_gpu_nothing_changes(events, capsys):
    torchenv.quiet_cuda_notice("cuda")
    logging.getLogger("torch.utils.cpp_extension").warning(NOTICE, "/usr/local/cuda")
    assert "No CUDA runtime" in capsys.readouterr().err
