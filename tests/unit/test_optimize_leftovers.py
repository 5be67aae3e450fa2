"""Temporary files of the compiled-artefact cache left by a killed process are removed (svc/optimize/cache.py)."""

from __future__ import annotations

import os
import subprocess
import time

from svc.optimize.cache import UNNAMED_LEFTOVER_S, temporary_file, write_atomically


def ended_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def test_a_new_temporary_file_first_removes_those_of_processes_that_ended(tmp_path):
    """A restart or a stop during a model's first compile left its .building-*.pt2 in the state directory for
    good (two after one probe, each a package's size when cut while packaging)."""
    dead, mine = ended_pid(), os.getpid()
    names = {
        f".building-{dead}-ab12cd34.pt2": False,  # a killed build: removed
        f".converting-{dead}-ef56.xml": False, f".converting-{dead}-ef56.bin": False,  # its .bin beside it
        f".writing-{mine}-gh78.json": True,  # this process's own, being written: kept
        ".exporting-old0123.onnx": False,  # an earlier version's (no pid), over an hour old
        ".building-new4567.pt2": True,  # an earlier version's, young: perhaps still building
        "net-compile-0123.pt2": True, "net-compile-0123.json": True,  # the artefacts themselves
        ".building-notes.txt": True,  # not a temporary file of ours
    }
    for name in names:
        (tmp_path / name).write_text("x")
    past = time.time() - UNNAMED_LEFTOVER_S - 60
    os.utime(tmp_path / ".exporting-old0123.onnx", (past, past))
    made = temporary_file(tmp_path / "net-compile-4567.pt2", "building", ".pt2")
    assert os.path.basename(made).startswith(f".building-{mine}-") and os.path.getsize(made) == 0
    assert os.stat(made).st_mode & 0o777 == 0o600
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {name for name, kept in names.items() if kept} | {os.path.basename(made)}


def test_write_atomically_leaves_only_the_file(tmp_path):
    write_atomically(tmp_path / "a.json", '{"a": 1}')
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"] and (tmp_path / "a.json").read_text() == '{"a": 1}'
