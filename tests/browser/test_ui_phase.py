"""The web page shows what a starting model says it does, and stops showing it once the model runs.

A real stack (Playwright driving Debian's chromium, as ``test_ui.py``) with
TESTFAULTS loading for ten minutes (``[model] load_delay_ms``): its
``/ready`` answers 503 "the model is loading: building the model and loading
its weights", the supervisor's status shows that as the server's ``phase``,
and the page puts it next to the state.  Then the config loses the delay and
the Restart button restarts the model: once it runs, the phase is gone.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect, sync_playwright

from tests.browser.test_ui import ARGS, CHROMIUM, row, shot
from tests.support.processes import write_config
from tests.support.stack import build_stack, stop_cleanly

LOADING = "the model is loading: building the model and loading its weights"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = build_stack(tmp_path_factory.mktemp("ui-phase"), {"TESTFAULTS": {"model": {"load_delay_ms": 600000}}})
    s.wait_for("__gateway", lambda c: c["state"] == "running" and c["ready"], timeout=240)
    yield s
    stop_cleanly(s)


@pytest.fixture(scope="module")
def page(stack):
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(30000)
        # Console errors and uncaught exceptions: the starting model chosen in "Try it" is not asked for its
        # OpenAPI document (a 503, which the browser logged as an error) until it runs.
        page.problems = []
        page.on("console", lambda m: page.problems.append(f"console: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: page.problems.append(f"exception: {e}"))
        yield page
        context.close()
        browser.close()


def test_a_starting_model_shows_its_phase_until_it_runs(page, stack):
    # The status API says the phase first: the page has something to show.
    child = stack.wait_for("TESTFAULTS", lambda c: c["phase"] == LOADING, timeout=120)
    assert (child["state"], child["ready"]) == ("starting", False)
    page.goto(stack.url + "/")
    page.fill("#token-input", stack.env["SERVICE_API_TOKEN"])
    page.click("#token-form button")
    expect(page.locator("#console")).to_be_visible()
    model = row(page, "TESTFAULTS")
    expect(model.locator(".state")).to_have_text("starting")
    # Next to the state, without the "the model is loading: " every phase starts with; the whole reason as
    # the title; as text (a span with no element inside).
    expect(model.locator(".phase")).to_have_text(" — building the model and loading its weights")
    expect(model.locator(".phase")).to_have_attribute("title", LOADING)
    assert model.locator(".phase > *").count() == 0
    shot(page, "phase-starting")

    # The config without the delay, then Restart: the new process loads at once and runs.
    write_config(stack.root / "server", "TESTFAULTS", name="TESTFAULTS.toml", port=stack.model_ports["TESTFAULTS"])
    model.locator('[data-action="restart"]').click()
    expect(page.locator("#action-message")).to_have_text("TESTFAULTS: restart done", timeout=120000)
    expect(model).to_have_attribute("data-ready", "true", timeout=60000)
    expect(model.locator(".state")).to_have_text("running")
    expect(model.locator(".phase")).to_have_text("")
    expect(model.locator(".phase")).to_have_attribute("title", "")
    assert stack.child("TESTFAULTS")["phase"] is None
    shot(page, "phase-running")
    expect(page.locator("#try-params")).to_have_attribute("placeholder", '{"sleep_ms":0,"fail":"none"}')
    assert page.problems == []
