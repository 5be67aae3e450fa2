"""Clients generated from the committed OpenAPI documents work against the real servers.

A document that validates is not yet one a client can be generated from:
openapi-python-client (pinned in setup.py's test extra) drops a whole model
over a construct it cannot read (an array without ``items`` once cost every
generated client its ``Rejection``, so a 401 parsed as ``None``).  So every
committed document is generated here, every model it declares must come out,
and the clients of the gateway and of one model server call a real process:
a success, a 401 and a 422, each parsed into its generated class.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.gateway import GATEWAY_TOKENS, start_gateway
from tests.support.images import image_b64
from tests.support.processes import REPO, write_config

DOCUMENTS = sorted(p.name for p in (REPO / "openapi").glob("*.json"))
# The generator knows no `image/*` request body: it leaves that variant out (the operation keeps its JSON and
# application/octet-stream bodies) and says so; every other line it prints about a problem fails the test.
TOLERATED = ("Generating ", "WARNING parsing ", "Unsupported content type image/*",
             "Warning(s) encountered while generating", "If you believe this was a mistake")


def package_name(document: str) -> str:
    return "generated_" + re.sub(r"\W", "_", document.removesuffix(".json")).lower() + "_client"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """Each committed document's client (its folder, and the generator's output), generated side by side."""
    root = tmp_path_factory.mktemp("clients")
    running = {}
    for document in DOCUMENTS:
        config = root / f"{package_name(document)}.yaml"
        # No post hooks: they run ruff/black on the result, which the test does not need.
        config.write_text(json.dumps({"post_hooks": [], "package_name_override": package_name(document),
                                      "project_name_override": package_name(document).replace("_", "-")}))
        out = root / package_name(document)
        running[document] = (out, subprocess.Popen(
            [sys.executable, "-m", "openapi_python_client", "generate", "--path", str(REPO / "openapi" / document),
             "--output-path", str(out), "--config", str(config)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    done = {}
    for document, (out, proc) in running.items():
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, output
        done[document] = (out, output)
    return done


def load(generated: dict[str, tuple[Path, str]], document: str) -> ModuleType:
    """The generated package of ``document``, imported."""
    out, _ = generated[document]
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    return importlib.import_module(package_name(document))


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_model_of_the_document_is_generated(generated, document):
    _, output = generated[document]
    problems = [line for line in output.splitlines()
                if line.strip() and not line[0].isspace() and line not in ("{", "}") and not line.startswith(TOLERATED)]
    assert problems == [], output
    models = importlib.import_module(load(generated, document).__name__ + ".models")
    classes = {name.lower() for name in dir(models)}
    schemas = json.loads((REPO / "openapi" / document).read_text())["components"]["schemas"]
    # Every object and enum of the document is a class of the client (FOO_Request becomes FOORequest).
    wanted = [name for name, schema in schemas.items() if "properties" in schema or "enum" in schema]
    assert [name for name in wanted if name.replace("_", "").lower() not in classes] == []
    assert {"rejection", "health", "status"} <= classes


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, mobilenet):
    """A real gateway in front of the session's real MOBILENETV2 model server (tests/conftest.py)."""
    root = tmp_path_factory.mktemp("gwclient")
    servers = root / "server"
    servers.mkdir()
    write_config(servers, "MOBILENETV2", name="MOBILENETV2.toml", port=mobilenet.port)
    proc = start_gateway(root, servers, None, env={"SERVICE_UPSTREAM_TOKEN": mobilenet.token})
    yield proc
    proc.stop()


def call_with_generated_client(package: ModuleType, url: str, token: str, health: str) -> None:
    """Success, 401 and 422 of MOBILENETV2 inference, and the health route, through the generated client."""
    client = importlib.import_module(package.__name__ + ".client")
    models = importlib.import_module(package.__name__ + ".models")
    infer = importlib.import_module(package.__name__ + ".api.default.infer_mobilenetv2")
    health_route = importlib.import_module(package.__name__ + f".api.default.{health}")
    good = client.AuthenticatedClient(base_url=url, token=token, raise_on_unexpected_status=True)

    ok = infer.sync_detailed(client=good, body=models.MOBILENETV2Request(images=[image_b64(seed=5)], req_id="gen-1",
                                                                         params=models.MOBILENETV2Params(top_k=2)))
    assert ok.status_code == 200, ok.content
    assert type(ok.parsed) is models.MOBILENETV2Envelope and ok.parsed.status is models.Status.SUCCESS
    assert ok.parsed.task_id == "gen-1" and ok.parsed.model.name == "MOBILENETV2"
    [item] = ok.parsed.results
    assert item.status is models.ItemStatus.SUCCESS and type(item.data) is models.MOBILENETV2Data
    assert len(item.data.categories) == 2

    wrong = client.AuthenticatedClient(base_url=url, token="not-the-token", raise_on_unexpected_status=True)
    denied = infer.sync_detailed(client=wrong, body=models.MOBILENETV2Request(images=[image_b64()]))
    assert denied.status_code == 401, denied.content
    assert type(denied.parsed) is models.Rejection and denied.parsed.status is models.Status.UNAUTHORIZED
    assert denied.parsed.results == []

    # The generated class checks no pattern: a request id with a space reaches the server, which answers 422.
    invalid = infer.sync_detailed(client=good, body=models.MOBILENETV2Request(images=[image_b64()], req_id="a b"))
    assert invalid.status_code == 422, invalid.content
    assert type(invalid.parsed) is models.Rejection and invalid.parsed.status is models.Status.INVALID_REQUEST
    assert [e.pointer for e in invalid.parsed.errors] == ["/req_id"]

    alive = health_route.sync_detailed(client=client.Client(base_url=url, raise_on_unexpected_status=True))
    assert type(alive.parsed) is models.Health and alive.parsed.status is models.Status.SUCCESS


def test_the_gateway_client_calls_a_real_gateway(generated, gateway):
    call_with_generated_client(load(generated, "gateway.json"), gateway.url,
                               GATEWAY_TOKENS["SERVICE_GATEWAY_AUTH_TOKEN"], health="healthz")


def test_the_model_server_client_calls_a_real_model_server(generated, mobilenet):
    call_with_generated_client(load(generated, "model-MOBILENETV2.json"), mobilenet.url, mobilenet.token,
                               health="ready")
