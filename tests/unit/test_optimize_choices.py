"""``auto``'s recorded choice: a second load with the same key applies it without measuring (svc/optimize/choices.py).

The small real torch model and the injected timings and failures of
``tests/unit/test_optimize_select.py``; records go to a folder of the test's
own.  Whether a load measured is read from what it did (gate runs, timer
calls, modes applied) and from its line, never from how long it took.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from svc.optimize import choices, select
from svc.optimize.select import Optimizer
from tests.unit.test_optimize_select import TinyClassifier, named_apply, timings

FIGURES = {"eager": 10.0, "channels_last": 9.0, "jit": 4.0}


class Counted:
    """What a load did: the modes it applied, its timer calls, the phases it reported."""

    def __init__(self, failing: dict[str, Exception] | None = None, **ms: float) -> None:
        self.applied: list[str] = []
        self.timed = 0
        self.phases: list[str] = []
        self._apply = named_apply(failing)
        self._timer = timings(**(ms or FIGURES))

    def apply(self, target: Any, mode: Any, device: str, batch: int) -> Any:
        self.applied.append(mode.name)
        return self._apply(target, mode, device, batch)

    def timer(self, pairs: list, batch: int) -> float:
        self.timed += 1
        return self._timer(pairs, batch)


def load(model: TinyClassifier, folder, counted: Counted) -> select.Report:
    return Optimizer(model, "classification", "cpu", "auto", 4, "TINY", apply=counted.apply, timer=counted.timer,
                     phase=counted.phases.append, choices=folder).run()


@pytest.fixture
def folder(tmp_path):
    return tmp_path / "choices"


def test_a_second_load_with_the_same_key_applies_the_recorded_mode_without_measuring(folder):
    first = Counted()
    report = load(TinyClassifier(), folder, first)
    assert report.mode == "jit" and report.recorded is None and first.timed > 0
    [path] = folder.glob("*.json")
    assert re.fullmatch(r"TINY-[0-9a-f]{32}\.json", path.name)
    record = json.loads(path.read_text())
    assert (record["mode"], record["speedup"], record["line"]) == ("jit", 2.5, report.line)

    model, again = TinyClassifier(), Counted()  # a restart: the same weights, code, candidates, machine
    report = load(model, folder, again)
    assert report.mode == "jit" and report.recorded is not None and report.outcomes == []
    assert (again.applied, again.timed, model.gate_calls) == (["jit"], 0, 0)  # nothing gated, nothing timed
    assert re.fullmatch(r"TINY: optimize auto chose jit, batch 4: as measured \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, "
                        rf"2\.50x eager \({path.name}\), not measured again \(\d+\.\d s\)", report.line), report.line
    assert again.phases == [f"applying jit, the mode measured {report.recorded.when} (recorded: not measured again)"]
    assert model.run.mode_name == "jit"  # installed: predict runs the recorded mode
    images = torch.rand(3, 3, 8, 8)
    assert torch.allclose(torch.stack(model.predict(list(images), {})), model.net(images), atol=1e-5)
    assert list(folder.glob("*.json")) == [path]


def test_a_recorded_eager_choice_leaves_the_model_eager_and_measures_nothing(folder):
    load(TinyClassifier(), folder, Counted(eager=10.0, channels_last=9.9, jit=9.8))
    model, again = TinyClassifier(), Counted()
    report = load(model, folder, again)
    assert report.mode == "eager" and report.recorded is not None and report.recorded.speedup is None
    assert (again.applied, again.timed, model.gate_calls) == ([], 0, 0) and model.run is model.net
    assert re.fullmatch(r"TINY: optimize auto chose eager, batch 4: as measured [\d-]+ [\d:]+ UTC "
                        r"\(TINY-[0-9a-f]{32}\.json\), not measured again \(\d+\.\d s\)", report.line), report.line


def test_new_weights_or_other_candidates_measure_afresh(folder):
    load(TinyClassifier(), folder, Counted())
    retrained, counted = TinyClassifier(), Counted()
    with torch.no_grad():
        retrained.net[0].weight.add_(0.01)
    report = load(retrained, folder, counted)
    assert report.recorded is None and counted.timed > 0 and retrained.gate_calls == 3
    assert report.line.startswith("TINY: optimize auto chose jit, batch 4: eager 10.0 ms; ")
    assert len(list(folder.glob("*.json"))) == 2  # a record per key

    fewer, counted = TinyClassifier(candidates=("jit",)), Counted()
    assert load(fewer, folder, counted).recorded is None and counted.applied == ["jit"] and counted.timed > 0
    assert len(list(folder.glob("*.json"))) == 3


def test_a_corrupt_record_is_ignored_with_a_note_and_replaced(folder):
    load(TinyClassifier(), folder, Counted())
    [path] = folder.glob("*.json")
    path.write_text('{"format": 1, "mode": "ji')  # cut short
    model, counted = TinyClassifier(), Counted()
    report = load(model, folder, counted)
    assert report.mode == "jit" and report.recorded is None and counted.timed > 0 and model.gate_calls == 3
    assert f"(min gain 5%; recorded choice {path.name} ignored: not JSON (" in report.line
    assert json.loads(path.read_text())["mode"] == "jit"  # measured again, recorded again

    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "mode": "channels_last+bf16"}))  # not among the candidates
    report = load(TinyClassifier(), folder, Counted())
    assert (f"recorded choice {path.name} ignored: its mode 'channels_last+bf16' is not among the candidates"
            in report.line) and report.recorded is None


def test_a_recorded_mode_that_fails_to_apply_falls_back_to_measuring(folder):
    load(TinyClassifier(), folder, Counted())
    model, counted = TinyClassifier(), Counted(failing={"jit": RuntimeError("injected: the cached model is gone")})
    report = load(model, folder, counted)
    assert report.mode == "channels_last" and report.recorded is None and model.run.mode_name == "channels_last"
    assert counted.applied == ["jit", "channels_last", "jit"] and counted.timed > 0  # the record's, then measured
    assert ("(min gain 5%; the recorded jit failed to apply (RuntimeError: injected: the cached model is gone): "
            "measured again; ") in report.line
    [path] = folder.glob("*.json")
    assert json.loads(path.read_text())["mode"] == "channels_last"


@pytest.mark.parametrize("field, value, problem", [
    ("chosen_at", float("inf"), "its time or speed-up is not a finite number"),
    ("chosen_at", float("nan"), "its time or speed-up is not a finite number"),
    ("chosen_at", True, "its time or speed-up is not a finite number"),
    ("chosen_at", 1e300, "its time 1e+300 is not a date"),
    ("speedup", float("nan"), "its time or speed-up is not a finite number"),
    ("speedup", -2.0, "its time or speed-up is not a finite number"),
])
def test_a_record_with_a_number_that_is_no_time_or_speed_up_is_ignored_and_replaced(folder, field, value, problem):
    """``"chosen_at": Infinity`` (JSON to Python) failed every start with OverflowError and left it eager for good."""
    load(TinyClassifier(), folder, Counted())
    [path] = folder.glob("*.json")
    path.write_text(json.dumps({**json.loads(path.read_text()), field: value}))
    report = load(TinyClassifier(), folder, Counted())
    assert report.mode == "jit" and report.recorded is None, report.line
    assert f"recorded choice {path.name} ignored: {problem}" in report.line
    assert json.loads(path.read_text())[field] != value or field == "speedup" and value != value  # replaced


def test_a_candidate_that_failed_for_a_passing_reason_leaves_no_record(folder):
    counted = Counted(failing={"jit": OSError(28, "No space left on device")})
    report = load(TinyClassifier(), folder, counted)
    assert report.mode == "channels_last" and list(folder.glob("*.json")) == []  # the measuring lock's file only
    assert "; choice not recorded: jit failed in a way that may pass; " in report.line


def test_timing_leaves_out_modes_clearly_slower_after_the_first_rounds(folder):
    counted = Counted()  # jit 2.5x eager, channels_last 2.25x slower than jit
    report = load(TinyClassifier(), folder, counted)
    assert report.mode == "jit" and counted.timed == 6  # two rounds of three modes: then jit is alone
    assert ("; timed in fewer of 3 rounds: eager 2, channels_last 2, jit 2 (over 1.5x the fastest after 2, "
            "or alone)") in report.line
    close = Counted(eager=10.0, channels_last=9.0, jit=8.0)
    report = load(TinyClassifier(), folder / "other", close)
    assert report.mode == "jit" and close.timed == 9 and "timed in fewer" not in report.line


def test_the_key_covers_the_machine_and_the_layout_of_threads(monkeypatch):
    model = TinyClassifier()
    targets = model.optimization_targets()

    def key(**changes: Any) -> str:
        args = {"model": model, "model_id": "TINY", "category": "classification", "targets": targets,
                "candidates": ["jit"], "device": "cpu", "batch": 4, "workers": 1, **changes}
        return choices.choice_key(**args)

    base = key()
    assert key() == base
    assert len({base, key(workers=2), key(batch=8), key(model_id="OTHER"), key(candidates=["jit", "openvino"])}) == 5
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert key() != base
    finally:
        torch.set_num_threads(threads)
    monkeypatch.setattr(choices, "cpu_identity", lambda path="": ["Another CPU", "avx2", "2"])
    assert key() != base
    monkeypatch.undo()
    monkeypatch.setattr(choices, "_version", lambda package: "0.0" if package == "openvino" else "1")
    assert key() != base


def test_eager_alone_is_timed_once(folder):
    counted = Counted(failing={"channels_last": OSError("no"), "jit": ValueError("no")})
    report = load(TinyClassifier(), folder, counted)
    assert report.mode == "eager" and counted.timed == 1
    assert report.line.startswith("TINY: optimize auto chose eager, batch 4: eager 10.0 ms; channels_last dropped (")
    assert "; timed in fewer of 3 rounds: eager 1 (" in report.line


def test_the_state_directorys_folders_are_private_whatever_the_umask(tmp_path):
    """Under ``umask 000`` the state directory, ``inductor/`` and ``compiled/`` were 0777 (non-root probe): any
    local user could replace a compiled package that a model server then loads.  A folder that exists keeps
    its mode."""
    import os
    import stat

    from svc.optimize.cache import compiled_dir, use_inductor_cache

    env = {"SERVICE_STATE_DIR": str(tmp_path / "state" / "svc")}
    (tmp_path / "state").mkdir(mode=0o755)
    os.chmod(tmp_path / "state", 0o755)
    old = os.umask(0)
    try:
        inductor = use_inductor_cache(env)
        choices.write(compiled_dir(env) / choices.CHOICES, "M", "k", "eager", None, "line")
    finally:
        os.umask(old)
    modes = {p: stat.S_IMODE(os.stat(p).st_mode) for p in (tmp_path / "state" / "svc", inductor, compiled_dir(env),
                                                           compiled_dir(env) / choices.CHOICES)}
    assert set(modes.values()) == {0o700}, modes
    assert stat.S_IMODE(os.stat(tmp_path / "state").st_mode) == 0o755


def test_state_directory_folders_an_older_install_left_writable_by_others_are_made_private(tmp_path):
    """Folders made by 0.12.0 under ``umask 000`` stayed 0777 after an upgrade (only the folders made now were
    0700): those of the state directory this user owns lose the group's and others' write permission, with one
    warning each; a folder above the state directory keeps its mode."""
    import os
    import stat

    from twisted.logger import capturedLogs

    from svc.optimize.cache import use_inductor_cache

    state = tmp_path / "shared" / "svc"
    (state / "inductor").mkdir(parents=True)
    for folder in (tmp_path / "shared", state, state / "inductor"):
        os.chmod(folder, 0o777)
    with capturedLogs() as events:
        assert use_inductor_cache({"SERVICE_STATE_DIR": str(state)}) == state / "inductor"
    modes = {p.name: stat.S_IMODE(os.stat(p).st_mode) for p in (tmp_path / "shared", state, state / "inductor")}
    assert modes == {"shared": 0o777, "svc": 0o755, "inductor": 0o755}
    warned = sorted(e["folder"] for e in events if e.get("log_level").name == "warn")
    assert warned == [str(state), str(state / "inductor")]


# -- one measurement at a time on a host (svc/optimize/measuring.py) ----------------------------------


def test_a_load_waits_while_another_model_measures_and_says_for_whom(folder):
    """Seven models measuring at once on 2 cores chose MOBILENETV2's mode at random and recorded it for good: a
    load that must measure waits for the host's measuring lock, and its phase names the model it waits for."""
    import threading

    from svc.optimize import measuring

    holding, release = threading.Event(), threading.Event()

    def other() -> None:
        with measuring.alone(folder, "OTHER", lambda text: None) as waited:
            assert waited == 0.0
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=other)
    holder.start()
    assert holding.wait(30)
    counted = Counted()
    waiting = threading.Event()
    counted.phases = _Signalling(waiting)
    result: list[select.Report] = []
    loader = threading.Thread(target=lambda: result.append(load(TinyClassifier(), folder, counted)))
    loader.start()
    assert waiting.wait(30)
    assert counted.timed == 0 and result == []  # nothing measured while the other model holds the lock
    assert counted.phases[0].startswith("waiting for OTHER (pid ") and counted.phases[0].endswith(
        ") to finish measuring its modes (one model measures at a time)")
    # Another model takes its turn before this one (as seven do): the phase names it, not the first one seen.
    waiting.clear()
    _now_holding(folder / measuring.LOCK_FILE, "THIRD (pid 7)")
    assert waiting.wait(30)
    assert counted.phases[1] == "waiting for THIRD (pid 7) to finish measuring its modes (one model measures at a time)"
    # A replica of the same model: the phase says so, rather than naming the model as if it waited for itself.
    waiting.clear()
    _now_holding(folder / measuring.LOCK_FILE, "TINY (pid 9)")
    assert waiting.wait(30)
    assert counted.phases[2] == ("waiting for another replica of TINY (pid 9) to finish measuring its modes (its "
                                 "choice is used then)")
    release.set()
    holder.join(30)
    loader.join(30)
    assert result[0].mode == "jit" and counted.timed > 0


def test_a_replica_that_waited_uses_the_record_written_meanwhile(folder):
    """Two replicas of one model start together: the second waits for the first's measurement, then applies its
    record instead of measuring again."""
    import threading

    from svc.optimize import measuring

    first = Counted()
    load(TinyClassifier(), folder, first)  # the key's record, as the first replica writes it
    [record] = folder.glob("*.json")
    text = record.read_text()
    record.unlink()
    holding, release = threading.Event(), threading.Event()

    def first_replica() -> None:
        with measuring.alone(folder, "TINY", lambda text: None):
            holding.set()
            release.wait(30)
            record.write_text(text)  # its measurement ends with its record

    holder = threading.Thread(target=first_replica)
    holder.start()
    assert holding.wait(30)
    second, waiting = Counted(), threading.Event()
    second.phases = _Signalling(waiting)
    result: list[select.Report] = []
    loader = threading.Thread(target=lambda: result.append(load(TinyClassifier(), folder, second)))
    loader.start()
    assert waiting.wait(30)
    release.set()
    holder.join(30)
    loader.join(30)
    assert result[0].mode == "jit" and result[0].recorded is not None
    assert second.timed == 0 and second.applied == ["jit"]  # applied from the record, nothing timed


def test_no_lock_is_taken_through_a_link(folder, tmp_path):
    from svc.optimize import measuring

    folder.mkdir(mode=0o700)
    target = tmp_path / "not-ours"
    target.write_text("keep")
    (folder / measuring.LOCK_FILE).symlink_to(target)
    with measuring.alone(folder, "TINY", lambda text: None) as waited:
        assert waited == 0.0
    assert target.read_text() == "keep"  # not truncated through the link


def _now_holding(lock_file, holder: str) -> None:
    """Say in the lock file that ``holder`` measures now, in one write over the old text (no truncation first: a
    waiter reading in between would see an empty file and name "another model")."""
    with open(lock_file, "r+b") as f:
        f.write(f"{holder:<200}".encode())


def test_a_record_that_failed_to_apply_is_not_applied_again_after_a_wait_and_the_wait_is_said(folder):
    """An optimize probe: a recorded mode that failed to apply (its runtime gone) was tried again after the load
    waited for another model's measurement, and said so twice in its line; and the line's time (46.8 s) hid a
    40 s wait for the lock, read as a slow start."""
    import threading

    load(TinyClassifier(), folder, Counted())  # the record: jit
    counted, waiting = Counted(failing={"jit": RuntimeError("injected: no runtime")}), threading.Event()
    counted.phases = _Signalling(waiting)
    result: list[select.Report] = []
    loader = threading.Thread(target=lambda: result.append(load(TinyClassifier(), folder, counted)))
    with _held(folder, "OTHER"):
        loader.start()
        assert waiting.wait(30)
    loader.join(30)
    line = result[0].line
    assert counted.applied == ["jit", "channels_last", "jit"]  # the record's, then measured: not the record twice
    assert line.count("the recorded jit failed to apply") == 1, line
    assert re.search(r"; waited \d+\.\d s for another model's measurement;", line), line


@contextlib.contextmanager
def _held(folder, name: str) -> Iterator[None]:
    """``name`` holds the measuring lock, in a thread of its own, until the block ends."""
    import threading

    from svc.optimize import measuring

    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with measuring.alone(folder, name, lambda text: None):
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(30)
    try:
        yield
    finally:
        release.set()
        holder.join(30)


class _Signalling(list):
    """A phases list that sets ``event`` when the load reports it waits."""

    def __init__(self, event) -> None:
        super().__init__()
        self.event = event

    def append(self, text: str) -> None:
        super().append(text)
        if text.startswith("waiting for "):
            self.event.set()


def test_a_measurement_hung_past_the_bound_is_measured_beside(folder, monkeypatch):
    """A holder alive but hung (not dead: the kernel would release its lock) does not hold every other start for
    ever: past WAIT_MAX_S the waiting one measures beside it, and its phase says so."""

    from svc.optimize import measuring

    monkeypatch.setattr(measuring, "WAIT_MAX_S", 0.0)
    monkeypatch.setattr(measuring, "POLL_S", 0.01)
    phases: list[str] = []
    with _held(folder, "HUNG"), measuring.alone(folder, "TINY", phases.append) as waited:
        assert waited > 0
    assert phases[-1].startswith("measuring beside HUNG (pid ") and phases[-1].endswith(
        "), which held the measuring lock over 0 s")


def test_no_lock_is_taken_in_a_folder_another_user_owns(tmp_path):
    """A records folder another user could change is not used for the lock either (the records' own rule,
    svc.optimize.cache.trust_problem): nothing is made in it, and the measurement goes on without the lock."""
    import os

    from svc.optimize import measuring

    folder = tmp_path / "choices"
    folder.mkdir(mode=0o755)
    os.chown(folder, 65534, 65534)  # nobody's (the suite runs as root, as CI does)
    with measuring.alone(folder, "TINY", lambda text: None) as waited:
        assert waited == 0.0
    assert list(folder.iterdir()) == []
