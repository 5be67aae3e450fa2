"""The supervisor's web page in a real browser (Playwright driving Debian's chromium)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect, sync_playwright

from tests.support.images import image_bytes
from tests.support.processes import REPO
from tests.support.stack import build_stack, stop_stack

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-quic"]
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = build_stack(tmp_path_factory.mktemp("ui"), {"MOBILENETV2": {}, "TESTFAULTS": {"async_enabled": True}})
    for name in ("__gateway", "MOBILENETV2", "TESTFAULTS"):
        s.wait_for(name, lambda c: c["state"] == "running" and c["ready"])
    yield s
    code, survivors = stop_stack(s)
    assert code == 0 and survivors == []


@pytest.fixture(scope="module")
def page(stack, tmp_path_factory):
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 1400})
        page = context.new_page()
        page.set_default_timeout(30000)
        yield page
        context.close()
        browser.close()


def row(page, model_id):
    return page.locator(f'#catalog tr[data-id="{model_id}"]')


def test_asks_for_the_token_then_lists_the_catalog(page, stack):
    page.goto(stack.url + "/")
    expect(page.locator("#login")).to_be_visible()
    page.fill("#token-input", "wrong-token")
    page.click("#token-form button")
    expect(page.locator("#login-error")).to_contain_text("refused")
    page.fill("#token-input", stack.env["SERVICE_API_TOKEN"])
    page.click("#token-form button")
    expect(page.locator("#console")).to_be_visible()
    for model_id in ("MOBILENETV2", "TESTFAULTS"):
        expect(row(page, model_id).locator(".state")).to_have_text("running")
        expect(row(page, model_id).locator(".ready")).to_have_text("yes")
    expect(row(page, "MOBILENETV2").locator(".port")).to_have_text(str(stack.model_ports["MOBILENETV2"]))
    expect(page.locator("#gateway-state")).to_contain_text("running")
    page.reload()  # the token stays in the browser
    expect(page.locator("#console")).to_be_visible()


def test_stop_and_start_with_the_buttons(page, stack):
    target = row(page, "MOBILENETV2")
    target.locator('button[data-action="stop"]').click()
    expect(page.locator("#action-message")).to_have_text("MOBILENETV2: stop done", timeout=60000)
    expect(target.locator(".state")).to_have_text("stopped")
    assert stack.child("MOBILENETV2")["state"] == "stopped"
    target.locator('button[data-action="start"]').click()
    expect(page.locator("#action-message")).to_have_text("MOBILENETV2: start done", timeout=120000)
    expect(target.locator(".state")).to_have_text("running")
    expect(target.locator(".ready")).to_have_text("yes")


def test_follows_the_logs_of_a_server(page, stack):
    page.select_option("#log-server", "MOBILENETV2")
    expect(page.locator("#log-lines")).to_contain_text("ready", timeout=15000)


def test_sends_an_image_to_mobilenetv2_and_shows_its_top_class(page, stack, tmp_path):
    from tests.support.http import post
    from tests.support.images import b64

    picture = tmp_path / "picture.png"
    picture.write_bytes(image_bytes(width=300, height=200, seed=11))
    expected = post(stack.gateway + "/v1/models/MOBILENETV2/infer", {"images": [b64(picture.read_bytes())]},
                    headers={"Authorization": f"Bearer {stack.key}"}).json["results"][0]["data"]["category"]
    page.select_option("#try-model", "MOBILENETV2")
    page.set_input_files("#try-file", str(picture))
    expect(page.locator("#try-preview")).to_be_visible()
    page.click("#try-run")
    expect(page.locator("#try-result .top-class")).to_have_text(expected, timeout=30000)
    expect(page.locator("#try-result .classes li")).to_have_count(5)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "ui-classification.png"), full_page=True)


def test_runs_an_async_job_to_completion(page, stack):
    page.select_option("#try-model", "TESTFAULTS")
    page.fill("#try-params", '{"sleep_ms": 1500}')
    page.click("#try-run")
    expect(page.locator("#job")).to_be_visible()
    expect(page.locator("#job-state")).to_have_text("done", timeout=60000)
    expect(page.locator("#job-elapsed")).to_contain_text(" s")
    expect(page.locator("#try-raw pre")).to_contain_text('"status": 0')
    page.screenshot(path=str(ARTIFACTS / "ui-job.png"), full_page=True)
