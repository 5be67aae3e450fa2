"""Where a child's output goes: ``logs/<id>.log`` with size-based rotation,
and a bounded in-memory ring of numbered lines served by the API.

Lines are numbered from 0 for the life of the supervisor; the ring keeps the
newest ``ring_lines`` of them, so a reader pages with ``offset`` (the number
of the first line wanted) and learns where the ring starts now.

The sink runs on the reactor thread, so the file is not written once per
line: lines wait in memory and go to the file together, ``flush_delay``
seconds after the first of them (a timer of the injected clock), at once
when ``flush_size`` are waiting, when the process ends and when the sink is
closed.  Rotation happens at the same line boundaries as with one write per
line: a file is rotated before the first line that finds it at
``max_bytes`` or more, and at most ``backups`` rotated files are kept.
"""

from __future__ import annotations

import os
import re
from collections import deque
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger, formatTime
from twisted.python.logfile import LogFile

from svc.infra.reactors import wall_time

log = Logger()

#: The start of a line in Twisted's text log format: ``2026-11-28T05:20:39+0000 [svc.infra.process#critical] ``.
_LOG_PREFIX = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d{4}|Z)? \[[^\]]*\] ")
#: The access log's lines (svc.web.site), one per request.
_ACCESS_LINE = " [svc.access#"
#: A line Twisted's text format logged at debug or info level.
_INFO_LINE = re.compile(r"^\S+ \[[^\]]*#(?:debug|info)\] ")
#: What a reactor prints as it starts and stops, around the line that says why.
_REACTOR_NOISE = re.compile(r"\((?:TCP|UDP) Port \d+ Closed\)|Main loop terminated\.|Server Shut Down\.|"
                            r"Starting reactor\.\.\.|\w+ (?:starting|stopping) on \d+|(?:Starting|Stopping) factory .*")

#: Lines wait at most this long (seconds) before they are written to the file...
FLUSH_DELAY_S = 0.2
#: ...or until this many characters wait.
FLUSH_SIZE = 64 * 1024
#: The mode of every log file, set on an existing one too (a folder made here is 0700).
LOG_FILE_MODE = 0o600


class RotatingFile(LogFile):
    """Twisted's size-rotated file, keeping at most ``maxRotatedFiles`` backups.

    ``LogFile`` keeps one backup when asked for none; ``log_backups = 0``
    means none.  The backups already there get the file's mode too: those of
    an earlier version were 0644, and they hold the same access lines.
    """

    def __init__(self, name: str, directory: str, **kw: Any) -> None:
        super().__init__(name, directory, **kw)
        if self.defaultMode is not None:
            for n in self.listLogs():
                try:
                    os.chmod(f"{self.path}.{n}", self.defaultMode)
                except OSError:  # another user's backup: as LogFile does for the file itself, it is left as it is
                    pass

    def rotate(self) -> None:
        super().rotate()
        backup = f"{self.path}.1"
        if self.maxRotatedFiles == 0 and os.path.exists(backup):
            os.remove(backup)


class LogSink:
    """Collects one child's stdout/stderr (and the supervisor's notes on it)."""

    def __init__(
        self,
        name: str,
        directory: str | None,
        *,
        clock: IReactorTime,
        max_bytes: int,
        backups: int,
        ring_lines: int,
        flush_delay: float = FLUSH_DELAY_S,
        flush_size: int = FLUSH_SIZE,
    ) -> None:
        self.clock = clock  # IReactorTime: line times and the write timer
        self.ring: deque[tuple[int, float, str, str]] = deque(maxlen=ring_lines)
        self.next_seq = 0
        self.flush_delay = flush_delay
        self.flush_size = flush_size
        self._partial: dict[str, bytes] = {}
        self._pending: list[str] = []  # lines for the file, not yet written
        self._pending_size = 0
        self._timer: Any = None
        self.name = name
        self.lost = 0  # lines not written to the file while it failed
        self._write_error: str | None = None  # why the last write failed; None while writes succeed
        self.file: RotatingFile | None = None
        if directory is not None:
            # Owner only: the access lines carry job ids, which are the bearer handles of their jobs.
            os.makedirs(directory, mode=0o700, exist_ok=True)
            self.file = RotatingFile(f"{name}.log", directory, rotateLength=max_bytes, defaultMode=LOG_FILE_MODE,
                                     maxRotatedFiles=backups)

    def feed(self, stream: str, data: bytes) -> None:
        """Bytes from a pipe: complete lines go to the file and the ring."""
        buffered = self._partial.get(stream, b"") + data
        *lines, rest = buffered.split(b"\n")
        self._partial[stream] = rest[-65536:]
        for raw in lines:
            self.line(stream, raw.decode("utf-8", "replace").rstrip("\r"))

    def ended(self) -> None:
        """The process ended: keep what is left without a newline, and write everything out."""
        for stream, rest in list(self._partial.items()):
            if rest:
                self.line(stream, rest.decode("utf-8", "replace"))
        self._partial.clear()
        self.write_pending()

    def line(self, stream: str, text: str) -> None:
        """One whole line: numbered into the ring now, written to the file with the next batch."""
        self._ring_line(stream, text)
        if self.file is None:
            return
        # The child's own lines carry their time; the supervisor's notes get theirs (an outage's start had none).
        prefix = "" if stream in ("stdout", "stderr") else f"{formatTime(self.ring[-1][1])} [{stream}] "
        entry = prefix + text + "\n"
        self._pending.append(entry)
        self._pending_size += len(entry)
        if self._pending_size >= self.flush_size:
            self.write_pending()
        elif self._timer is None:
            self._timer = self.clock.callLater(self.flush_delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.write_pending()

    def write_pending(self) -> None:
        """Write the waiting lines: one write per stretch between two rotations.

        ``LogFile.write`` rotates before a write that finds the file at its
        limit, so a stretch ends where one write per line would have rotated.
        """
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self.file is None or not self._pending:
            return
        pending, self._pending, self._pending_size = self._pending, [], 0
        try:
            self._reopen_if_gone(self.file)
            if self._write_error is not None and not self._ends_a_line(self.file):
                pending[0] = "\n" + pending[0]  # the write that failed was cut off mid-line
            self._write(self.file, pending)
        except OSError as e:  # a full or failing disk: the lines stay in the ring; the child is not affected
            self.lost += len(pending)
            if self._write_error is None:
                self._write_error = e.strerror or str(e)
                log.warn("{name}: cannot write {path}: {error}; its lines are kept in memory only (the API's "
                         "ring) until it can", name=self.name, path=self.file.path, error=self._write_error)
                self._ring_line("supervisor", f"cannot write {self.file.path}: {self._write_error}; lines are "
                                              "not written to the file until it can")  # the ring only
            return
        if self._write_error is not None:
            self._write_error = None
            # "at least": what the file's buffer held when a write failed is lost too, uncounted (a probe
            # counted 49 lines missing where 46 were said); the API's ring has every line.
            text = f"writing {self.file.path} again; at least {self.lost} lines were not written to it"
            log.info("{name}: {text}", name=self.name, text=text)
            self.lost = 0
            self.line("supervisor", text)
            self.write_pending()

    @staticmethod
    def _reopen_if_gone(file: RotatingFile) -> None:
        """Open the path again when it no longer names the open file (deleted or moved by hand or by logrotate),
        and write on at the end of a file cut short in place (logrotate's ``copytruncate``).

        Writing on to a deleted file grew it past ``max_bytes`` without a
        rotation (``LogFile.rotate`` does nothing when the path is gone), out of
        sight, until the disk was full.  A file left closed by a reopen that
        failed (its folder gone) is opened again once it can be, its folder
        made again (0700) when it was removed; the OSError of a failure is the
        caller's to count, as a full disk's.  A truncated file was written on
        at the old offset (``LogFile`` opens it ``rb+``, not for appending):
        a hole of NUL bytes as long as the file had been, in it and in its
        backups.
        """
        handle = getattr(file, "_file", None)  # LogFile.close deletes it; a failed open leaves none
        if handle is None or not os.path.isdir(file.directory):
            os.makedirs(file.directory, mode=0o700, exist_ok=True)
        if handle is None:
            file._openFile()
            return
        try:
            same = os.path.samestat(os.stat(file.path), os.fstat(handle.fileno()))
        except OSError:
            same = False
        if not same:
            file.reopen()
            return
        size = os.fstat(handle.fileno()).st_size
        if size < file.size:  # cut short in place: on from its new end
            handle.seek(0, os.SEEK_END)
            file.size = size

    @staticmethod
    def _ends_a_line(file: RotatingFile) -> bool:
        """Whether the file is empty or ends with a newline (a write cut off by a full disk does not)."""
        size = os.fstat(file._file.fileno()).st_size
        return size == 0 or os.pread(file._file.fileno(), 1, size - 1) == b"\n"

    @staticmethod
    def _write(file: RotatingFile, pending: list[str]) -> None:
        limit = file.rotateLength
        size = file.size
        stretch: list[str] = []
        for entry in pending:
            if limit and size >= limit:
                if stretch:
                    file.write("".join(stretch))
                    stretch = []
                size = 0  # the next write rotates first
            stretch.append(entry)
            size += len(entry)
        file.write("".join(stretch))
        file.flush()

    def _ring_line(self, stream: str, text: str) -> None:
        """A line numbered into the ring."""
        self.ring.append((self.next_seq, wall_time(self.clock, self.clock.seconds()), stream, text))
        self.next_seq += 1

    def note(self, text: str) -> None:
        """A line from the supervisor about this child (state changes)."""
        self.line("supervisor", text)

    def page(self, offset: int | None, limit: int) -> dict[str, Any]:
        """Lines from ``offset`` (default: the newest ``limit``), at most ``limit``."""
        first = self.ring[0][0] if self.ring else self.next_seq
        if offset is None:
            offset = max(first, self.next_seq - limit)
        start = max(offset, first)
        lines: list[dict[str, Any]] = [
            {"seq": seq, "time": round(ts, 3), "stream": stream, "line": text}
            for seq, ts, stream, text in self.ring
            if seq >= start
        ][:limit]
        return {
            "lines": lines,
            "first_offset": first,
            # Past the end: the end (a UI probe: the offset asked came back, so a client following with an
            # offset from a log that restarted since waited for the new one to grow past it, and skipped that).
            "next_offset": lines[-1]["seq"] + 1 if lines else min(start, self.next_seq),
            "end_offset": self.next_seq,
        }

    def tail(self, n: int = 3, since: int = 0) -> list[str]:
        """The last ``n`` lines the child printed (for last_error), from line number ``since`` on (its process's):
        without the time and ``[namespace#level]`` that Twisted's text format puts first, and without the lines
        a stopping reactor prints (``(TCP Port 9101 Closed)``) or the access log, which say nothing of why it
        stopped (a model killed by signal 9 showed its last two requests as its error)."""
        return [said for _, said in self._said(since)][-n:]

    def last_words(self, since: int = 0) -> list[str]:
        """The last 2 lines of :meth:`tail` that are not notes logged at info level: the error of an exited process.
        A note says what went well, not why it ended (a UI probe: "listening on ...; loading the model on cpu |
        service-model: weights file ...: missing tensor" put the note first, and the table's cell cut the reason
        off; a regression probe: a crash by a signal after ready was "... | MOBILENETV2: ready (version ...)").
        A warning or an error line before a refusal stays: it says what failed."""
        return [said for raw, said in self._said(since) if not _INFO_LINE.match(raw)][-2:]

    def _said(self, since: int) -> list[tuple[str, str]]:
        """The child's own lines from line number ``since`` on, each as printed and as :meth:`tail` gives it."""
        said = ((text, _LOG_PREFIX.sub("", text).strip()) for seq, _, stream, text in list(self.ring)[-50:]
                if seq >= since and stream != "supervisor" and _ACCESS_LINE not in text)
        return [(raw, text) for raw, text in said if text and not _REACTOR_NOISE.fullmatch(text)]

    def close(self) -> None:
        """Write what waits and close the file; later lines go to the ring only."""
        self.write_pending()
        if self.file is not None:
            self.file.close()
            self.file = None


#: The file of the logs folder that a running supervisor holds locked (``flock``) for its whole life, its pid in it.
LOCK_FILE = "supervisor.lock"


class LogDirLock:
    """One supervisor per logs folder: an exclusive ``flock`` on ``<log_dir>/supervisor.lock``.

    A second supervisor on the same folder (other ports, same configs) wrote
    its children's lines into the first one's ``<id>.log`` files, and both
    rotated them.  The lock goes with the open file, which no child inherits
    (Python opens it close-on-exec) and a daemon's fork keeps; the kernel
    releases it when the process ends, so a ``kill -9`` leaves nothing stale.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, LOCK_FILE)
        self.file: Any = None

    def acquire(self) -> str | None:
        """Take the lock and write this pid in it: None, or why not (naming the folder and the holder's pid).

        OSError when the folder or the file cannot be made or opened (another user's folder).
        """
        import fcntl

        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        file = os.fdopen(os.open(self.path, os.O_RDWR | os.O_CREAT, LOG_FILE_MODE), "r+")
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = file.read().strip() or "unknown: it is starting"
            file.close()
            return (f"{self.directory} ({os.path.abspath(self.directory)}) is in use by another supervisor (pid "
                    f"{holder}), which writes and rotates the log files there: stop it, or give this one another "
                    "[supervisor] log_dir")
        self.file = file
        self.claim()
        return None

    def keep(self) -> str | None:
        """Take the lock again when its path no longer names the file this process locked: the logs folder (or
        the file) removed by hand, the folder made again by the next log line, let a second supervisor start on
        it and lock a file of its own.  None, or why not (another supervisor locked the new file first).  A lock
        file emptied in place gets this pid again, which a second supervisor's refusal names.

        OSError when the folder or the file cannot be made again."""
        if self.file is None:
            return None
        try:
            if os.path.samestat(os.stat(self.path), os.fstat(self.file.fileno())):
                if not os.fstat(self.file.fileno()).st_size:  # emptied in place: a refusal named "unknown"
                    self.claim()
                return None
        except FileNotFoundError:
            pass
        held = self.file
        problem = self.acquire()  # on success self.file is the new file; on a refusal the old one stays
        if problem is None:
            held.close()
        return problem

    def claim(self) -> None:
        """Write this process's pid in the lock file: again once a daemon runs, whose pid changed as twistd forked."""
        if self.file is not None:
            self.file.seek(0)
            self.file.truncate()
            self.file.write(f"{os.getpid()}\n")
            self.file.flush()

    def release(self) -> None:
        """Let another supervisor have the folder (this one has stopped its children, or refused to start)."""
        if self.file is not None:
            self.file.close()
            self.file = None
