"""Hostile image shapes on the shipped configs of the models that decode
pixels (conf/server/, random-init weights, one image per batch), one real
model-server process per model: tests/support/extreme.py says what is checked and why.  The
generative models, which never decode the pixels, are checked on the servers
of tests/integration/test_zoo_diffusion.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.extreme import EXPECTED_STATUS, GENERATIVE, check_extreme_aspect_ratios
from tests.support.processes import SHIPPED_CONF, Proc, start_model_server, write_config

CATALOG = sorted(path.stem for path in SHIPPED_CONF.glob("*.toml"))

#: The models whose servers this module starts: every catalog model that decodes the image.
DECODING = sorted(set(CATALOG) - set(GENERATIVE))

#: Cheap params per model (SAM: a 2x2 prompt grid).
PARAMS = {"SAM_AMG": {"points_per_side": 2}}


def test_every_catalog_model_is_covered():
    """The table of expected statuses names exactly the shipped catalog, and every
    model that decodes pixels is checked here (the others in test_zoo_diffusion)."""
    assert sorted(EXPECTED_STATUS) == CATALOG
    assert DECODING == ["MOBILENETV2", "SAM_AMG", "YOLOV8"]
    assert all(EXPECTED_STATUS[model_id] == 5 for model_id in DECODING)


@pytest.fixture(scope="module", params=DECODING)
def server(request, tmp_path_factory) -> Iterator[tuple[str, Proc]]:
    model_id = request.param
    # One image per batch: a warm-up at the shipped batch of 8 (1.4 s of YOLOV8's start) would only
    # raise the peak the growth is measured from; every image still goes through the shipped preprocessing.
    proc = start_model_server(write_config(tmp_path_factory.mktemp(f"extreme-{model_id}"), model_id,
                                           max_batch_size=1))
    yield model_id, proc
    proc.stop()


def test_extreme_aspect_ratios_cost_bounded_memory(server):
    """tests/support/extreme.check_extreme_aspect_ratios on a shipped config."""
    model_id, proc = server
    check_extreme_aspect_ratios(proc, model_id, f"/{model_id.lower()}/predict", PARAMS.get(model_id, {}))
