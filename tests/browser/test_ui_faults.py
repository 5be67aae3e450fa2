"""The web page when things go wrong: a second Connect, a supervisor that goes away or restarts, a bad image,
a model switched while a run is under way; and the page from the keyboard and in a narrow window.

A real stack (Playwright driving Debian's chromium, as ``test_ui.py``) of
MOBILENETV2 (a synchronous classifier) and TESTFAULTS (async, two replicas).
An unreachable supervisor, a rotated token and a restarted supervisor's log
are the browser's routes (``page.route``): what the page sees of them, without
stopping the stack.  Each test opens its own browser context (its own
localStorage), so that none depends on another's login.
"""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qs, urlparse

import pytest
from playwright.sync_api import expect, sync_playwright

from tests.browser.test_ui import ARGS, CHROMIUM, choose, replica_row, row, shot
from tests.support.http import get, post
from tests.support.images import b64, image_bytes
from tests.support.stack import ready_stack, stop_cleanly

MODELS = {"MOBILENETV2": {}, "TESTFAULTS": {"async_enabled": True}}
RETRYING = "Cannot reach the supervisor; retrying…"
RESTARTED = "— the supervisor restarted: its log starts again —"
TOKEN_KEY = "inference-service.token"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = ready_stack(tmp_path_factory.mktemp("ui-faults"), MODELS, replicas={"TESTFAULTS": 2})
    yield s
    stop_cleanly(s)


@pytest.fixture(scope="module")
def browser(stack):
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def picture(tmp_path_factory):
    path = tmp_path_factory.mktemp("pictures") / "picture.png"
    path.write_bytes(image_bytes(width=64, height=48, seed=5))
    return path


def new_page(browser, width=1280):
    context = browser.new_context(viewport={"width": width, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(30000)
    page.requests = []  # every management API request the page made, in order
    page.on("request", lambda r: page.requests.append(urlparse(r.url).path) if "/api/v1/" in r.url else None)
    return page


def close(page):
    """Closes the page's context, dropping its routes first: a handler still running (a status poll whose
    ``route.fetch()`` reply is disposed by the close) would otherwise raise its error at the next test's first
    Playwright call."""
    page.unroute_all(behavior="ignoreErrors")
    page.context.close()


def log_in(page, stack):
    page.goto(stack.url + "/")
    page.fill("#token-input", stack.env["SERVICE_API_TOKEN"])
    page.click("#token-form button")
    expect(page.locator("#console")).to_be_visible()
    expect(row(page, "MOBILENETV2").locator(".state")).to_have_text("running")


def test_a_second_connect_starts_no_second_polling_and_forget_token_stops_all_of_it(browser, stack):
    page = new_page(browser)
    held = []
    page.route("**/api/v1/status", lambda route: held.append(route))  # the first connect waits on its status until released
    page.goto(stack.url + "/")
    page.fill("#token-input", stack.env["SERVICE_API_TOKEN"])
    with page.expect_request("**/api/v1/status"):
        page.click("#token-form button")
    page.press("#token-input", "Enter")  # a second submit while the first connects
    page.locator("#token-form button").click(force=True)  # and a second click (on the button disabled now)
    page.wait_for_timeout(500)  # nothing to await: a second connect would have asked for the status by now
    assert len(held) == 1 and page.requests == ["/api/v1/status"]
    expect(page.locator("#token-form button")).to_be_disabled()
    held[0].continue_()
    page.unroute("**/api/v1/status")
    expect(page.locator("#console")).to_be_visible()
    expect(page.locator("#token-form button")).to_be_enabled()
    with page.expect_request("**/api/v1/status"):  # the 2 s refresh runs
        pass
    page.click("#forget")
    expect(page.locator("#login")).to_be_visible()
    after = len(page.requests)
    # Nothing to await: no request may come over the longest period of the page's timers (the charts', 5 s).
    page.wait_for_timeout(5500)
    assert page.requests[after:] == []
    expect(page.locator("#login-error")).to_have_text("")
    assert page.evaluate(f"() => localStorage.getItem('{TOKEN_KEY}')") is None
    close(page)


def test_an_unreachable_supervisor_greys_the_page_until_it_answers_and_a_rotated_token_asks_again(browser, stack):
    page = new_page(browser)
    log_in(page, stack)
    expect(page.locator("#offline")).to_be_hidden()
    page.route("**/api/v1/**", lambda route: route.abort())  # the supervisor is gone
    banner = page.locator("#offline")
    expect(banner).to_have_text(re.compile(r"^Cannot reach the supervisor since \d\d:\d\d:\d\d; retrying$"))
    expect(page.locator("#console")).to_have_class(re.compile(r"\bstale\b"))
    expect(page.locator("#gateway-panel")).to_have_css("opacity", "0.5")
    since = banner.text_content()
    for _ in range(2):  # later failures keep the time of the first
        with page.expect_request("**/api/v1/status"):
            pass
    expect(banner).to_have_text(since)
    expect(row(page, "MOBILENETV2").locator(".state")).to_have_text("running")  # the last state, shown stale
    shot(page, "faults-offline")
    page.unroute("**/api/v1/**")
    expect(banner).to_be_hidden()
    expect(page.locator("#console")).not_to_have_class(re.compile(r"\bstale\b"))
    expect(page.locator("#gateway-panel")).to_have_css("opacity", "1")
    # The token rotated: the next refresh is refused, and the page asks for the new one.
    page.route("**/api/v1/status", lambda route: route.fulfill(
        status=401, content_type="application/json", body='{"ok": false, "error": "missing or wrong bearer token"}'))
    expect(page.locator("#login")).to_be_visible()
    expect(page.locator("#login-error")).to_have_text("The token was refused.")
    expect(banner).to_be_hidden()
    assert page.evaluate(f"() => localStorage.getItem('{TOKEN_KEY}')") is None
    close(page)


def test_a_hung_supervisor_greys_the_page_and_is_never_sent_a_pile_of_requests(browser, stack):
    """A supervisor that takes requests and never answers (``kill -STOP``; here the browser holds them): each
    timer sent a request every tick without waiting, 83 in a minute, all reaching the supervisor at once when it
    woke, and the page never counted a refresh as failed (a UI probe). Now a read without a reply within 10 s
    has failed (the banner), and each timer waits for its last request's end before it sends another."""
    page = new_page(browser)
    log_in(page, stack)
    held, in_flight, most, counted = [], {}, {}, set()

    def sent(request):
        path = urlparse(request.url).path
        if "/api/v1/" in request.url:
            counted.add(request)
            in_flight[path] = in_flight.get(path, 0) + 1
            most[path] = max(most.get(path, 0), in_flight[path])

    def ended(request):
        if request in counted:  # not one sent before these listeners (the login's), which may end after it
            counted.discard(request)
            in_flight[urlparse(request.url).path] -= 1

    page.on("request", sent)
    page.on("requestfinished", ended)
    page.on("requestfailed", ended)
    page.route("**/api/v1/**", lambda route: held.append(route))  # taken, never answered: a hung supervisor
    hung = page.evaluate("() => { const d = new Date(); return d.getHours() * 3600 + d.getMinutes() * 60 + "
                         "d.getSeconds(); }")
    banner = page.locator("#offline")
    expect(banner).to_have_text(re.compile(r"^Cannot reach the supervisor since \d\d:\d\d:\d\d; retrying$"),
                                timeout=15000)
    # Since the first refresh that got no reply was asked (within a refresh's 2 s of the hang), not since its 10 s
    # timeout ended (a UI probe: the time said was 12 s after the hang).
    h, m, s = map(int, re.search(r"since (\d\d):(\d\d):(\d\d)", banner.inner_text()).groups())
    assert (h * 3600 + m * 60 + s - hung) % 86400 <= 3, (h, m, s, hung)
    expect(page.locator("#console")).to_have_class(re.compile(r"\bstale\b"))
    with page.expect_request("**/api/v1/status", timeout=10000):  # the refresh after the one that timed out
        pass
    assert most and set(most.values()) == {1}, most  # never two requests of one timer at once
    assert len(held) <= 6, [urlparse(r.request.url).path for r in held]  # before: about 20 by now
    page.unroute("**/api/v1/**")
    for route in held:  # the supervisor wakes: what it still holds is answered (the page gave up on it)
        try:
            route.continue_()
        except Exception:  # noqa: BLE001 (a request the page aborted is gone)
            pass
    expect(banner).to_be_hidden(timeout=15000)
    expect(page.locator("#console")).not_to_have_class(re.compile(r"\bstale\b"))
    close(page)


def test_a_stopped_model_is_not_asked_for_its_defaults_until_it_runs(browser, stack):
    """A page loaded while the first classifier was not running asked for its OpenAPI document all the same: the
    supervisor's 503 was a console error (a UI probe). Now the status decides: its defaults come once it runs."""
    assert post(f"{stack.url}/api/v1/servers/MOBILENETV2/stop", headers=stack.auth).status == 200
    stack.wait_for("MOBILENETV2", lambda c: c["state"] == "stopped")
    page = new_page(browser)
    problems = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.goto(stack.url + "/")
    page.fill("#token-input", stack.env["SERVICE_API_TOKEN"])
    page.click("#token-form button")
    mobilenet, params = row(page, "MOBILENETV2"), page.locator("#try-params")
    expect(mobilenet.locator(".state")).to_have_text("stopped")
    expect(page.locator("#try-model")).to_have_value("MOBILENETV2")
    expect(params).to_have_attribute("placeholder", "{} (the model's defaults: it is not running)")
    with page.expect_request("**/api/v1/status"):  # a refresh more: still nothing asked
        pass
    assert "/api/v1/servers/MOBILENETV2/openapi" not in page.requests and problems == []
    mobilenet.locator('[data-action="start"]').click()
    expect(page.locator("#action-message")).to_have_text("MOBILENETV2: start done", timeout=120000)
    expect(params).to_have_attribute("placeholder", '{"top_k":5}', timeout=60000)
    expect(params).to_have_value("")
    assert page.requests.count("/api/v1/servers/MOBILENETV2/openapi") == 1 and problems == []
    close(page)


def test_a_model_restarted_with_other_defaults_shows_its_new_ones(browser, stack):
    """The params' defaults were read once for the page's life: a model restarted with another config (DDPM's
    num_train_timesteps 50 to 40) kept showing the old default until a reload (a UI probe). Here the running
    server's document says top_k 5, then 3 after the Restart button (the browser's route rewrites it)."""
    default = [5]

    def rewritten(route):
        response = route.fetch()
        body = response.json()
        body["openapi"]["components"]["schemas"]["MOBILENETV2_Params"]["properties"]["top_k"]["default"] = default[0]
        route.fulfill(response=response, json=body)

    page = new_page(browser)
    page.route("**/api/v1/servers/MOBILENETV2/openapi", rewritten)
    log_in(page, stack)
    params = page.locator("#try-params")
    expect(params).to_have_attribute("placeholder", '{"top_k":5}')
    default[0] = 3
    row(page, "MOBILENETV2").locator('[data-action="restart"]').click()
    expect(page.locator("#action-message")).to_have_text("MOBILENETV2: restart done", timeout=120000)
    expect(params).to_have_attribute("placeholder", '{"top_k":3}', timeout=30000)
    expect(row(page, "MOBILENETV2").locator(".ready")).to_have_text("yes")
    close(page)


def fake_log(lines):
    """A route answering the gateway's log from ``lines`` (a list the test changes) as the supervisor's logsink."""
    def answer(route):
        query = parse_qs(urlparse(route.request.url).query)
        end, limit = len(lines), int(query["limit"][0])
        offset = int(query["offset"][0]) if "offset" in query else max(0, end - limit)
        page = [{"seq": s, "time": 0.0, "stream": "stdout", "line": lines[s]} for s in range(offset, min(end, offset + limit))]
        body = {"ok": True, "id": "__gateway", "lines": page, "first_offset": 0, "end_offset": end,
                "next_offset": page[-1]["seq"] + 1 if page else min(offset, end)}  # past the end: the end
        route.fulfill(status=200, content_type="application/json", body=json.dumps(body))
    return answer


def with_pid(pid):
    """A route answering the real status with the supervisor's ``pid`` replaced by ``pid[0]`` once the test sets it."""
    def answer(route):
        response = route.fetch()
        body = response.json()
        if pid:
            body["pid"] = pid[0]
        route.fulfill(response=response, json=body)
    return answer


def test_the_log_view_starts_over_when_the_supervisor_restarted(browser, stack):
    page = new_page(browser)
    lines, pid = [f"old line {i}" for i in range(20)], []
    page.route("**/api/v1/servers/__gateway/logs?*", fake_log(lines))
    page.route("**/api/v1/status", with_pid(pid))
    log_in(page, stack)
    spans = page.locator("#log-lines span")
    expect(spans).to_have_count(20)
    # The new supervisor (another pid) has 3 lines in its log.
    lines[:] = ["new line 0", "new line 1", "new line 2"]
    pid.append(1)
    expect(spans).to_have_text([RESTARTED, "new line 0", "new line 1", "new line 2"])
    lines.append("new line 3")  # and follows it from there
    expect(spans).to_have_text([RESTARTED, "new line 0", "new line 1", "new line 2", "new line 3"])
    expect(page.locator("#log-count")).to_have_text("5 of 5 lines")
    close(page)


def test_a_new_supervisor_pid_starts_the_log_view_over_whatever_the_offsets(browser, stack):
    """A supervisor restarted while the view did not follow, whose new log outgrew the old one's 8 lines before
    "follow" was ticked again: the view carried on from offset 8 (the old lines, then the new log's from 8), with
    no marker (a UI probe); an empty new log kept the old count. A new pid in the status starts the view over."""
    page = new_page(browser)
    lines, pid = [f"old line {i}" for i in range(8)], []
    page.route("**/api/v1/servers/__gateway/logs?*", fake_log(lines))
    page.route("**/api/v1/status", with_pid(pid))
    log_in(page, stack)
    spans, count = page.locator("#log-lines span"), page.locator("#log-count")
    expect(spans).to_have_count(8)
    expect(count).to_have_text("8 of 8 lines")
    page.uncheck("#log-follow")
    lines[:] = []  # the new supervisor's gateway has logged nothing yet
    pid.append(1)
    expect(spans).to_have_text([RESTARTED])
    expect(count).to_have_text("1 of 1 lines")
    lines[:] = [f"new line {i}" for i in range(14)]
    page.check("#log-follow")
    expect(spans).to_have_text([RESTARTED, *lines])
    expect(count).to_have_text("15 of 15 lines")
    # Restarted again while followed, its log already longer than the offset the view reached (14).
    lines[:] = [f"third line {i}" for i in range(20)]
    pid[0] = 2
    expect(spans).to_have_text([RESTARTED, *lines])
    expect(count).to_have_text("21 of 21 lines")
    close(page)


def test_a_supervisor_unreachable_at_load_is_tried_again_with_the_stored_token(browser, stack):
    page = new_page(browser)
    page.goto(stack.url + "/")
    page.evaluate("([key, token]) => localStorage.setItem(key, token)", [TOKEN_KEY, stack.env["SERVICE_API_TOKEN"]])
    page.route("**/api/v1/**", lambda route: route.abort())
    page.reload()
    expect(page.locator("#login-error")).to_have_text(RETRYING)
    for _ in range(2):  # tried again, every few seconds
        with page.expect_request("**/api/v1/status", timeout=10000):
            pass
    expect(page.locator("#login-error")).to_have_text(RETRYING)
    assert page.evaluate(f"() => localStorage.getItem('{TOKEN_KEY}')") == stack.env["SERVICE_API_TOKEN"]
    page.unroute("**/api/v1/**")
    expect(page.locator("#console")).to_be_visible(timeout=10000)
    expect(row(page, "MOBILENETV2").locator(".state")).to_have_text("running")
    close(page)


def test_a_request_the_supervisor_refuses_at_login_is_said_and_not_sent_again(browser, stack):
    """A UI probe: a 20,000-character token, whose request head the supervisor answers 431, showed "Cannot reach the
    supervisor; retrying…" and was sent again every 3 s for as long as the page was open."""
    page = new_page(browser)
    page.goto(stack.url + "/")
    page.fill("#token-input", "t" * 20000)
    page.click("#token-form button")
    expect(page.locator("#login-error")).to_have_text(re.compile(r"^The supervisor refused the request: HTTP 431 \(.+\)\.$"))
    sent = page.requests.count("/api/v1/status")
    page.wait_for_timeout(4000)  # nothing to await: a retry (every 3 s) would have asked by now
    assert page.requests.count("/api/v1/status") == sent == 1
    expect(page.locator("#login")).to_be_visible()
    assert page.evaluate(f"() => localStorage.getItem('{TOKEN_KEY}')") is None
    page.fill("#token-input", stack.env["SERVICE_API_TOKEN"])  # the right token then connects as ever
    page.press("#token-input", "Enter")
    expect(page.locator("#console")).to_be_visible()
    # Enter in the token field (the keyboard's way) hands the focus to the console, as Connect does: it fell to
    # the page's body (a UI probe).
    expect(page.locator("#console")).to_be_focused()
    close(page)


@pytest.mark.parametrize("stored", ["tök€n", "abc\ndef"])
def test_a_stored_token_that_cannot_be_sent_is_said_and_can_be_forgotten(browser, stack, stored):
    """A regression probe: a stored token that is not printable ASCII (stored by hand, or by an older page) made
    fetch throw, which read as "Cannot reach the supervisor; retrying…" every 3 s for as long as the page was
    open, and no request was ever sent."""
    page = new_page(browser)
    page.goto(stack.url + "/")
    page.evaluate("([key, token]) => localStorage.setItem(key, token)", [TOKEN_KEY, stored])
    page.reload()
    expect(page.locator("#login-error")).to_have_text(
        "The stored token cannot be sent: it is not printable ASCII. Forget it, or connect with another.")
    expect(page.locator("#forget")).to_be_visible()
    page.wait_for_timeout(4000)  # nothing to await: a retry (every 3 s) would have changed the line by now
    expect(page.locator("#login-error")).to_have_text(re.compile(r"^The stored token cannot be sent"))
    assert page.requests == []
    page.click("#forget")
    assert page.evaluate(f"() => localStorage.getItem('{TOKEN_KEY}')") is None
    page.fill("#token-input", stack.env["SERVICE_API_TOKEN"])
    page.press("#token-input", "Enter")
    expect(page.locator("#console")).to_be_visible()
    close(page)


def test_a_log_with_no_lines_is_counted_as_none(browser, stack):
    """A UI probe: choosing a log with no lines after one of 58 left "58 of 58 lines" beside the empty view."""
    page = new_page(browser)
    page.route("**/api/v1/servers/MOBILENETV2/logs?*", fake_log([]))
    log_in(page, stack)
    count = page.locator("#log-count")
    expect(count).to_have_text(re.compile(r"^[1-9]\d* of [1-9]\d* lines$"))  # the gateway's log, shown first
    page.select_option("#log-server", "MOBILENETV2")
    expect(count).to_have_text("0 of 0 lines")
    expect(page.locator("#log-lines span")).to_have_count(0)
    close(page)


def test_a_bad_image_shows_the_items_reason(browser, stack):
    page = new_page(browser)
    log_in(page, stack)
    choose(page, "MOBILENETV2")
    junk = b"this is not an image"
    reply = post(f"{stack.gateway}/v1/models/MOBILENETV2/infer", {"images": [b64(junk)]},
                 headers={"Authorization": f"Bearer {stack.key}"})
    assert reply.status == 400 and "error" not in reply.json
    expected = f"HTTP 400: {reply.json['status_str']}: {reply.json['results'][0]['error']}"
    assert expected.startswith("HTTP 400: INVALID_IMAGE: not a decodable image")
    page.set_input_files("#try-file", files=[{"name": "junk.png", "mimeType": "image/png", "buffer": junk}])
    expect(page.locator("#try-preview")).to_have_attribute("src", re.compile("^data:"))
    page.click("#try-run")
    expect(page.locator("#try-error")).to_have_text(expected)
    close(page)


def test_a_run_of_the_model_chosen_before_leaves_the_new_form_alone(browser, stack, picture):
    page = new_page(browser)
    log_in(page, stack)
    form = [page.locator(s) for s in ("#try-result", "#try-error")]
    # A synchronous request: its reply comes once TESTFAULTS is the model chosen.
    held = []
    page.route("**/v1/models/MOBILENETV2/infer", lambda route: held.append(route))
    choose(page, "MOBILENETV2")
    page.set_input_files("#try-file", str(picture))
    expect(page.locator("#try-preview")).to_be_visible()
    with page.expect_request("**/v1/models/MOBILENETV2/infer"):
        page.click("#try-run")
    choose(page, "TESTFAULTS")
    expect(page.locator("#try-run")).to_be_enabled()  # the new form runs its own model
    with page.expect_response("**/v1/models/MOBILENETV2/infer"):
        held[0].continue_()
    page.wait_for_timeout(500)  # nothing to await: a reply drawn would be drawn by now
    expect(page.locator("#try-raw")).to_be_hidden()
    for part in form:
        expect(part).to_have_text("")
    page.unroute("**/v1/models/MOBILENETV2/infer")
    # A job: not followed once MOBILENETV2 is chosen, and its result is not fetched.
    jobs = []
    page.on("request", lambda r: jobs.append(urlparse(r.url).path) if "/v1/models/TESTFAULTS/jobs" in r.url else None)
    page.fill("#try-params", '{"sleep_ms": 1500}')
    with page.expect_request("**/jobs/*/wait*"):
        page.click("#try-run")
    job_id = page.locator("#job-id").text_content()
    choose(page, "MOBILENETV2")
    seen = len(jobs)
    for _ in range(100):  # the job ends on its own
        state = get(f"{stack.gateway}/v1/models/TESTFAULTS/jobs/{job_id}", headers={"Authorization": f"Bearer {stack.key}"})
        if state.json["state"] in ("done", "failed", "timeout"):
            break
        page.wait_for_timeout(200)
    assert state.json["state"] == "done"
    page.wait_for_timeout(1500)  # nothing to await: the page would have polled (1 s waits) and fetched the result by now
    assert jobs[seen:] == []  # the wait in flight at the switch was the last
    expect(page.locator("#job")).to_be_hidden()
    expect(page.locator("#try-raw")).to_be_hidden()
    for part in form:
        expect(part).to_have_text("")
    close(page)


def test_the_keyboard_opens_the_file_chooser_and_buttons_and_charts_have_names(browser, stack, picture):
    page = new_page(browser)
    log_in(page, stack)
    choose(page, "MOBILENETV2")
    for key in ("Enter", " "):
        with page.expect_file_chooser() as chooser:
            page.locator("#drop").press(key)  # focuses the drop zone, then the key
        chooser.value.set_files(str(picture))
        expect(page.locator("#try-preview")).to_be_visible()
        page.evaluate("() => document.querySelector('#try-preview').hidden = true")
    expect(page.get_by_role("button", name="Restart MOBILENETV2", exact=True)).to_have_count(1)
    expect(row(page, "TESTFAULTS").locator('[data-action="stop"]')).to_have_attribute("aria-label", "Stop TESTFAULTS")
    expect(replica_row(page, "TESTFAULTS", 1).locator('[data-action="start"]')).to_have_attribute(
        "aria-label", "Start TESTFAULTS replica 1")
    expect(page.get_by_role("img", name="MOBILENETV2: latency", exact=True)).to_have_count(1)
    expect(page.get_by_role("img", name="TESTFAULTS replica 1: jobs", exact=True)).to_have_count(1)
    expect(page.get_by_role("img", name="gateway: requests/s by route", exact=True)).to_have_count(1)
    close(page)


def test_a_narrow_window_scrolls_the_table_not_the_page(browser, stack):
    """Neither does a long model name in the "Try it" select ("DDPM (unconditional-image-generation, async)" made
    the page 388 px wide at 375: a UI probe); TESTFAULTS is given a task that long here."""
    page = new_page(browser, width=375)

    def long_task(route):
        body = route.fetch().json()
        for m in body["models"]:
            if m["id"] == "TESTFAULTS":
                m["task"] = "unconditional-image-generation-of-a-very-long-name"
        route.fulfill(status=200, content_type="application/json", body=json.dumps(body))

    page.route("**/api/v1/catalog", long_task)
    log_in(page, stack)
    expect(page.locator("#try-model option", has_text="unconditional-image-generation-of-a-very-long-name")).to_have_count(1)
    expect(page.locator("#catalog tr.figures .chart").first).to_be_attached()
    widths = page.evaluate("""() => ({page: document.documentElement.scrollWidth, window: document.documentElement.clientWidth,
        table: document.querySelector("#catalog").scrollWidth, box: document.querySelector("#catalog").parentElement.clientWidth})""")
    assert widths["page"] == widths["window"] == 375, widths
    assert widths["table"] > widths["box"], widths  # the table is wider: its box scrolls
    shot(page, "faults-narrow")
    close(page)


def test_rows_and_log_choices_follow_a_change_of_the_replica_count(browser, stack):
    """A supervisor restarted with one replica of TESTFAULTS (the status, changed by a route), then with two again."""
    page = new_page(browser)
    log_in(page, stack)
    rows = page.locator('#catalog tr:is([data-id="TESTFAULTS"], [data-for^="TESTFAULTS"])')
    shape = "rs => rs.map(r => [r.className, r.dataset.replica || r.dataset.for || r.dataset.id])"
    options = page.locator("#log-server option")
    two = [["model", "TESTFAULTS"], ["replica", "0"], ["figures", "TESTFAULTS.0"], ["replica", "1"], ["figures", "TESTFAULTS.1"]]
    expect(rows).to_have_count(5)
    assert rows.evaluate_all(shape) == two
    page.select_option("#log-server", "TESTFAULTS/1")

    def one_replica(route):
        response = route.fetch()
        status = response.json()
        for server in status["servers"]:
            if server["id"] == "TESTFAULTS":
                server["replicas"] = server["replicas"][:1]
        route.fulfill(response=response, json=status)

    page.route("**/api/v1/status", one_replica)
    expect(rows).to_have_count(2)
    assert rows.evaluate_all(shape) == [["model", "TESTFAULTS"], ["figures", "TESTFAULTS"]]
    expect(row(page, "TESTFAULTS").locator(".replica-count")).to_have_count(0)
    expect(options).to_have_text(["gateway", "MOBILENETV2", "TESTFAULTS"])
    expect(page.locator("#log-server")).to_have_value("__gateway")  # the replica's log is gone: the first
    page.unroute("**/api/v1/status")
    expect(rows).to_have_count(5)
    assert rows.evaluate_all(shape) == two
    expect(row(page, "TESTFAULTS").locator(".replica-count")).to_have_text(" 2 replicas, 2 ready")
    expect(replica_row(page, "TESTFAULTS", 1).locator(".state")).to_have_text("running")
    expect(replica_row(page, "TESTFAULTS", 1).locator('[data-action="restart"]')).to_be_enabled()
    expect(page.locator('#catalog tr.figures[data-for="TESTFAULTS.1"] .chart')).to_have_count(5, timeout=15000)
    expect(options).to_have_text(["gateway", "MOBILENETV2", "TESTFAULTS replica 0", "TESTFAULTS replica 1"])
    page.select_option("#log-server", "TESTFAULTS/1")
    expect(page.locator("#log-lines")).to_contain_text(f"listening on 127.0.0.1:{stack.extra['replica_ports']['TESTFAULTS'][1]};")
    close(page)


def test_chart_titles_give_the_newest_sample_and_the_routes_total(browser, stack):
    """The series (changed by a route): MOBILENETV2 had requests until the newest sample, which has none."""
    page = new_page(browser)

    def quiet_now(route):
        response = route.fetch()
        series = response.json()
        t = [series["now"] - 10, series["now"] - 5, series["now"]]
        m = series["servers"]["MOBILENETV2"]
        m.update(t=t, rps=[2.0, 1.0, 0.0], p50_ms=[40.0, 41.0, None], p99_ms=[80.0, 81.0, None],
                 batch_mean=[1.0, 1.0, None], queue_depth=[0, 0, 0])
        g = series["gateway"]
        g.update(t=t, rps_by_route={"infer": [2.0, 1.0, 1.5], "jobs": [0.0, 0.5, 0.25], "openapi": [None, 0.1, None]},
                 rejections_by_reason={}, upstream_errors=[0.0, 0.0, 0.0])
        route.fulfill(response=response, json=series)

    page.route("**/api/v1/series", quiet_now)
    log_in(page, stack)
    title = lambda owner, figure: page.locator(f'{owner} .chart[data-figure="{figure}"] .value')  # noqa: E731
    model = 'tr.figures[data-for="MOBILENETV2"]'
    expect(title(model, "rps")).to_have_text("0.00")
    expect(title(model, "latency")).to_have_text("– / –")
    expect(title(model, "batch")).to_have_text("–")
    expect(title("#gateway-charts", "rps_by_route")).to_have_text("total 1.75")
    expect(title("#gateway-charts", "rejections")).to_have_text("–")
    expect(page.locator('#gateway-charts .chart[data-figure="rps_by_route"] .legend span')).to_have_text(["infer", "jobs", "openapi"])
    close(page)


def test_a_model_the_supervisor_no_longer_serves_leaves_the_page_and_one_it_serves_again_returns(browser, stack):
    """A supervisor restarted without MOBILENETV2's config (the status and the catalog, changed by routes), then
    with it again, while the page stays open: its row stayed, frozen, until a reload, and a model added could not
    be chosen in the log view or "Try it" (UI probe)."""
    page = new_page(browser)
    log_in(page, stack)
    page.select_option("#try-model", "TESTFAULTS")

    def without(path):
        def answer(route):
            response = route.fetch()
            body = response.json()
            key = "servers" if path == "status" else "models"
            body[key] = [m for m in body[key] if m["id"] != "MOBILENETV2"]
            route.fulfill(response=response, json=body)
        return answer

    page.route("**/api/v1/status", without("status"))
    page.route("**/api/v1/catalog", without("catalog"))
    expect(row(page, "MOBILENETV2")).to_have_count(0)
    expect(page.locator('#catalog tr.figures[data-for="MOBILENETV2"]')).to_have_count(0)
    expect(page.locator("#log-server option")).to_have_text(["gateway", "TESTFAULTS replica 0", "TESTFAULTS replica 1"])
    expect(page.locator("#try-model option")).to_have_count(1)
    expect(page.locator("#try-model")).to_have_value("TESTFAULTS")  # the model chosen stays chosen
    page.unroute("**/api/v1/status")
    page.unroute("**/api/v1/catalog")
    expect(row(page, "MOBILENETV2").locator(".state")).to_have_text("running")
    expect(page.locator("#log-server option")).to_have_text(
        ["gateway", "MOBILENETV2", "TESTFAULTS replica 0", "TESTFAULTS replica 1"])
    expect(page.locator("#try-model option")).to_have_count(2)
    expect(page.locator("#try-model")).to_have_value("TESTFAULTS")
    page.select_option("#log-server", "MOBILENETV2")
    expect(page.locator("#log-lines")).to_contain_text("listening on 127.0.0.1:")
    close(page)


def test_a_long_gateway_error_wraps_in_a_narrow_window(browser, stack):
    """A URL in the gateway's last error made a 360 px page 627 px wide (UI probe)."""
    page = new_page(browser, width=360)

    def long_error(route):
        response = route.fetch()
        body = response.json()
        body["gateway"]["last_error"] = "killed by signal 9: GET /v1/models/DDPM/jobs/job_" + "c178" * 30 + "/wait"
        route.fulfill(response=response, json=body)

    page.route("**/api/v1/status", long_error)
    log_in(page, stack)
    expect(page.locator("#gateway-error")).to_contain_text("c178c178")
    width = page.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert width == [360, 360], width
    close(page)


def test_the_errors_filter_shows_a_crash_not_the_next_process_or_twisteds_goodbye(browser, stack):
    """After a crashed start's traceback, the next process's lines without a level took the traceback's level
    ("critical"), and so did "[-] (TCP Port N Closed)" and blank lines (UI probe); the supervisor's own failure
    notes were info, hidden by "errors" (regression probe)."""
    page = new_page(browser)
    lines = [("stdout", "2026-11-28T05:27:30+0000 [svc.infra.process#critical] M: model failed to load"),
             ("stdout", "Traceback (most recent call last):"), ("stdout", "RuntimeError: boom"),
             ("stdout", ""), ("stdout", "2026-11-28T05:27:30+0000 [-] (TCP Port 9101 Closed)"),
             ("supervisor", "start_failed: could not start: M: model failed to load"),
             ("supervisor", "restart failed: M could not start: M: model failed to load"),
             ("supervisor", "starting: spawned pid 77: service-model --server conf/server/M.toml ..."),
             ("stdout", "2026-11-28T05:27:33+0000 [-] JsonSite starting on 9101"), ("stdout", "a print of the plugin")]

    def answer(route):
        page_lines = [{"seq": i, "time": 0.0, "stream": s, "line": t} for i, (s, t) in enumerate(lines)]
        route.fulfill(status=200, content_type="application/json", body=json.dumps(
            {"ok": True, "id": "__gateway", "lines": page_lines, "first_offset": 0, "end_offset": len(lines),
             "next_offset": len(lines)}))

    page.route("**/api/v1/servers/__gateway/logs?*", answer)
    log_in(page, stack)
    expect(page.locator("#log-lines span")).to_have_count(len(lines))
    page.select_option("#log-level", "error")
    expect(page.locator("#log-lines span:not(.hidden)")).to_have_text(
        ["2026-11-28T05:27:30+0000 [svc.infra.process#critical] M: model failed to load",
         "Traceback (most recent call last):", "RuntimeError: boom",
         "start_failed: could not start: M: model failed to load"])  # the supervisor's failure notes too
    page.select_option("#log-level", "warn")
    expect(page.locator("#log-lines span:not(.hidden)")).to_have_count(5)  # and its failed action
    close(page)


def test_forget_token_in_one_tab_ends_the_session_in_every_tab(browser, stack):
    """A UI probe: "Forget token" cleared the stored token and showed the login in its own tab, while another tab
    of the same browser polled on with the token it held, its buttons working. Every tab follows now, and a
    login in one tab connects the others."""
    page = new_page(browser)
    log_in(page, stack)
    other = page.context.new_page()  # the same browser profile: the same localStorage
    polled = []
    other.on("request", lambda r: polled.append(r.url) if "/api/v1/" in r.url else None)
    other.goto(stack.url + "/")
    expect(other.locator("#console")).to_be_visible()  # connected with the stored token
    page.click("#forget")
    expect(other.locator("#login")).to_be_visible()
    expect(other.locator("#login-error")).to_have_text("The token was forgotten in another tab.")
    after = len(polled)
    other.wait_for_timeout(2500)  # nothing to await: a status refresh (every 2 s) of the ended session would come
    assert polled[after:] == []
    log_in(page, stack)
    expect(other.locator("#console")).to_be_visible()  # connected by the other tab's login
    close(page)


def test_the_action_buttons_are_disabled_while_the_supervisor_cannot_be_reached(browser, stack):
    """A UI probe: with the supervisor hung (``kill -STOP``) the page was greyed, but its Restart still took a click,
    and the restart ran when the supervisor woke, long after the operator had given up on it."""
    page = new_page(browser)
    log_in(page, stack)
    actions = page.locator("#console button[data-action]")
    expect(page.locator('#gateway-panel button[data-action="restart"]')).to_be_enabled()
    expect(row(page, "MOBILENETV2").locator('[data-action="restart"]')).to_be_enabled()
    page.route("**/api/v1/**", lambda route: route.abort())
    expect(page.locator("#offline")).to_be_visible()
    for i in range(actions.count()):
        expect(actions.nth(i)).to_be_disabled()
    page.unroute("**/api/v1/**")
    expect(page.locator("#offline")).to_be_hidden()
    expect(page.locator('#gateway-panel button[data-action="restart"]')).to_be_enabled()
    expect(row(page, "MOBILENETV2").locator('[data-action="restart"]')).to_be_enabled()
    expect(row(page, "MOBILENETV2").locator('[data-action="start"]')).to_be_disabled()  # as the state has it
    close(page)


def test_a_process_running_again_shows_its_last_error_muted_as_earlier(browser, stack):
    """A UI probe: after a ``kill -9`` the process came back running and ready, but "killed by signal 9" stayed
    beside it in red, reading as a fault of now. The API keeps ``last_error``; the page shows it muted, after
    "earlier:", once the process runs again, and in red while it does not."""
    page = new_page(browser)

    def with_errors(route):
        response = route.fetch()
        body = response.json()
        body["gateway"]["last_error"] = "killed by signal 9"
        for server in body["servers"]:
            server["last_error"] = "killed by signal 9"
            if server["id"] == "TESTFAULTS":
                server["state"] = "backoff"
        route.fulfill(response=response, json=body)

    page.route("**/api/v1/status", with_errors)
    log_in(page, stack)
    earlier = [page.locator("#gateway-error"), row(page, "MOBILENETV2").locator(".last-error")]
    for cell in earlier:
        expect(cell).to_have_text("earlier: killed by signal 9")
        expect(cell).to_have_class(re.compile(r"\bearlier\b"))
        expect(cell).to_have_css("color", "rgb(91, 101, 118)")  # --muted
    now = row(page, "TESTFAULTS").locator(".last-error")
    expect(now).to_have_text("killed by signal 9")
    expect(now).to_have_css("color", "rgb(169, 50, 38)")  # --bad
    close(page)


def test_a_long_path_in_an_error_is_cut_to_its_end_so_the_reason_shows(browser, stack):
    """A UI probe: "weights file /home/.../weights.pth: missing tensor ..." filled the narrow cell with the path
    and cut the reason off; the reason was in the tooltip only.  The cell cuts each file path to its last folder
    and file; the tooltip keeps the whole text; a request's path after its method stays whole."""
    page = new_page(browser)
    error = ("weights file /home/operator/models/mobilenet/imagenet1k/v2/weights.pth: missing tensor "
             "'features.0.0.weight'")

    def with_error(route):
        response = route.fetch()
        body = response.json()
        body["gateway"]["last_error"] = "killed by signal 9: GET /v1/models/DDPM/jobs/job_1/wait"
        for server in body["servers"]:
            if server["id"] == "TESTFAULTS":
                server["state"], server["last_error"] = "start_failed", error
        route.fulfill(response=response, json=body)

    page.route("**/api/v1/status", with_error)
    log_in(page, stack)
    cell = row(page, "TESTFAULTS").locator(".last-error")
    expect(cell).to_have_text("weights file …/v2/weights.pth: missing tensor 'features.0.0.weight'")
    expect(cell).to_have_attribute("title", error)
    expect(page.locator("#gateway-error")).to_have_text(
        "earlier: killed by signal 9: GET /v1/models/DDPM/jobs/job_1/wait")
    close(page)


def test_a_replicas_current_fault_is_not_muted_while_another_replica_runs(browser, stack):
    """A UI probe: replica 1 could not start while replica 0 kept the model running, and the model's row showed
    replica 1's error muted, "earlier:", as a fault of the past. The replica the error names decides."""
    page = new_page(browser)

    def replica_failed(route):
        response = route.fetch()
        body = response.json()
        for server in body["servers"]:
            if server["id"] == "MOBILENETV2":
                first = server["replicas"][0]
                second = {**first, "index": 1, "name": "MOBILENETV2.1", "port": first["port"] + 100,
                          "state": "start_failed", "ready": False, "pid": None,
                          "last_error": "could not start: no such file"}
                server["replicas"] = [{**first, "name": "MOBILENETV2.0"}, second]
                server["last_error"] = "replica 1: could not start: no such file"
        route.fulfill(response=response, json=body)

    page.route("**/api/v1/status", replica_failed)
    log_in(page, stack)
    cell = row(page, "MOBILENETV2").locator(".last-error")
    expect(cell).to_have_text("replica 1: could not start: no such file")
    expect(cell).not_to_have_class(re.compile(r"\bearlier\b"))
    expect(cell).to_have_css("color", "rgb(169, 50, 38)")  # --bad
    close(page)


def test_a_refused_gateway_restart_is_said_beside_its_button(browser, stack):
    """A UI probe: the reason of a refused gateway restart (a key file another user could write) was shown below
    the model table, out of view, while the gateway's panel kept saying "running · ready"."""
    page = new_page(browser)
    reason = "the key file cannot be used (keys.toml: is writable by other users (mode 666): ...)"

    def refused(route):
        route.fulfill(status=500, content_type="application/json; charset=utf-8",
                      body=json.dumps({"ok": False, "error": reason}))

    page.route("**/api/v1/servers/__gateway/restart", refused)
    log_in(page, stack)
    page.click('#gateway-panel button[data-action="restart"]')
    message = page.locator("#gateway-panel #gateway-message")
    expect(message).to_have_text(f"gateway: restart failed: {reason}")
    expect(message).to_have_class("error")
    expect(page.locator("#action-message")).to_have_text("")
    close(page)


def test_a_long_action_error_wraps_inside_the_page(browser, stack):
    """A UI probe: a 500's reason of 3,000 characters without a space (a weights path) made the page 23,554 px wide:
    the action message did not wrap where the gateway's error box did."""
    page = new_page(browser, width=1280)
    log_in(page, stack)
    page.evaluate("""() => { const m = document.querySelector("#action-message");
                             m.hidden = false; m.textContent = "x".repeat(3000); }""")
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 1280
    close(page)


#: WCAG 2.1's contrast ratio of an element's text against the first background behind it that is not transparent.
CONTRAST = """(el) => {
  const rgb = (c) => c.match(/[\\d.]+/g).map(Number);
  const lum = ([r, g, b]) => [r, g, b].map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; })
    .reduce((sum, v, i) => sum + v * [0.2126, 0.7152, 0.0722][i], 0);
  let back = el;
  while (back && rgb(getComputedStyle(back).backgroundColor)[3] === 0) back = back.parentElement;
  const [a, b] = [lum(rgb(getComputedStyle(el).color)), lum(rgb(back ? getComputedStyle(back).backgroundColor : "rgb(255,255,255)"))];
  return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
}"""


def test_text_and_controls_have_names_and_wcag_aa_contrast(browser, stack):
    """A UI probe: the state badges (3.8:1), the "choose a file" link (2.6:1) and the login's hint (4.47:1) were below
    WCAG AA's 4.5:1 for small text; the token field had no name but its placeholder, the drop zone neither a role nor a
    name, and after Connect the focus fell to the page's body."""
    page = new_page(browser, width=1280)

    def tones(route):  # every tone of badge on the page at once
        response = route.fetch()
        body = response.json()
        body["servers"][0]["state"] = "failed"
        body["servers"][1]["state"] = "starting"
        route.fulfill(response=response, json=body)

    page.goto(stack.url + "/")
    field = page.get_by_role("textbox", name="Management token")
    expect(field).to_be_visible()
    expect(field).to_have_attribute("aria-describedby", "login-hint")
    assert page.locator("#login-hint").evaluate(CONTRAST) >= 4.5
    field.fill(stack.env["SERVICE_API_TOKEN"])
    page.click("#token-form button")
    expect(page.locator("#console")).to_be_focused()
    expect(page.get_by_role("button", name="Image: press Enter to choose a file, or drop one here")).to_be_visible()
    page.route("**/api/v1/status", tones)
    for selector in ('.badge[data-tone="failed"]', '.badge[data-tone="starting"]', '.badge[data-tone="running"]',
                     ".badge.demo", "#drop label.link", "#catalog .muted", "#action-message"):
        element = page.locator(selector).first
        expect(element).to_be_attached()
        ratio = element.evaluate(CONTRAST)
        assert ratio >= 4.5, (selector, ratio)
    page.fill("#try-params", "{}")
    page.press("#try-params", "Enter")  # runs, as Run does: no image chosen yet
    expect(page.locator("#try-error")).to_have_text("choose or drop an image first")
    close(page)
