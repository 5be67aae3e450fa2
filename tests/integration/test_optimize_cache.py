"""A restart reuses the package ``compile`` stored under the state directory (``backend.optimize``).

Real model-server processes of the test-only TESTFAULTS plugin with its tiny
conv net (``[model] optimizable = true``), so that compiling takes seconds.
The first start compiles a package into ``$SERVICE_STATE_DIR/compiled``; the
second, with ``auto`` and the same state directory, loads it: the
optimisation line counts the packages a load built and loaded.  The third,
``auto`` again, applies the mode the second one chose and recorded, without
measuring.  Reuse is asserted with those counts and lines, not with timings.
A cache hit first checks the folders it reads from (svc/optimize/cache.py).
"""

from __future__ import annotations

import base64
import io
import json
import re

from PIL import Image

from tests.support.http import post
from tests.support.processes import start_model_server, write_config

LINE = re.compile(r"TESTFAULTS: optimize (\w+)(?: chose (\S+),)?[^\n]*?; compiled packages: (\d+) built, "
                  r"(\d+) loaded from the cache\)")


def colour_image(rgb: tuple[int, int, int]) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), rgb).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def served_means(server) -> list:
    reply = post(server.url + "/testfaults/predict", {"images": [colour_image((10, 20, 30)), colour_image((200, 0, 7))]},
                 headers=server.auth)
    assert reply.status == 200 and reply.json["status"] == 0, reply.body[:300]
    return [item["data"]["mean"] for item in reply.json["results"]]


def start(tmp_path, optimize: str, env: dict[str, str] | None = None):
    config = write_config(tmp_path, "TESTFAULTS", backend={"optimize": optimize}, model={"optimizable": True})
    return start_model_server(config, env={"SERVICE_STATE_DIR": str(tmp_path / "state"), **(env or {})},
                              ready_timeout=300)


def test_a_restart_reuses_the_compiled_package_from_the_state_directory(tmp_path):
    first = start(tmp_path, "compile")
    try:
        assert served_means(first) == [[10.0, 20.0, 30.0], [200.0, 0.0, 7.0]]
        output = first.output()
    finally:
        assert first.stop() == 0
    found = LINE.search(output)
    assert found, output
    assert found.groups() == ("compile", None, "1", "0"), found.group(0)
    assert "TESTFAULTS: optimize compile: gate passed [top-1 4/4" in output
    assert "ready (version test-faults; optimize compile; warm-up batch of 4" in output
    [package] = (tmp_path / "state" / "compiled").glob("net-compile-*.pt2")  # under the state directory

    again = start(tmp_path, "auto")  # tries jit and compile: compile from the cache
    try:
        assert served_means(again) == [[10.0, 20.0, 30.0], [200.0, 0.0, 7.0]]
        output = again.output()
    finally:
        assert again.stop() == 0
    found = LINE.search(output)
    assert found, output
    setting, chosen, built, loaded = found.groups()
    assert (setting, built, loaded) == ("auto", "0", "1"), found.group(0)
    assert chosen in ("eager", "jit", "compile")
    assert re.search(r"batch 4: eager [\d.]+ ms; jit [\d.]+ ms [\d.]+x \[top-1 4/4[^]]*\]; compile [\d.]+ ms", output)
    assert f"ready (version test-faults; optimize {chosen}; warm-up batch of 4" in output
    assert list((tmp_path / "state" / "compiled").glob("*.pt2")) == [package]
    [record] = (tmp_path / "state" / "compiled" / "choices").glob("TESTFAULTS-*.json")

    third = start(tmp_path, "auto")  # the choice recorded by the second start: nothing measured
    try:
        assert served_means(third) == [[10.0, 20.0, 30.0], [200.0, 0.0, 7.0]]
        output = third.output()
    finally:
        assert third.stop() == 0
    cache = "; compiled packages: 0 built, 1 loaded from the cache" if chosen == "compile" else ""
    assert re.search(rf"TESTFAULTS: optimize auto chose {re.escape(chosen)}, batch 4: as measured [\d-]+ [\d:]+ UTC"
                     rf"(, [\d.]+x eager)? \({record.name}\), not measured again \([\d.]+ s{cache}\)\n", output), output
    assert f"ready (version test-faults; optimize {chosen}; warm-up batch of 4" in output


def test_a_state_directory_where_nothing_can_be_written_does_not_stop_an_eager_load(tmp_path, monkeypatch):
    """Importing torchvision makes inductor's cache directory: pointed into a state directory that cannot hold
    it, the load failed, ``optimize = "eager"`` included.  The kernel cache then stays in torch's default place."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # one in the environment is kept: none here
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    config = write_config(tmp_path, "MOBILENETV2", backend={"optimize": "eager"})
    server = start_model_server(config, env={"SERVICE_STATE_DIR": str(blocked)})
    try:
        reply = post(server.url + "/mobilenetv2/predict", {"images": [colour_image((10, 20, 30))]},
                     headers=server.auth)
        assert reply.status == 200 and reply.json["status"] == 0, reply.body[:300]
        output = server.output()
    finally:
        assert server.stop() == 0
    assert f"cannot make {blocked}/inductor (is the state directory writable?)" in output, output


def test_a_cache_hit_checks_the_compiled_folder_before_it_reads_from_it(tmp_path):
    """A restart that found its conversion cached read it from a 0777 compiled/ without a word (only the state
    directory and inductor/ lost others' write permission); one owned by another user was read as well, and that
    user could swap the model served.  Now: this user's folders are made 0755 (one warning each), another user's
    folder is neither read nor written (one warning: converted in a private folder)."""
    import os
    import stat

    state, compiled = tmp_path / "state", tmp_path / "state" / "compiled"
    converted = re.compile(r"TESTFAULTS: optimize onnxruntime: gate passed [^\n]*; converted models: (\d+) converted, "
                           r"(\d+) read from the cache\)")

    def run() -> str:  # inductor's cache in the state directory, whatever an in-process test of this worker set
        server = start(tmp_path, "onnxruntime", env={"TORCHINDUCTOR_CACHE_DIR": ""})
        try:
            assert served_means(server) == [[10.0, 20.0, 30.0], [200.0, 0.0, 7.0]]
            return server.output()
        finally:
            assert server.stop() == 0

    assert converted.search(run()).groups() == ("1", "0")
    [record] = compiled.glob("*-onnxruntime-*.json")  # the model it was made for, for svcctl cache list
    assert json.loads(record.read_text())["made_for"] == "TESTFAULTS"
    for folder in (state, state / "inductor", compiled):
        os.chmod(folder, 0o777)  # what 0.12.0 left under umask 000
    output = run()
    assert converted.search(output).groups() == ("0", "1"), output  # a cache hit
    for folder in (state, state / "inductor", compiled):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755
        assert output.count(f"{folder} was writable by other users (mode 777), and it holds code the model servers "
                            "load: made mode 755") == 1, output

    os.chown(compiled, 65534, 65534)
    os.chmod(compiled, 0o777)
    before = {p.name: p.read_bytes() for p in compiled.iterdir()}
    output = run()
    assert converted.search(output).groups() == ("1", "0"), output  # not read: converted for this process
    assert output.count(f"{compiled} is owned by another user (uid 65534): another user could replace what the "
                        "model servers load from it, so nothing is read from it or written to it") == 1, output
    assert {p.name: p.read_bytes() for p in compiled.iterdir()} == before


def test_a_model_waits_while_another_measures_and_says_so_in_ready_and_its_log(tmp_path):
    """One model measures at a time on a host (svc/optimize/measuring.py): with the lock held by another
    measurement, a start with ``auto`` waits before it measures, its /ready 503 names the one it waits for, and so
    does its log (an upgrade probe found a minute with nothing in a waiting model's log); it measures once the
    lock is released."""
    import threading

    from svc.optimize import measuring
    from tests.support.http import request
    from tests.support.processes import spawn_model_server, until_ready, wait_bound_port, wait_until

    choices = tmp_path / "state" / "compiled" / "choices"
    holding, release = threading.Event(), threading.Event()

    def other_measurement() -> None:
        with measuring.alone(choices, "OTHER", lambda text: None):
            holding.set()
            release.wait(120)

    holder = threading.Thread(target=other_measurement)
    holder.start()
    server = None
    try:
        assert holding.wait(30)
        config = write_config(tmp_path, "TESTFAULTS", backend={"optimize": "auto"}, model={"optimizable": True})
        server = spawn_model_server(config, env={"SERVICE_STATE_DIR": str(tmp_path / "state")})
        server.port = wait_bound_port(server, 120)
        waiting = "waiting for OTHER (pid "
        reason = wait_until(lambda: (r := request("GET", server.url + "/ready")).status == 503
                            and waiting in r.json["error"] and r.json["error"], "the waiting phase", 120)
        assert reason.startswith("the model is loading: waiting for OTHER (pid ")
        wait_until(lambda: waiting in server.output(), "the waiting line in the log", 30)
        assert "TESTFAULTS: waiting for OTHER (pid " in server.output()
        assert "optimize auto chose" not in server.output()  # nothing measured while the lock is held
        release.set()
        until_ready(server, 300)
        assert re.search(r"TESTFAULTS: optimize auto chose \S+, batch 4: eager", server.output())
    finally:
        release.set()
        holder.join(30)
        if server is not None:
            assert server.stop() == 0
