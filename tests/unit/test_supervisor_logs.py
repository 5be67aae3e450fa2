"""The log sink: numbered lines, bounded ring, paging, batched file writes, rotation (on task.Clock)."""

from __future__ import annotations

import os

import pytest
from twisted.internet.task import Clock
from twisted.logger import formatTime
from twisted.python.logfile import LogFile

from svc.supervisor.logsink import FLUSH_DELAY_S, LogSink

#: How the file shows a supervisor's note made at time 0 of a test's clock: a note carries its time (a SIGSTOPped
#: model's "not ready" in the file said nothing of when the outage began).
T0 = formatTime(0.0)


def sink_in(tmp_path, clock=None, **kw) -> LogSink:
    kw.setdefault("max_bytes", 1 << 20)
    kw.setdefault("backups", 1)
    kw.setdefault("ring_lines", 10)
    return LogSink("M", str(tmp_path), clock=clock or Clock(), **kw)


def count_writes(sink: LogSink) -> list[str]:
    """Records every write that reaches the file."""
    writes: list[str] = []
    write = sink.file.write

    def recording(data):
        writes.append(data)
        write(data)

    sink.file.write = recording
    return writes


def disk_fills(sink: LogSink, written: int = 0) -> list[bool]:
    """The sink's file fails its writes with ENOSPC (after ``written`` bytes of each) while ``flag[0]``: a disk
    that fills, then has room again once the test sets it False."""
    write = sink.file.write
    failing = [True]

    def full(data):
        if failing[0]:
            write(data[:written])
            sink.file.flush()
            raise OSError(28, "No space left on device")
        write(data)

    sink.file.write = full
    return failing


def test_paging_by_offset_and_a_bounded_ring(tmp_path):
    sink = sink_in(tmp_path, ring_lines=5)
    sink.feed("stdout", b"".join(b"line %d\n" % i for i in range(8)))
    page = sink.page(None, 3)
    assert [e["line"] for e in page["lines"]] == ["line 5", "line 6", "line 7"]
    assert (page["first_offset"], page["next_offset"], page["end_offset"]) == (3, 8, 8)
    old = sink.page(0, 10)
    assert [e["seq"] for e in old["lines"]] == [3, 4, 5, 6, 7]  # older lines left the ring
    assert sink.page(8, 10)["lines"] == [] and sink.page(8, 10)["next_offset"] == 8
    assert sink.page(999999999999999999, 10)["lines"] == [] and sink.page(999999999999999999, 10)["next_offset"] == 8
    sink.feed("stderr", b"late\n")
    assert [e["line"] for e in sink.page(8, 10)["lines"]] == ["late"]


def test_line_times_come_from_the_clock(tmp_path):
    clock = Clock()
    clock.advance(1700000000.1234)
    sink = sink_in(tmp_path, clock)
    sink.note("started")
    (entry,) = sink.page(None, 10)["lines"]
    assert entry == {"seq": 0, "time": 1700000000.123, "stream": "supervisor", "line": "started"}


def test_lines_are_written_together_after_the_flush_delay(tmp_path):
    clock = Clock()
    sink = sink_in(tmp_path, clock)
    writes = count_writes(sink)
    sink.feed("stdout", b"one\ntwo\n")
    sink.note("three")
    assert writes == [] and (tmp_path / "M.log").read_text() == ""
    assert [e["line"] for e in sink.page(None, 10)["lines"]] == ["one", "two", "three"]  # the API sees them at once
    clock.advance(FLUSH_DELAY_S - 0.01)
    assert writes == []
    clock.advance(0.01)
    assert writes == [f"one\ntwo\n{T0} [supervisor] three\n"]
    assert (tmp_path / "M.log").read_text() == f"one\ntwo\n{T0} [supervisor] three\n"
    assert clock.getDelayedCalls() == []  # nothing waits: no timer
    sink.feed("stderr", b"four\n")
    clock.advance(FLUSH_DELAY_S)
    assert writes[1:] == ["four\n"]


def test_enough_waiting_lines_are_written_at_once(tmp_path):
    clock = Clock()
    sink = sink_in(tmp_path, clock, flush_size=20)
    writes = count_writes(sink)
    sink.feed("stdout", b"0123456789\n")
    assert writes == []
    sink.feed("stdout", b"abcdefghij\n")  # 22 characters wait: written now, no timer left
    assert writes == ["0123456789\nabcdefghij\n"] and clock.getDelayedCalls() == []


def test_the_end_of_the_process_and_close_write_everything(tmp_path):
    clock = Clock()
    sink = sink_in(tmp_path, clock)
    sink.feed("stdout", b"whole\nno newline")
    sink.ended()  # the last line without its newline is kept, and written now
    assert (tmp_path / "M.log").read_text() == "whole\nno newline\n"
    sink.note("stopped")
    sink.close()
    assert (tmp_path / "M.log").read_text() == f"whole\nno newline\n{T0} [supervisor] stopped\n"
    assert clock.getDelayedCalls() == []
    sink.note("after close")  # the ring only
    assert sink.page(None, 1)["lines"][0]["line"] == "after close"


def test_file_rotation_by_size(tmp_path):
    sink = sink_in(tmp_path, max_bytes=2048, backups=2)
    for i in range(200):
        sink.feed("stdout", b"x" * 60 + b" %d\n" % i)
    sink.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["M.log", "M.log.1", "M.log.2"]
    assert all(p.stat().st_size <= 2048 + 80 for p in tmp_path.iterdir())
    assert "199" in (tmp_path / "M.log").read_text()


@pytest.mark.parametrize("backups", [1, 2, 3])
def test_batched_rotation_matches_one_write_per_line(tmp_path, backups):
    """The same files, split at the same lines, as Twisted's LogFile written line by line."""
    lines = [("y" * (i % 70)) + f" {i}\n" for i in range(400)]
    reference = tmp_path / "reference"
    reference.mkdir()
    plain = LogFile("M.log", str(reference), rotateLength=1024, maxRotatedFiles=backups)
    for line in lines:
        plain.write(line)
    plain.close()

    clock = Clock()
    sink = sink_in(tmp_path / "batched", clock, max_bytes=1024, backups=backups, flush_size=3000)
    for n, line in enumerate(lines):
        sink.feed("stdout", line.encode())
        if n % 37 == 0:
            clock.advance(FLUSH_DELAY_S)
    sink.close()
    ours = {p.name: p.read_text() for p in (tmp_path / "batched").iterdir()}
    theirs = {p.name: p.read_text() for p in reference.iterdir()}
    assert ours == theirs and len(ours) == backups + 1


@pytest.mark.parametrize("backups", [0, 1, 4])
def test_rotated_files_never_exceed_log_backups(tmp_path, backups):
    clock = Clock()
    sink = sink_in(tmp_path, clock, max_bytes=1024, backups=backups)
    for _ in range(100):  # about ten rotations
        sink.feed("stdout", b"z" * 100 + b"\n")
        clock.advance(FLUSH_DELAY_S)
        assert len([p for p in tmp_path.iterdir() if p.name != "M.log"]) <= backups
    sink.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["M.log"] + [f"M.log.{n}" for n in range(1, backups + 1)]


def test_backups_of_an_earlier_run_beyond_the_cap_go_at_the_first_rotation(tmp_path):
    for n in range(1, 7):
        (tmp_path / f"M.log.{n}").write_text("from an earlier run with more backups\n")
    sink = sink_in(tmp_path, max_bytes=1024, backups=2)
    sink.feed("stdout", b"z" * 1100 + b"\n" + b"next\n")
    sink.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["M.log", "M.log.1", "M.log.2"]
    assert (tmp_path / "M.log").read_text() == "next\n" and (tmp_path / "M.log.1").read_text() == "z" * 1100 + "\n"


def test_a_full_disk_keeps_the_lines_in_the_ring_and_raises_nothing(tmp_path):
    """A log file that cannot take a write (``/dev/full``: ENOSPC, as a full disk) must not fail the caller:
    the child's exit handling runs through ``ended()``, and a raise there left a dead child "running"."""
    (tmp_path / "M.log").symlink_to("/dev/full")
    sink = sink_in(tmp_path, ring_lines=20)
    sink.feed("stdout", b"one\ntwo\n")
    sink.ended()  # the process exited: everything out now
    sink.feed("stderr", b"three\n")
    sink.write_pending()
    lines = [(e["stream"], e["line"]) for e in sink.page(None, 20)["lines"]]
    assert lines == [("stdout", "one"), ("stdout", "two"),
                     ("supervisor", f"cannot write {tmp_path / 'M.log'}: No space left on device; lines are not "
                                    "written to the file until it can"),
                     ("stderr", "three")]  # said once per outage
    assert sink.lost == 3
    sink.close()


def test_writes_resume_with_a_count_of_the_lines_lost(tmp_path):
    sink = sink_in(tmp_path, ring_lines=20)
    failing = disk_fills(sink)
    sink.feed("stdout", b"lost\n")
    sink.write_pending()
    failing[0] = False
    sink.feed("stdout", b"kept\n")
    sink.write_pending()
    assert (tmp_path / "M.log").read_text() == (f"kept\n{T0} [supervisor] writing " + str(tmp_path / "M.log")
                                                + " again; at least 1 lines were not written to it\n")
    assert sink.lost == 0


def test_a_log_file_deleted_or_moved_by_hand_is_opened_again(tmp_path):
    """Written on, a deleted file grew out of sight past max_bytes, never rotated, until the disk was full."""
    sink = sink_in(tmp_path, max_bytes=100, backups=1)
    log = tmp_path / "M.log"
    sink.feed("stdout", b"first\n")
    sink.write_pending()
    log.unlink()  # an operator's clean-up
    sink.feed("stdout", b"second\n")
    sink.write_pending()
    assert log.read_text() == "second\n"
    assert log.stat().st_ino == os.fstat(sink.file._file.fileno()).st_ino  # the old inode is let go
    log.rename(tmp_path / "M.log.old")  # logrotate's move
    sink.feed("stdout", b"third\n")
    sink.write_pending()
    assert log.read_text() == "third\n" and (tmp_path / "M.log.old").read_text() == "second\n"
    log.unlink()
    sink.feed("stdout", b"x" * 120 + b"\nnext\n")  # past max_bytes once more: rotation works on the new file
    sink.write_pending()
    assert (tmp_path / "M.log.1").read_text() == "x" * 120 + "\n" and log.read_text() == "next\n"
    sink.close()


def test_a_log_file_cut_short_in_place_is_written_on_at_its_new_end(tmp_path):
    """logrotate's ``copytruncate``: the file was written on at the old offset (opened ``rb+``, not for
    appending), a hole of NUL bytes as long as the file had been, carried into its backups too."""
    sink = sink_in(tmp_path, max_bytes=100, backups=1)
    log = tmp_path / "M.log"
    sink.feed("stdout", b"a" * 60 + b"\n")
    sink.write_pending()
    (tmp_path / "M.log.copy").write_bytes(log.read_bytes())  # the copy, then the cut
    os.truncate(log, 0)
    sink.feed("stdout", b"after\n")
    sink.write_pending()
    assert log.read_bytes() == b"after\n"
    sink.feed("stdout", b"b" * 60 + b"\n" + b"c\n")  # the count of what the file holds went down with it
    sink.write_pending()
    assert log.read_bytes() == b"after\n" + b"b" * 60 + b"\nc\n" and not (tmp_path / "M.log.1").exists()
    sink.close()


def test_a_log_folder_removed_is_made_again(tmp_path):
    """``rm -r logs`` (a clean-up) lost every child's file log for good: one warning, then the ring only."""
    import shutil
    import stat

    sink = sink_in(tmp_path / "logs")
    sink.feed("stdout", b"first\n")
    sink.write_pending()
    shutil.rmtree(tmp_path / "logs")
    sink.feed("stdout", b"second\n")
    sink.write_pending()
    assert (tmp_path / "logs" / "M.log").read_text() == "second\n"
    assert stat.S_IMODE(os.stat(tmp_path / "logs").st_mode) == 0o700
    sink.close()


def test_a_line_cut_off_by_a_full_disk_is_ended_before_the_next_one(tmp_path):
    sink = sink_in(tmp_path, ring_lines=20)
    failing = disk_fills(sink, written=4)  # in the middle of a write
    sink.feed("stdout", b"cut off\n")
    sink.write_pending()
    failing[0] = False
    sink.feed("stdout", b"kept\n")
    sink.write_pending()
    assert (tmp_path / "M.log").read_text().splitlines()[:2] == ["cut ", "kept"]
    sink.close()


def test_a_log_folder_removed_and_made_again_raises_nothing_and_is_written_again(tmp_path):
    """The reopen of a file whose folder is gone fails and leaves the file closed: the next write raised
    AttributeError out of the sink (through a child's exit handling) instead of opening it again."""
    import shutil

    folder = tmp_path / "logs"
    sink = sink_in(folder, ring_lines=20)
    sink.feed("stdout", b"one\n")
    sink.write_pending()
    shutil.rmtree(folder)
    folder.write_text("a file where the folder was")  # the folder cannot be made again either
    sink.feed("stdout", b"two\n")
    sink.write_pending()  # no folder: counted as lost, kept in the ring
    assert sink.lost == 1
    folder.unlink()
    folder.mkdir()
    sink.feed("stdout", b"three\n")
    sink.ended()
    assert (folder / "M.log").read_text() == (f"three\n{T0} [supervisor] writing " + str(folder / "M.log")
                                              + " again; at least 1 lines were not written to it\n")
    sink.close()


def test_log_files_and_a_folder_made_for_them_are_the_owners_only(tmp_path):
    """The access lines carry job ids, the bearer handles of their jobs: the files were 0644 in a 0755 folder, for
    any local user to read (security probe). An existing file gets the mode too; so do files after a rotation."""
    folder = tmp_path / "logs"
    (folder).mkdir(mode=0o755)
    for name in ("M.log", "M.log.1", "M.log.3"):  # an earlier version's file and backups (one past log_backups)
        (folder / name).write_text("from before\n")
        os.chmod(folder / name, 0o644)
    os.symlink(folder / "gone", folder / "M.log.2")  # a backup that cannot be chmod'ed: left as it is
    sink = LogSink("M", str(folder), clock=Clock(), max_bytes=100, backups=2, ring_lines=10)
    assert {name: os.stat(folder / name).st_mode & 0o777 for name in os.listdir(folder) if name != "M.log.2"} == {
        "M.log": 0o600, "M.log.1": 0o600, "M.log.3": 0o600}
    os.unlink(folder / "M.log.2")
    for i in range(20):
        sink.line("stdout", f"line {i} " + "x" * 20)
    sink.close()
    assert sorted(os.listdir(folder)) == ["M.log", "M.log.1", "M.log.2"]
    assert {os.stat(folder / f).st_mode & 0o777 for f in os.listdir(folder)} == {0o600}
    assert os.stat(folder).st_mode & 0o777 == 0o755  # a folder the operator made keeps its mode
    made = tmp_path / "new" / "logs"
    LogSink("M", str(made), clock=Clock(), max_bytes=100, backups=0, ring_lines=10).close()
    assert (os.stat(made).st_mode & 0o777, os.stat(made / "M.log").st_mode & 0o777) == (0o700, 0o600)


def test_one_supervisor_per_logs_folder_and_a_killed_one_leaves_no_stale_lock(tmp_path):
    """Two supervisors of one folder (other ports, same configs) wrote into the same <id>.log files and both
    rotated them.  The folder's lock is an flock held by a real other process here: the kernel lets it go when
    that process is killed with SIGKILL, so nothing stale is left behind."""
    import signal
    import stat
    import subprocess
    import sys

    from svc.supervisor.logsink import LogDirLock

    logs = tmp_path / "logs"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from svc.supervisor.logsink import LogDirLock\n"
         f"lock = LogDirLock({str(logs)!r})\nassert lock.acquire() is None; print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert (logs / "supervisor.lock").read_text() == f"{holder.pid}\n"
        lock = LogDirLock(str(logs))
        assert lock.acquire() == (
            f"{logs} ({logs}) is in use by another supervisor (pid {holder.pid}), which writes and rotates the log "
            "files there: stop it, or give this one another [supervisor] log_dir")
        assert lock.file is None and (logs / "supervisor.lock").read_text() == f"{holder.pid}\n"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
    assert lock.acquire() is None  # no stale lock after kill -9
    assert (logs / "supervisor.lock").read_text() == f"{os.getpid()}\n"
    assert stat.S_IMODE(os.stat(logs / "supervisor.lock").st_mode) == 0o600
    lock.release()
    after = LogDirLock(str(logs))
    assert after.acquire() is None  # released: the next one takes it
    after.release()


def test_the_lock_is_taken_again_when_its_folder_was_removed(tmp_path):
    """A logs folder removed by hand took the lock's file with it: a second supervisor then started on the folder
    made again, and wrote its children's lines into the same files (a docs probe).  ``keep`` locks the new file."""
    import shutil
    import stat

    from svc.supervisor.logsink import LogDirLock

    logs = tmp_path / "logs"
    lock = LogDirLock(str(logs))
    assert lock.acquire() is None and lock.keep() is None  # nothing removed: nothing to do
    first = lock.file
    (logs / "supervisor.lock").write_text("")  # emptied in place: a refusal named its holder "unknown"
    assert lock.keep() is None and lock.file is first
    assert (logs / "supervisor.lock").read_text() == f"{os.getpid()}\n"
    shutil.rmtree(logs)
    assert lock.keep() is None and lock.file is not first and first.closed
    assert (logs / "supervisor.lock").read_text() == f"{os.getpid()}\n"
    assert stat.S_IMODE(os.stat(logs).st_mode) == 0o700
    second = LogDirLock(str(logs))
    assert second.acquire().startswith(f"{logs} ({logs}) is in use by another supervisor (pid {os.getpid()})")
    # Another supervisor locks the new file first: this one says so and keeps its old file.
    (logs / "supervisor.lock").unlink()
    assert second.acquire() is None
    held = lock.file
    assert lock.keep().startswith(f"{logs} ({logs}) is in use by another supervisor") and lock.file is held
    second.release()
    lock.release()


def test_the_supervisor_says_once_that_another_supervisor_locked_the_folder_made_again(tmp_path, monkeypatch):
    """The supervisor's check each second (``SupervisorService._keep_log_lock``): when another supervisor locked
    the folder made again first, one warning naming it, not one a second; once that one lets go, the lock is taken
    again without a word, and a later refusal is said again."""
    import shutil
    from types import SimpleNamespace

    from svc.supervisor import service
    from svc.supervisor.logsink import LogDirLock

    warnings: list[str] = []
    monkeypatch.setattr(service.log, "warn", lambda text, **fields: warnings.append(text.format(**fields)))
    logs = tmp_path / "logs"
    this = SimpleNamespace(log_lock=LogDirLock(str(logs)), _lock_problem=None)
    assert this.log_lock.acquire() is None
    other = LogDirLock(str(logs))

    def removed_and_taken_by_the_other() -> None:
        shutil.rmtree(logs)
        assert other.acquire() is None

    removed_and_taken_by_the_other()
    for _ in range(3):
        service.SupervisorService._keep_log_lock(this)
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("the logs folder's lock file was removed and could not be taken again: "
                                  f"{logs} ({logs}) is in use by another supervisor (pid {os.getpid()})")
    other.release()
    service.SupervisorService._keep_log_lock(this)
    assert len(warnings) == 1 and this._lock_problem is None
    assert this.log_lock.file is not None and (logs / "supervisor.lock").read_text() == f"{os.getpid()}\n"
    removed_and_taken_by_the_other()
    service.SupervisorService._keep_log_lock(this)
    assert len(warnings) == 2
    other.release()
    this.log_lock.release()
