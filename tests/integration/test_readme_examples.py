"""The README's "Try it" shell examples, run as written with bash against a real stack.

The fenced ``sh`` blocks of the section are taken from README.md itself: the
first one (export the tokens and the gateway's address) is prepended to each
of the others, which run in a temp folder holding ``secrets/local.env`` with
the stack's tokens and API key, ``.venv`` (this interpreter's environment)
and ``some.jpg``, a photo-like JPEG of about 1 MB (its base64 is longer than
one command-line argument may be, which broke the former curl example).
Every block must exit 0 and print what the text around it says.
"""

import io
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tests.support.processes import REPO, child_env
from tests.support.stack import build_stack, stop_stack

MAX_ARG_STRLEN = 128 * 1024  # Linux: the longest single command-line argument


def try_it_blocks() -> list[str]:
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Try it\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)\n```", section, re.S)


def photo_jpeg(width: int = 2000, height: int = 1500) -> bytes:
    """Smooth colour waves plus sensor-like noise: compresses like a photo, not like a flat test image."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    waves = np.stack([128 + 100 * np.sin(x / 180 + c) * np.cos(y / 140 - c) for c in (0.0, 1.3, 2.6)], axis=-1)
    pixels = np.clip(waves + rng.normal(0, 18, (height, width, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=85)
    return buf.getvalue()


def json_documents(text: str) -> list:
    """The JSON values printed one after another (svcctl pretty-prints, curl prints one line)."""
    decoder, docs, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return docs
        doc, i = decoder.raw_decode(text, i)
        docs.append(doc)


def assert_envelope(doc: dict, *, top_k: int | None = None) -> None:
    assert (doc["status"], doc["status_str"], doc["partial"]) == (0, "SUCCESS", False), doc
    assert [item["status"] for item in doc["results"]] == [0]
    data = doc["results"][0]["data"]
    if top_k is not None:
        assert len(data["scores"]) == top_k and isinstance(data["category"], str)
    else:
        assert data["image"] and data["width"] == data["height"] == 32


def classified(docs: list) -> None:
    assert len(docs) == 1
    assert_envelope(docs[0], top_k=3)


def job_done(docs: list) -> None:
    waited, result = docs
    assert waited["state"] == "done" and waited["job_id"].startswith("job_"), waited
    assert_envelope(result)


#: What each block after the first prints, in README order (the text around each block says the same).
EXPECTED = [classified, classified, classified, job_done]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = build_stack(tmp_path_factory.mktemp("stack"), {"MOBILENETV2": {}, "DDPM": {}})
    try:
        for model_id in ("MOBILENETV2", "DDPM"):
            s.wait_for(model_id, lambda c: c["ready"], timeout=180)
        s.wait_for("__gateway", lambda c: c["ready"], timeout=60)
        yield s
    finally:
        stop_stack(s)


@pytest.fixture
def folder(tmp_path, stack):
    """The user's checkout as the README assumes it: secrets, .venv and some.jpg."""
    (tmp_path / "secrets").mkdir()
    secrets = {**{k: v for k, v in stack.env.items() if v}, "SERVICE_API_KEY": stack.key}
    (tmp_path / "secrets" / "local.env").write_text("".join(f"{k}={v}\n" for k, v in secrets.items()))
    os.symlink(sys.prefix, tmp_path / ".venv")
    jpeg = photo_jpeg()
    (tmp_path / "some.jpg").write_bytes(jpeg)
    assert 900_000 <= len(jpeg) <= 1_300_000 and len(jpeg) * 4 // 3 > MAX_ARG_STRLEN
    return tmp_path


def test_the_blocks_are_the_ones_this_test_knows():
    blocks = try_it_blocks()
    assert len(blocks) == 1 + len(EXPECTED)
    assert "secrets/local.env" in blocks[0] and "SERVICE_GATEWAY_URL" in blocks[0]


@pytest.mark.parametrize("index", range(1, 1 + len(EXPECTED)))
def test_each_try_it_block_runs_as_written(folder, stack, index):
    blocks = try_it_blocks()
    script = blocks[0] + "\n" + blocks[index] + "\n"
    env = child_env({"SERVICE_GATEWAY_URL": stack.gateway},
                    drop=("SERVICE_API_KEY", "SERVICE_API_TOKEN", "SERVICE_GATEWAY_AUTH_TOKEN", "SERVICE_METRICS_TOKEN"))
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"block {index} exited {done.returncode}:\n{script}\n{done.stdout}\n{done.stderr}"
    EXPECTED[index - 1](json_documents(done.stdout))


def test_every_curl_block_reads_its_body_from_a_file():
    """The README's curl examples send the body with ``--data-binary @FILE``, never the image inline.

    The former example put the base64 on curl's command line, which a photo
    such as ``some.jpg`` here makes longer than one argument may be (the
    fixture checks the size, so a block that did it would fail above with
    E2BIG); this names the rule for the text itself: every curl command that
    sends a body names a file, and no block expands an image's base64 into
    an argument.
    """
    curls = [command for block in try_it_blocks()[1:]
             for command in re.split(r"\n(?!\s)", block.replace("\\\n", " ")) if command.lstrip().startswith("curl ")]
    assert len(curls) == 2, curls
    for command in curls:
        bodies = re.findall(r"(?:--data-binary|--data|-d)\s+(\S+)", command)
        assert bodies and all(body.startswith("@") for body in bodies), command
    assert not any("$(base64" in block or "`base64" in block for block in try_it_blocks()), try_it_blocks()
