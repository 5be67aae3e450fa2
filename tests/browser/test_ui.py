"""The supervisor's web page in a real browser (Playwright driving Debian's chromium) against a real stack.

The models are the real plugins with small random-init configs (demo
weights): MOBILENETV2, YOLOV8 at a 64-pixel input, a 16x16 DDPM with a
50-step schedule, SAM_AMG's tiny architecture with 4x4 point prompts, and
the test-only TESTFAULTS (async) for the job view.  Every test saves a
screenshot under ``test-artifacts/``; the last one checks that the page
logged no console error and raised no exception after the login.

The tests share one browser page; each that needs the console takes the
``logged_in`` fixture, which logs in when the page has not, so that every
test passes alone (``-k``) as well as after the others.
"""

from __future__ import annotations

import base64
import io
import json
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from PIL import Image
from playwright.sync_api import expect, sync_playwright

from tests.support.http import get, post
from tests.support.images import b64, image_bytes
from tests.support.processes import REPO
from tests.support.stack import ready_stack, stop_cleanly

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-quic"]
ARTIFACTS = REPO / "test-artifacts"

MODELS = {
    "MOBILENETV2": {"backend": {"optimize": "channels_last"}},  # a mode the row names (the others: eager)
    "YOLOV8": {"model": {"imgsz": 64}},
    "DDPM": {"model": {"sample_size": 16, "block_out_channels": [16, 32], "num_train_timesteps": 50, "attention": False}},
    "SAM_AMG": {"model": {"points_per_side": 4}},
    "TESTFAULTS": {"async_enabled": True},
}
#: SAM_AMG params under which the demo weights give masks (the defaults filter every one out).
SAM_LOW = {"pred_iou_thresh": 0, "stability_score_thresh": 0, "box_nms_thresh": 1}


#: TESTFAULTS runs two replicas: their rows, buttons, charts and logs, and its jobs through the gateway.
REPLICAS = {"TESTFAULTS": 2}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = ready_stack(tmp_path_factory.mktemp("ui"), MODELS, replicas=REPLICAS)
    yield s
    stop_cleanly(s)


@pytest.fixture(scope="module")
def picture(tmp_path_factory):
    path = tmp_path_factory.mktemp("pictures") / "picture.png"
    path.write_bytes(image_bytes(width=300, height=200, seed=11))
    return path


@contextmanager
def watched_page(height: int) -> Iterator:
    """A chromium page 1280 px wide that records its console errors and uncaught exceptions in ``page.problems``."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": height})
        page = context.new_page()
        page.set_default_timeout(30000)
        page.problems = []  # console errors and uncaught exceptions
        page.on("console", lambda m: page.problems.append(f"console: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: page.problems.append(f"exception: {e}"))
        try:
            yield page
        finally:
            context.close()
            browser.close()


@pytest.fixture(scope="module")
def page(stack):
    with watched_page(1400) as page:
        yield page


@pytest.fixture
def logged_in(page, stack):
    """The page shows the console: logged in through the form with the management token, once per page.

    The token stays in the browser (localStorage), so after the first login
    this only checks that the console is there.
    """
    if not page.url.startswith(stack.url):
        page.goto(stack.url + "/")
        expect(page.locator("#login")).to_be_visible()
        page.fill("#token-input", stack.env["SERVICE_API_TOKEN"])
        page.click("#token-form button")
    expect(page.locator("#console")).to_be_visible()


def row(page, model_id):
    return page.locator(f'#catalog tr.model[data-id="{model_id}"]')


def replica_row(page, model_id, index):
    return page.locator(f'#catalog tr.replica[data-id="{model_id}"][data-replica="{index}"]')


def charts(page, model_id):
    return page.locator(f'#catalog tr.figures[data-for="{model_id}"] .chart')


def shot(page, name):
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"ui-{name}.png"), full_page=True)


def through_gateway(stack, model_id, body):
    reply = post(f"{stack.gateway}/v1/models/{model_id}/infer", body, headers={"Authorization": f"Bearer {stack.key}"},
                 timeout=120)
    assert reply.status == 200, reply.body[:300]
    return reply.json["results"][0]["data"]


#: The pixels of a result canvas next to those of the photo drawn alone (the page's preview image):
#: ``changed[y][x]`` is 1 where the canvas differs from the photo; ``at`` the canvas RGB at ``points``.
CANVAS_VS_PHOTO = """
async ({selector, points}) => {
  const canvas = document.querySelector(selector);
  const photo = await new Promise((ok) => {
    const i = new Image(); i.onload = () => ok(i); i.src = document.querySelector("#try-preview").src; });
  const w = canvas.width, h = canvas.height;
  const ref = document.createElement("canvas"); ref.width = w; ref.height = h;
  ref.getContext("2d").drawImage(photo, 0, 0);
  const a = canvas.getContext("2d").getImageData(0, 0, w, h).data;
  const b = ref.getContext("2d").getImageData(0, 0, w, h).data;
  const changed = [];
  for (let y = 0; y < h; y += 1) {
    const line = [];
    for (let x = 0; x < w; x += 1) {
      const q = 4 * (y * w + x);
      line.push(a[q] !== b[q] || a[q + 1] !== b[q + 1] || a[q + 2] !== b[q + 2] ? 1 : 0);
    }
    changed.push(line);
  }
  const at = points.map(([x, y]) => Array.from(a.slice(4 * (y * w + x), 4 * (y * w + x) + 3)));
  return {width: w, height: h, changed, at};
}
"""


def canvas_vs_photo(page, selector, points=()):
    got = page.evaluate(CANVAS_VS_PHOTO, {"selector": selector, "points": [list(p) for p in points]})
    return np.array(got["changed"], dtype=bool), [tuple(rgb) for rgb in got["at"]]


def css_rgb(text):
    """``rgb(r, g, b)`` as a tuple."""
    return tuple(int(v) for v in text[text.index("(") + 1:text.index(")")].split(","))[:3]


def choose(page, model_id):
    page.select_option("#try-model", model_id)
    expect(page.locator("#try-params")).to_have_value("")


def test_asks_for_the_token_then_lists_the_catalog(page, stack):
    page.goto(stack.url + "/")
    page.evaluate("() => localStorage.clear()")  # a token left by an earlier test: log out
    page.reload()
    expect(page.locator("#login")).to_be_visible()
    page.fill("#token-input", "wrong-token")
    page.click("#token-form button")
    expect(page.locator("#login-error")).to_have_text("The token was refused.")
    page.reload()  # a refused token is not kept
    expect(page.locator("#login")).to_be_visible()
    assert page.evaluate("() => localStorage.length") == 0
    page.fill("#token-input", "t\u00f6k\u20acn")  # no header can carry it: fetch threw "Cannot reach the supervisor"
    page.click("#token-form button")
    expect(page.locator("#login-error")).to_have_text("The token was refused: it is printable ASCII, without spaces.")
    assert page.evaluate("() => localStorage.length") == 0
    page.fill("#token-input", "   ")  # nothing to send: asked for, not "refused" (a UI probe)
    page.click("#token-form button")
    expect(page.locator("#login-error")).to_have_text("Enter the management token (SERVICE_API_TOKEN).")
    page.fill("#token-input", stack.env["SERVICE_API_TOKEN"])
    page.click("#token-form button")
    expect(page.locator("#console")).to_be_visible()
    for model_id in MODELS:
        expect(row(page, model_id).locator(".state")).to_have_text("running")
        expect(row(page, model_id).locator(".ready")).to_have_text("yes")
    expect(row(page, "MOBILENETV2").locator(".port")).to_have_text(str(stack.model_ports["MOBILENETV2"]))
    expect(page.locator("#gateway-state")).to_contain_text("running")
    page.reload()  # the token stays in the browser
    expect(page.locator("#console")).to_be_visible()
    page.problems.clear()  # the refused token's 401 was the browser's console error; none from here on
    expect(page.locator('link[rel="icon"]')).to_have_attribute("href", "/ui/favicon.svg")
    assert get(stack.url + "/ui/favicon.svg").headers.get("content-type") == "image/svg+xml"


def test_try_it_starts_on_the_first_classifier_with_its_defaults_and_names_demo_weights(page, logged_in, stack):
    assert page.eval_on_selector_all("#try-model option", "os => os.map(o => o.value)")[0] == "DDPM"
    expect(page.locator("#try-model")).to_have_value("MOBILENETV2")
    expect(page.locator("#try-params")).to_have_attribute("placeholder", '{"top_k":5}')
    # Every model here runs on random-init weights: named on its row, and "Try it" says so.
    for model_id in MODELS:
        if model_id != "TESTFAULTS":
            expect(row(page, model_id).locator(".weights")).to_have_text("demo weights", timeout=20000)
    expect(page.locator("#try-demo")).to_be_visible()
    expect(page.locator("#try-demo")).to_have_text("demo weights: outputs are random")
    # Each row names the execution mode its model server reports (service_model_info, through the series).
    expect(row(page, "MOBILENETV2").locator(".task .mode")).to_have_text(" · channels_last", timeout=20000)
    expect(row(page, "YOLOV8").locator(".task .mode")).to_have_text(" · eager", timeout=20000)
    expect(row(page, "MOBILENETV2").locator(".task")).to_have_text("image-classification · channels_last")
    # Each model row has its charts; the async ones also the jobs.
    names = charts(page, "MOBILENETV2").evaluate_all("cs => cs.map(c => c.dataset.figure)")
    assert names == ["rps", "latency", "batch", "queue"]
    expect(charts(page, "DDPM")).to_have_count(5)
    expect(charts(page, "DDPM").last).to_have_attribute("data-figure", "jobs")
    gateway = page.locator("#gateway-charts .chart").evaluate_all("cs => cs.map(c => c.dataset.figure)")
    assert gateway == ["rps_by_route", "rejections", "upstream_errors"]


def test_stop_and_start_with_the_buttons(page, logged_in, stack):
    # On TESTFAULTS: the buttons act alike on every row, and it starts in about a third of MOBILENETV2's time.
    target = row(page, "TESTFAULTS")
    target.locator('button[data-action="stop"]').click()
    expect(page.locator("#action-message")).to_have_text("TESTFAULTS: stop done", timeout=60000)
    expect(target.locator(".state")).to_have_text("stopped")
    assert stack.child("TESTFAULTS")["state"] == "stopped"
    target.locator('button[data-action="start"]').click()
    expect(page.locator("#action-message")).to_have_text("TESTFAULTS: start done", timeout=120000)
    expect(target.locator(".state")).to_have_text("running")
    expect(target.locator(".ready")).to_have_text("yes")


def test_sends_an_image_to_mobilenetv2_and_shows_its_top_class(page, logged_in, stack, picture):
    expected = through_gateway(stack, "MOBILENETV2", {"images": [b64(picture.read_bytes())]})["category"]
    choose(page, "MOBILENETV2")
    page.set_input_files("#try-file", str(picture))
    expect(page.locator("#try-preview")).to_be_visible()
    page.click("#try-run")
    expect(page.locator("#try-result .top-class")).to_have_text(expected, timeout=30000)
    expect(page.locator("#try-result .classes li")).to_have_count(5)
    expect(page.locator("#try-demo")).to_be_visible()
    shot(page, "classification")


def test_the_log_view_has_no_probes_and_filters_by_level_and_text(page, logged_in, stack):
    # A request of this test's own, found by its id (the access line's rid=): other tests' requests may be there.
    rid = f"log-view-{uuid.uuid4().hex}"
    through_gateway(stack, "MOBILENETV2", {"images": [b64(image_bytes(width=32, height=32))], "req_id": rid})
    page.select_option("#log-server", "MOBILENETV2")
    lines = page.locator("#log-lines")
    expect(lines).to_contain_text(f"rid={rid}", timeout=15000)
    # The supervisor probes /ready every 2 s and scrapes /metrics every 5 s: none of it is in the log.
    text = lines.inner_text()
    assert "GET /ready" not in text and "GET /metrics" not in text and "GET /healthz" not in text
    visible = page.locator("#log-lines span:not(.hidden)")
    page.fill("#log-filter", rid)
    expect(visible).to_have_count(1)
    expect(visible.first).to_contain_text("POST /mobilenetv2/predict 200")
    expect(page.locator("#log-count")).to_contain_text("1 of ")
    page.select_option("#log-level", "warn")  # the access line is info: hidden too
    expect(visible).to_have_count(0)
    page.fill("#log-filter", "")
    levels = visible.evaluate_all("spans => spans.map(s => s.entry.level)")
    assert set(levels) <= {"warn", "error", "critical"}
    page.select_option("#log-level", "debug")
    expect(page.locator("#log-lines span.hidden")).to_have_count(0)
    shot(page, "logs")
    # The page's timed reads (this log every 1.5 s, the status every 2 s) are logged at debug level: with a tab
    # open they were a line every second or so in the supervisor's output, the quick start's terminal.
    output = stack.supervisor.output()
    assert "GET /api/v1/servers/MOBILENETV2/logs" not in output, output[-2000:]


def test_detections_are_boxes_above_the_threshold_with_a_table(page, logged_in, stack, picture):
    choose(page, "MOBILENETV2")  # the photo chosen for another model ...
    page.set_input_files("#try-file", str(picture))
    expect(page.locator("#try-preview")).to_be_visible()
    choose(page, "YOLOV8")
    expect(page.locator("#try-params")).to_have_attribute(
        "placeholder", '{"score_threshold":0.25,"nms_threshold":0.7,"top_k":300}')
    expect(page.locator("#try-preview")).to_be_visible()  # ... is kept by a detector
    params = {"score_threshold": 0.05}
    detections = through_gateway(stack, "YOLOV8", {"images": [b64(picture.read_bytes())], "params": params,
                                                   "options": {"max_results": 20}})
    shown = [d for d in detections if d["score"] > 0.05][:20]
    assert shown, "the demo weights give no detection above 0.05 on this picture: choose another"
    page.fill("#try-params", json.dumps(params))
    page.click("#try-run")
    canvas = page.locator("#try-result canvas.detections")
    expect(canvas).to_have_attribute("data-count", str(len(shown)))
    table = page.locator("#try-result table.detections-table tbody tr")
    expect(table).to_have_count(len(shown))
    for i, d in enumerate(shown):
        cells = table.nth(i).locator("td")
        expect(cells.nth(2)).to_have_text(d["category"])
        expect(cells.nth(3)).to_have_text(f"{d['score']:.3f}")
    expect(page.locator("#try-result .caption")).to_have_text(
        f"{len(shown)} detection{'' if len(shown) == 1 else 's'} above score 0.05 (at most 20 shown)")
    # The boxes are drawn on the photo: the bottom edge of each box is painted (the last one, drawn on top
    # of the others, in its own colour, that of its table swatch), and nothing is painted away from the
    # boxes and their labels (a label is at most 200 px wide and its band above the box or inside it).
    width, height = 300, 200

    def bottom_middle(d):
        x1, _, x2, y2 = d["bbox"]
        return min(int((x1 + x2) / 2), width - 1), min(int(y2), height - 1)

    changed, at = canvas_vs_photo(page, "#try-result canvas.detections", [bottom_middle(d) for d in shown])
    assert changed.shape == (height, width)
    assert all(changed[y, x] for x, y in map(bottom_middle, shown))
    swatch = css_rgb(table.nth(len(shown) - 1).locator("td i").evaluate("i => getComputedStyle(i).backgroundColor"))
    assert max(abs(a - b) for a, b in zip(at[-1], swatch)) <= 2, (at[-1], swatch)
    near = np.zeros_like(changed)
    for d in shown:
        x1, y1, x2, y2 = d["bbox"]
        near[max(0, int(y1) - 22):int(y2) + 3, max(0, int(x1) - 2):max(int(x2), int(x1) + 200) + 3] = True
    assert changed.any() and not (changed & ~near).any()
    shot(page, "detection")


def test_a_generation_model_drops_the_photo_and_shows_its_image_scaled_up(page, logged_in, stack):
    choose(page, "DDPM")
    expect(page.locator("#try-preview")).to_be_hidden()
    expect(page.locator("#drop")).to_be_hidden()
    expect(page.locator("#try-note")).to_contain_text("the pixels of a photo are ignored")
    expect(page.locator("#try-result")).to_be_empty()  # the previous result went with the model
    expect(page.locator("#try-params")).to_have_attribute("placeholder", '{"timesteps":50}')
    page.fill("#try-params", '{"timesteps": 5, "seed": 1}')
    page.click("#try-run")
    expect(page.locator("#job-state")).to_have_text("done", timeout=60000)
    image = page.locator("#try-result img.generated")
    expect(image).to_be_visible()
    assert image.evaluate("i => [i.naturalWidth, i.naturalHeight, i.width, i.height]") == [16, 16, 256, 256]
    assert image.evaluate("i => getComputedStyle(i).imageRendering") == "pixelated"
    expect(page.locator("#try-result .caption")).to_have_text("16×16 px, shown ×16; seed 1")
    # The image shown is the sample itself: the same seed and steps through the gateway give the same PNG,
    # and the pixels the browser decoded from it are those pixels.
    expected = through_gateway(stack, "DDPM", {"images": [b64(image_bytes(width=8, height=8))],
                                               "params": {"timesteps": 5, "seed": 1}})
    assert image.get_attribute("src") == f"data:image/png;base64,{expected['image']}"
    drawn = image.evaluate("""i => { const c = document.createElement("canvas"); c.width = 16; c.height = 16;
        const x = c.getContext("2d"); x.drawImage(i, 0, 0); return Array.from(x.getImageData(0, 0, 16, 16).data); }""")
    pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(expected["image"]))).convert("RGBA"))
    assert np.array_equal(np.array(drawn, dtype=np.uint8).reshape(16, 16, 4), pixels)
    assert len(np.unique(pixels.reshape(-1, 4), axis=0)) > 1  # not a blank square
    shot(page, "generation")


def test_sam_masks_or_a_plain_zero(page, logged_in, stack, picture):
    choose(page, "SAM_AMG")
    expect(page.locator("#try-note")).to_be_hidden()
    page.set_input_files("#try-file", str(picture))
    expect(page.locator("#try-preview")).to_be_visible()
    page.click("#try-run")  # the defaults: the demo weights' masks are all filtered out
    expect(page.locator("#job-state")).to_have_text("done", timeout=60000)
    expect(page.locator("#try-result .masks-none")).to_have_text("0 masks at these thresholds")
    expect(page.locator("#try-result canvas")).to_have_count(0)
    shot(page, "masks-none")
    masks = through_gateway(stack, "SAM_AMG", {"images": [b64(picture.read_bytes())], "params": SAM_LOW,
                                               "options": {"max_results": 20}})
    assert masks
    page.fill("#try-params", json.dumps(SAM_LOW))
    page.click("#try-run")
    expect(page.locator("#job-state")).to_have_text("done", timeout=60000)
    expect(page.locator("#try-result .masks-count")).to_have_text(f"{len(masks)} mask{'' if len(masks) == 1 else 's'}")
    canvas = page.locator("#try-result canvas.masks")
    expect(canvas).to_have_attribute("data-count", str(len(masks)))
    expect(canvas).to_have_attribute("data-drawn", str(len(masks)))
    # Every mask is painted on the photo, and nothing outside the masks is.
    changed, _ = canvas_vs_photo(page, "#try-result canvas.masks")
    bitmaps = [np.asarray(Image.open(io.BytesIO(base64.b64decode(m["segmentation"]))).convert("L")) > 127
               for m in masks]
    assert all(b.shape == changed.shape == (200, 300) for b in bitmaps)
    assert all((changed & b).any() for b in bitmaps)
    assert not (changed & ~np.logical_or.reduce(bitmaps)).any()
    shot(page, "masks")


def run_testfaults_job(page, picture) -> None:
    """Run a job of TESTFAULTS (an async model) from "Try it" on ``picture``, each of its batches 200 ms."""
    choose(page, "TESTFAULTS")
    page.set_input_files("#try-file", str(picture))
    expect(page.locator("#try-preview")).to_be_visible()
    page.fill("#try-params", '{"sleep_ms": 200}')
    page.click("#try-run")


def test_a_job_shows_its_progress_bar_and_eta(page, logged_in, stack, picture):
    """The wait replies are given a ``progress`` field here (TESTFAULTS reports none): how the page draws one."""
    release = {"done": False}

    def with_progress(route):
        if release["done"]:
            route.continue_()
            return
        job_id = route.request.url.split("/jobs/")[1].split("/")[0]
        body = {"job_id": job_id, "state": "running", "elapsed_ms": 3000.0, "progress": {"step": 3, "steps": 12}}
        route.fulfill(status=200, content_type="application/json", body=json.dumps(body),
                      headers={"Access-Control-Allow-Origin": "*"})

    page.route("**/v1/models/TESTFAULTS/jobs/*/wait*", with_progress)
    try:
        run_testfaults_job(page, picture)
        expect(page.locator("#job-progress")).to_be_visible()
        expect(page.locator("#job-eta")).to_have_text("step 3 of 12 · about 9.0 s left")
        assert page.locator("#job-progress progress").evaluate("p => [p.value, p.max]") == [3, 12]
        shot(page, "job-progress")
        release["done"] = True
        expect(page.locator("#job-state")).to_have_text("done", timeout=60000)
        expect(page.locator("#try-raw pre")).to_contain_text('"status": 0')
        expect(page.locator("#job-eta")).to_have_text("all 12 steps")
        assert page.locator("#job-progress progress").evaluate("p => p.value") == 12
    finally:
        page.unroute("**/v1/models/TESTFAULTS/jobs/*/wait*")


def test_a_job_lost_with_its_model_server_stops_saying_it_runs(page, logged_in, stack, picture):
    """A UI probe: DDPM killed at step 323, the error was shown, but the job line stayed "running · step 323 of
    1000 · about 4.3 s left" for good. The wait's 502 ends the line: no state it no longer has, no time left."""
    answers = iter([200])

    def then_lost(route):
        job_id = route.request.url.split("/jobs/")[1].split("/")[0]
        if next(answers, 502) == 200:
            body = {"job_id": job_id, "state": "running", "elapsed_ms": 3000.0, "progress": {"step": 3, "steps": 12}}
        else:
            body = {"status": 502, "status_str": "BAD_GATEWAY", "task_id": job_id, "results": [],
                    "error": "model server TESTFAULTS: closed the connection without answering"}
        route.fulfill(status=200 if "progress" in body else 502, content_type="application/json",
                      body=json.dumps(body), headers={"Access-Control-Allow-Origin": "*"})

    page.route("**/v1/models/TESTFAULTS/jobs/*/wait*", then_lost)
    try:
        run_testfaults_job(page, picture)
        expect(page.locator("#try-error")).to_contain_text("closed the connection without answering")
        expect(page.locator("#job-state")).to_have_text("unknown (HTTP 502)")
        expect(page.locator("#job-eta")).to_have_text("step 3 of 12")
        # The 502 asked for here is the browser's console error, and the page is the module's: none from here on.
        expected = "console: Failed to load resource: the server responded with a status of 502 (Bad Gateway)"
        assert expected in page.problems
        page.problems.remove(expected)
    finally:
        page.unroute("**/v1/models/TESTFAULTS/jobs/*/wait*")


def test_under_load_the_charts_show_traffic(page, logged_in, stack, picture):
    body = {"images": [b64(image_bytes(width=32, height=32, seed=3))]}
    deadline = time.monotonic() + 60
    rps = charts(page, "MOBILENETV2").and_(page.locator('[data-figure="rps"]'))
    by_route = page.locator('#gateway-charts .chart[data-figure="rps_by_route"]')
    while time.monotonic() < deadline:
        for _ in range(10):
            through_gateway(stack, "MOBILENETV2", body)
        if float(rps.get_attribute("data-max")) > 0 and float(by_route.get_attribute("data-max")) > 0:
            break
        page.wait_for_timeout(1000)
    assert float(rps.get_attribute("data-max")) > 0
    assert float(by_route.get_attribute("data-max")) > 0
    expect(by_route.locator(".legend")).to_contain_text("infer")  # by route: no key names on the supervisor
    latency = charts(page, "MOBILENETV2").and_(page.locator('[data-figure="latency"]'))
    assert float(latency.get_attribute("data-max")) > 0
    assert rps.locator("svg path").count() == 1
    series = get(stack.url + "/api/v1/series", headers=stack.auth).json
    assert max(v or 0 for v in series["servers"]["MOBILENETV2"]["rps"]) > 0
    assert series["servers"]["MOBILENETV2"]["version"] == "random-init-seed0"
    one = get(stack.url + "/api/v1/servers/MOBILENETV2/series", headers=stack.auth).json
    assert one["id"] == "MOBILENETV2" and one["interval_s"] == 5.0 and one["window_s"] == 600.0
    assert len(one["t"]) == len(one["rps"]) == len(one["p99_ms"]) == len(one["queue_depth"]) > 0
    shot(page, "charts")


def test_replicas_are_listed_under_their_model_with_their_own_buttons_charts_and_logs(page, logged_in, stack):
    ports = stack.extra["replica_ports"]["TESTFAULTS"]
    model = row(page, "TESTFAULTS")
    expect(model.locator(".port")).to_have_text(f"{ports[0]}, {ports[1]}")
    expect(model.locator(".replica-count")).to_have_text(" 2 replicas, 2 ready")
    expect(model.locator(".state")).to_have_text("running")
    for i, port in enumerate(ports):
        sub = replica_row(page, "TESTFAULTS", i)
        expect(sub.locator(".id")).to_have_text(f"replica {i}")
        expect(sub.locator(".port")).to_have_text(str(port))
        expect(sub.locator(".state")).to_have_text("running")
        expect(sub.locator(".ready")).to_have_text("yes")
        expect(page.locator(f'#catalog tr.figures[data-for="TESTFAULTS.{i}"] .chart')).to_have_count(5)
    expect(page.locator('#catalog tr.figures[data-for="TESTFAULTS"]')).to_have_count(0)
    # Replica 1's own restart: replica 0 keeps its process.
    before = stack.child("TESTFAULTS")["replicas"]
    replica_row(page, "TESTFAULTS", 1).locator('button[data-action="restart"]').click()
    expect(page.locator("#action-message")).to_have_text("TESTFAULTS replica 1: restart done", timeout=120000)
    after = stack.child("TESTFAULTS")["replicas"]
    assert after[0]["pid"] == before[0]["pid"] and after[0]["restarts"] == before[0]["restarts"]
    assert after[1]["pid"] != before[1]["pid"] and after[1]["restarts"] == before[1]["restarts"] + 1
    expect(replica_row(page, "TESTFAULTS", 1).locator(".restarts")).to_have_text(str(after[1]["restarts"]))
    expect(model.locator(".restarts")).to_have_text(str(after[0]["restarts"] + after[1]["restarts"]))
    # Each replica's log is its own choice in the log view.
    options = page.eval_on_selector_all("#log-server option", "os => os.map(o => [o.value, o.textContent])")
    assert ["TESTFAULTS/1", "TESTFAULTS replica 1"] in options and ["TESTFAULTS/0", "TESTFAULTS replica 0"] in options
    assert "TESTFAULTS" not in [value for value, _ in options]
    page.select_option("#log-server", "TESTFAULTS/1")
    expect(page.locator("#log-lines")).to_contain_text(f"listening on 127.0.0.1:{ports[1]};", timeout=15000)
    assert f"listening on 127.0.0.1:{ports[0]};" not in page.locator("#log-lines").inner_text()
    shot(page, "replicas")


def test_the_openapi_document_of_a_model_comes_from_its_running_server(stack):
    reply = get(stack.url + "/api/v1/servers/DDPM/openapi", headers=stack.auth)
    assert reply.status == 200
    params = reply.json["openapi"]["components"]["schemas"]["DDPM_Params"]["properties"]
    assert params["timesteps"]["default"] == 50 and params["timesteps"]["maximum"] == 50  # this config, not the shipped
    gateway = get(stack.url + "/api/v1/servers/__gateway/openapi", headers=stack.auth)
    assert gateway.status == 404 and gateway.json["ok"] is False
    assert get(stack.url + "/api/v1/servers/DDPM/openapi").status == 401


def test_no_console_errors(page, logged_in, stack):
    """No console error and no uncaught exception since the login, after the page's every timer has run.

    Alone, this test logs in and waits for the status refresh (rows ready),
    the series refresh (the gateway's charts drawn) and the log follower
    (the gateway's log shown) before it looks.
    """
    for model_id in MODELS:
        expect(row(page, model_id).locator(".ready")).to_have_text("yes", timeout=60000)
    expect(page.locator('#gateway-charts .chart[data-figure="rps_by_route"]')).to_have_attribute(
        "data-max", re.compile(r"."), timeout=30000)
    page.select_option("#log-server", "__gateway")
    expect(page.locator("#log-lines span").first).to_be_attached(timeout=15000)
    assert page.problems == []
