"""Hostile image shapes: a few-byte PNG of 8000x1 pixels must cost every
catalog model a bounded amount of memory and a definite per-item answer.

The check runs against one real model-server process per model: its peak
resident set (``VmHWM`` in ``/proc/<pid>/status``) is read after a normal
image has been served (the model is warm) and again after every extreme
image: it may not grow by more than ``PEAK_RSS_GROWTH``.  Before the
preprocessing was bounded, one 8000x1 PNG (108 bytes) grew MOBILENETV2's
peak by 2003 MiB (its short side was resized to 256 with no bound on the
long side: a 2,048,000x256 intermediate) and SAM_AMG answered ENGINE_ERROR
(500) for it.

tests/chaos/test_extreme_images.py runs it on the shipped configs of the
models that decode pixels; the generative models, which never decode them,
run it on the servers tests/integration/test_zoo_diffusion.py starts anyway.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.images import b64, image_bytes
from tests.support.processes import Proc
from tests.support.zoo import assert_ok, infer

#: W x H of the hostile images: one pixel (or two) along one side.
EXTREME_SHAPES = [(8000, 1), (1, 8000), (20000, 2)]

#: The catalog models that ignore the image of the envelope (item status 0 for any image).
GENERATIVE = ("CLS_COND_DDIM", "DDIM", "DDPM", "LDM")

#: Per model, the item status of every extreme image.  0: the generative
#: models never decode the pixels.  5 (INVALID_IMAGE): the model's resize
#: would be unbounded or empty.  MOBILENETV2 resizes the short side to 256
#: (8000x1 would be 2,048,000x256 pixels, past svc.model.images.MAX_RESIZED_PIXELS);
#: YOLOV8 letterboxes into 640x640 and SAM_AMG resizes the longest side to
#: 256 (8000x1 would keep 0 pixels along the short side).
EXPECTED_STATUS = {
    **{model_id: 0 for model_id in GENERATIVE},
    "MOBILENETV2": 5,
    "SAM_AMG": 5,
    "YOLOV8": 5,
}

#: How much the peak RSS may grow over a warm server's: decoding the extreme
#: images themselves takes well under a megabyte.
PEAK_RSS_GROWTH = 64 * 2**20


def peak_rss(proc: Proc) -> int:
    """The process's peak resident set size in bytes (``VmHWM``)."""
    for line in Path(f"/proc/{proc.popen.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            value, unit = line.split()[1:3]
            assert unit == "kB", line
            return int(value) * 1024
    raise AssertionError(f"no VmHWM in /proc/{proc.popen.pid}/status")


def normal_image() -> str:
    return b64(image_bytes(width=96, height=64, seed=7))


def check_extreme_aspect_ratios(proc: Proc, model_id: str, uri: str, params: dict) -> None:
    """Promise: an image of W x 1 or 1 x H pixels (8000x1, 1x8000, 20000x2)
    gets its own exact item status (0 where the model ignores the pixels,
    else 5 INVALID_IMAGE with an error naming the aspect ratio), before any
    large allocation: it raises the model server's peak RSS by at most
    PEAK_RSS_GROWTH; the process keeps serving normal images afterwards."""
    assert_ok(infer(proc, uri, {"images": [normal_image()], "params": params}))
    baseline = peak_rss(proc)
    expected = EXPECTED_STATUS[model_id]

    for width, height in EXTREME_SHAPES:
        raw = image_bytes(width=width, height=height)
        assert len(raw) < 1000  # a few bytes on the wire
        reply = infer(proc, uri, {"images": [b64(raw)], "params": params})
        grown = peak_rss(proc) - baseline
        assert grown <= PEAK_RSS_GROWTH, f"{model_id}: a {width}x{height} image grew the peak RSS by {grown / 2**20:.0f} MiB"
        body = reply.json
        if expected == 0:
            assert reply.status == 200 and body["status"] == 0, body
            assert [item["status"] for item in body["results"]] == [0]
            assert body["results"][0]["data"] is not None
        else:
            assert reply.status == 400 and body["status"] == 5 and body["status_str"] == "INVALID_IMAGE", body
            [item] = body["results"]
            assert item["status"] == 5 and item["data"] is None
            assert item["error"].startswith(f"image is {width}x{height}: "), item
            assert "aspect ratio is too extreme" in item["error"], item

    # A request mixing the extreme shapes with a normal image: each item keeps its own status.
    images = [b64(image_bytes(width=w, height=h)) for w, h in EXTREME_SHAPES] + [normal_image()]
    reply = infer(proc, uri, {"images": images, "params": params})
    assert reply.status == 200 and reply.json["status"] == 0, reply.json
    assert [item["status"] for item in reply.json["results"]] == [expected] * len(EXTREME_SHAPES) + [0]
    grown = peak_rss(proc) - baseline
    assert grown <= PEAK_RSS_GROWTH, f"{model_id}: the mixed request grew the peak RSS by {grown / 2**20:.0f} MiB"

    assert proc.alive()
    assert_ok(infer(proc, uri, {"images": [normal_image()], "params": params}))
