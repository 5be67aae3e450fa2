"""The web page's "Try it" with a third party's image-to-image model: it asks for a photo, whatever the category.

A real stack (Playwright driving Debian's chromium, as ``test_ui.py``) with
``TESTIMAGE`` (tests/plugins/models/testplugin.py): category ``generation``,
``needs_image`` true, its result the photo's negative.  The page hid the
photo drop zone for every model of category ``generation`` and sent the
placeholder pixel, so such a model could not be tried; the catalog now
says ``needs_image``, and only a model that reads no photo goes without one.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image
from playwright.sync_api import expect

from tests.browser.test_ui import choose, shot, through_gateway, watched_page
from tests.support.http import get
from tests.support.images import b64, image_bytes
from tests.support.stack import ready_stack, stop_cleanly


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = ready_stack(tmp_path_factory.mktemp("ui-plugin"), {"TESTIMAGE": {}})
    yield s
    stop_cleanly(s)


@pytest.fixture(scope="module")
def page(stack):
    with watched_page(1000) as page:
        yield page


def test_an_image_to_image_model_of_category_generation_asks_for_a_photo_and_shows_its_result(page, stack, tmp_path):
    model = next(m for m in get(stack.url + "/api/v1/catalog", headers=stack.auth).json["models"]
                 if m["id"] == "TESTIMAGE")
    assert (model["category"], model["needs_image"]) == ("generation", True)
    picture = tmp_path / "picture.png"
    picture.write_bytes(image_bytes(width=40, height=30, seed=12))
    page.goto(stack.url + "/")
    page.fill("#token-input", stack.env["SERVICE_API_TOKEN"])
    page.click("#token-form button")
    expect(page.locator("#console")).to_be_visible()
    choose(page, "TESTIMAGE")
    expect(page.locator("#drop")).to_be_visible()
    expect(page.locator("#try-note")).to_be_hidden()
    page.click("#try-run")  # no photo yet: asked for, not replaced by the placeholder pixel
    expect(page.locator("#try-error")).to_have_text("choose or drop an image first")
    page.set_input_files("#try-file", str(picture))
    expect(page.locator("#try-preview")).to_be_visible()
    page.click("#try-run")
    image = page.locator("#try-result img.generated")
    expect(image).to_be_visible()
    expect(page.locator("#try-result .caption")).to_have_text("8×8 px, shown ×32")  # no seed to name
    expected = through_gateway(stack, "TESTIMAGE", {"images": [b64(picture.read_bytes())]})
    assert image.get_attribute("src") == f"data:image/png;base64,{expected['image']}"
    negative = np.asarray(Image.open(io.BytesIO(base64.b64decode(expected["image"]))))
    assert len(np.unique(negative.reshape(-1, 3), axis=0)) > 1  # the photo's, not a blank placeholder's
    shot(page, "image-to-image")
    assert page.problems == []
