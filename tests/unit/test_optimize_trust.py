"""The compiled cache's folders and files are checked before anything is read from them (svc/optimize/cache.py).

A model server loads a package as code and applies a recorded mode without its gate: whoever can change
``compiled/`` or ``compiled/choices/`` could swap the model it serves.  This user's folders lose others' write
permission (one warning each); another user's folder, or a file another user made, is not read (one warning).
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from twisted.logger import capturedLogs

from svc.optimize import cache, choices

#: Another user's uid (nobody's); the tests run as root, which may chown to it.
OTHER = 65534


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state directory of its own, a fresh set of warnings, and a scratch folder in the test's tree."""
    monkeypatch.setenv("SERVICE_STATE_DIR", str(tmp_path / "st"))
    monkeypatch.setattr(cache, "_WARNED", set(), raising=False)
    (tmp_path / "scratch").mkdir(mode=0o700)
    monkeypatch.setattr(cache, "_scratch", tmp_path / "scratch", raising=False)
    return tmp_path / "st"


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def warnings_of(events: list) -> list[str]:
    """The warning lines logged, formatted."""
    from twisted.logger import formatEvent

    return [formatEvent(e) for e in events if e.get("log_level").name == "warn"]


def a_state_dir_left_by_umask_000(state: Path, mode: int = 0o777) -> tuple[Path, Path]:
    """A state directory with a recorded choice and a cached artefact, every folder then made ``mode`` (0777: what
    0.12.0 left under ``umask 000``); (the artefact's record, its file)."""
    env = {"SERVICE_STATE_DIR": str(state)}
    cache.use_inductor_cache(env)
    choices.write(choices.choices_dir(), "M", "k", "eager", None, "line")
    meta, artefact = cache.compiled_dir() / "net-onnxruntime-0123.json", cache.compiled_dir() / "net-onnxruntime-0123.onnx"
    cache.write_atomically(artefact, "the converted model")
    cache.write_record(meta, [artefact], {"returns": "tensor"})
    for folder in (state, state / "inductor", state / "compiled", state / "compiled" / "choices"):
        os.chmod(folder, mode)
    return meta, artefact


def test_compiled_folders_left_writable_by_others_are_made_private_on_a_cache_hit(state):
    """On a restart that read its recorded choice and converted model (a cache hit), only the state directory and
    inductor/ lost others' write permission: compiled/ and compiled/choices/ stayed 0777, without a word."""
    meta, artefact = a_state_dir_left_by_umask_000(state)
    with capturedLogs() as events:
        cache.use_inductor_cache({"SERVICE_STATE_DIR": str(state)})
        recorded = choices.read(choices.choices_dir(), "M", "k", ["eager"])
        found = cache.read_cached(meta, [artefact], lambda record: record["returns"])
        assert choices.read(choices.choices_dir(), "M", "k", ["eager"]) == recorded  # a second read: no warning
    assert recorded is not None and recorded.mode == "eager" and found == "tensor"
    folders = (state, state / "inductor", state / "compiled", state / "compiled" / "choices")
    assert {folder.name: mode_of(folder) for folder in folders} == {
        "st": 0o755, "inductor": 0o755, "compiled": 0o755, "choices": 0o755}
    assert warnings_of(events) == [
        f"{folder} was writable by other users (mode 777), and it holds code the model servers load: made mode 755"
        for folder in folders]


@pytest.mark.parametrize("mode", [0o777, 0o755], ids=["777", "755"])
def test_a_compiled_folder_of_another_user_is_neither_read_nor_written(state, mode):
    """compiled/ owned by nobody (0777) was used without a word: as nobody, a probe swapped the converted model
    and rewrote its record's SHA-256s, and the next start served the other model.  Whoever owns a folder can
    rename within it whatever its mode: 0755 is no safer."""
    meta, artefact = a_state_dir_left_by_umask_000(state, 0o755)
    compiled = state / "compiled"
    os.chown(compiled, OTHER, OTHER)
    os.chmod(compiled, mode)
    record = (compiled / "choices" / "M-k.json").read_bytes()
    with capturedLogs() as events:
        assert choices.read(choices.choices_dir(), "M", "k", ["eager"]) is None
        assert cache.read_cached(meta, [artefact], lambda record: record["returns"]) is None
        with pytest.raises(cache.UntrustedCache, match=f"^{compiled} is owned by another user \\(uid {OTHER}\\)$"):
            choices.write(choices.choices_dir(), "M", "k", "jit", None, "line")
        assert cache.usable_dir(compiled) == state.parent / "scratch" / "compiled"
    assert (compiled / "choices" / "M-k.json").read_bytes() == record and meta.is_file()  # untouched
    assert mode_of(compiled) == mode
    assert warnings_of(events) == [
        f"{compiled} is owned by another user (uid {OTHER}): another user could replace what the model servers load "
        "from it, so nothing is read from it or written to it (converted and compiled in a private temporary "
        "folder at each start, no choice recorded)"]


def test_an_inductor_folder_of_another_user_is_replaced_by_a_private_one(state):
    """inductor/ holds the kernels a compile build loads: another user's is not used."""
    (state / "inductor").mkdir(parents=True)
    os.chown(state / "inductor", OTHER, OTHER)
    env = {"SERVICE_STATE_DIR": str(state)}
    with capturedLogs() as events:
        path = cache.use_inductor_cache(env)
    assert path == state.parent / "scratch" / "inductor" and env["TORCHINDUCTOR_CACHE_DIR"] == str(path)
    assert mode_of(path) == 0o700 and not any((state / "inductor").iterdir())
    assert [line.split(":")[0] for line in warnings_of(events)] == [
        f"{state / 'inductor'} is owned by another user (uid {OTHER})"]


@pytest.mark.parametrize("change", ["owner", "mode", "link"])
def test_a_cached_file_another_user_made_or_may_change_is_made_again(state, change):
    """A file another user left in a folder while it was open to others (its record matching) is not read: it is
    counted unusable, its record removed, and the artefact made again over it."""
    meta, artefact = a_state_dir_left_by_umask_000(state, 0o755)
    if change == "owner":
        os.chown(artefact, OTHER, OTHER)
        why = f"is owned by another user (uid {OTHER})"
    elif change == "mode":
        os.chmod(artefact, 0o666)
        why = "is writable by other users (mode 666)"
    else:  # a link the other user made to a file of theirs
        target = state.parent / "theirs.onnx"
        os.replace(artefact, target)
        os.symlink(target, artefact)
        os.chown(target, OTHER, OTHER)
        why = f"is owned by another user (uid {OTHER})"
    stats: cache.Counter = cache.Counter()
    with capturedLogs() as events:
        assert cache.read_cached(meta, [artefact], lambda record: record["returns"], stats) is None
    assert stats == {"unusable": 1} and not meta.exists()
    assert warnings_of(events) == [f"{artefact} {why}: not read, made again"]


def test_a_recorded_choice_another_user_made_is_ignored(state):
    """A record is applied without the gate: one made by another user is ignored (the start measures and writes
    its own over it)."""
    choices.write(choices.choices_dir(), "M", "k", "eager", None, "line")
    os.chown(choices.choices_dir() / "M-k.json", OTHER, OTHER)
    with pytest.raises(choices.RecordError, match=f"^not trusted: it is owned by another user \\(uid {OTHER}\\)$"):
        choices.read(choices.choices_dir(), "M", "k", ["eager"])
    choices.write(choices.choices_dir(), "M", "k", "eager", None, "line")
    assert choices.read(choices.choices_dir(), "M", "k", ["eager"]) is not None


def test_the_private_folder_is_made_once_and_those_of_ended_processes_are_removed(tmp_path, monkeypatch):
    """An untrusted folder's stand-in lives in the temporary folder; a killed process left its own there."""
    import tempfile

    done = subprocess.Popen(["true"])
    done.wait()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(cache, "_scratch", None, raising=False)
    dead, alive = tmp_path / f"svc-untrusted-{done.pid}-ab12", tmp_path / f"svc-untrusted-{os.getpid()}-cd34"
    dead.mkdir()
    alive.mkdir()
    made = cache.scratch_dir()
    assert cache.scratch_dir() == made and made.parent == tmp_path and made.name.startswith(
        f"svc-untrusted-{os.getpid()}-")
    assert mode_of(made) == 0o700 and not dead.exists() and alive.exists()
