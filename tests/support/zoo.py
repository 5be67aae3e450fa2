"""Helpers shared by the model-zoo tests (real servers, real libraries)."""

from __future__ import annotations

import base64
import io
import time
from pathlib import Path
from typing import Any

import pytest

from svc.config import load_model_server_config
from svc.model.api import find_factory, model_config
from svc.model.weights import WeightsError
from tests.support.http import Reply, get, post
from tests.support.processes import write_config

#: Any valid base64: generative models require an image in the envelope but ignore it.
IGNORED_IMAGE = base64.b64encode(b"ignored").decode()


def infer(server: Any, uri: str, body: dict) -> Reply:
    return post(server.url + uri, body, headers=server.auth, timeout=120)


def assert_ok(reply: Reply, n: int = 1) -> list:
    """200, status 0, n successful items; their data."""
    assert reply.status == 200, reply.body[:500]
    body = reply.json
    assert body["status"] == 0 and body["status_str"] == "SUCCESS" and body["partial"] is False, body
    assert len(body["results"]) == n
    assert [item["status"] for item in body["results"]] == [0] * n, body["results"]
    return [item["data"] for item in body["results"]]


def assert_invalid(reply: Reply, pointer: str) -> None:
    """422 status 66 whose only error is at ``pointer``, and no job created."""
    assert reply.status == 422, reply.body[:500]
    body = reply.json
    assert body["status"] == 66 and body["status_str"] == "INVALID_REQUEST" and body["results"] == []
    assert [e["pointer"] for e in body["errors"]] == [pointer], body["errors"]
    assert "job_id" not in body


def run_job(server: Any, body: dict, timeout_ms: int = 60000) -> dict:
    """Submit to /jobs, wait until terminal, read the result; the result envelope."""
    submitted = post(server.url + "/jobs", body, headers=server.auth)
    assert submitted.status == 202, submitted.body[:500]
    job = submitted.json
    assert job["state"] == "pending" and job["job_id"].startswith("job_")
    deadline = time.monotonic() + timeout_ms / 1000
    state = None
    while time.monotonic() < deadline:
        state = get(f"{server.url}/jobs/{job['job_id']}/wait?timeout=20000", headers=server.auth, timeout=60).json
        if state["state"] in ("done", "failed", "timeout"):
            break
    assert state is not None and state["state"] == "done", state
    result = get(server.url + job["result_url"], headers=server.auth)
    assert result.status == 200, result.body[:500]
    return result.json


def decode_image(text: str) -> Any:
    """Base64 image text to a PIL image (loaded)."""
    from PIL import Image

    image = Image.open(io.BytesIO(base64.b64decode(text, validate=True)))
    image.load()
    return image


def load_error(directory: Path, model_id: str, **model: Any) -> str:
    """The ``WeightsError`` a model server of ``model_id`` with these ``[model]`` keys stops with, as its one line.

    The steps of svc.modelserver.tap and the engine's load, in this process:
    the ``[model]`` table, the params schema, then ``build``.  A server prints
    this line after ``weights '<value>' (from <config file>): `` and exits 1 (shown with real processes by
    test_modelserver_startup's and test_zoo_diffusion's refusal tests); each
    plugin's own weights checks are then tested here, saving a process that
    imports torch and the model's library for every refusal.
    """
    path = write_config(directory, model_id, model=model)
    factory = find_factory(model_id)
    with pytest.raises(WeightsError) as refused:
        table = model_config(factory, load_model_server_config(str(path)).model, str(path))
        factory.params_schema(table)
        factory.build(table, "cpu")
    return str(refused.value)
