"""Where a child's output goes: ``logs/<id>.log`` with size-based rotation,
and a bounded in-memory ring of numbered lines served by the API.

Lines are numbered from 0 for the life of the supervisor; the ring keeps the
newest ``ring_lines`` of them, so a reader pages with ``offset`` (the number
of the first line wanted) and learns where the ring starts now.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any

from twisted.python.logfile import LogFile


class LogSink:
    """Collects one child's stdout/stderr (and the supervisor's notes on it)."""

    def __init__(self, name: str, directory: str | None, *, max_bytes: int, backups: int, ring_lines: int) -> None:
        self.name = name
        self.ring: deque[tuple[int, float, str, str]] = deque(maxlen=ring_lines)
        self.next_seq = 0
        self._partial: dict[str, bytes] = {}
        self.file: LogFile | None = None
        if directory is not None:
            os.makedirs(directory, exist_ok=True)
            self.file = LogFile(f"{name}.log", directory, rotateLength=max_bytes, maxRotatedFiles=backups)

    def feed(self, stream: str, data: bytes) -> None:
        """Bytes from a pipe: complete lines go to the file and the ring."""
        buffered = self._partial.get(stream, b"") + data
        *lines, rest = buffered.split(b"\n")
        self._partial[stream] = rest[-65536:]
        for raw in lines:
            self.line(stream, raw.decode("utf-8", "replace").rstrip("\r"))

    def flush(self) -> None:
        """The process ended: keep what is left without a newline."""
        for stream, rest in list(self._partial.items()):
            if rest:
                self.line(stream, rest.decode("utf-8", "replace"))
        self._partial.clear()

    def line(self, stream: str, text: str) -> None:
        now = time.time()
        self.ring.append((self.next_seq, now, stream, text))
        self.next_seq += 1
        if self.file is not None:
            prefix = "" if stream in ("stdout", "stderr") else f"[{stream}] "
            self.file.write(prefix + text + "\n")
            self.file.flush()

    def note(self, text: str) -> None:
        """A line from the supervisor about this child (state changes)."""
        self.line("supervisor", text)

    def page(self, offset: int | None, limit: int) -> dict[str, Any]:
        """Lines from ``offset`` (default: the newest ``limit``), at most ``limit``."""
        first = self.ring[0][0] if self.ring else self.next_seq
        if offset is None:
            offset = max(first, self.next_seq - limit)
        start = max(offset, first)
        lines = [
            {"seq": seq, "time": round(ts, 3), "stream": stream, "line": text}
            for seq, ts, stream, text in self.ring
            if seq >= start
        ][:limit]
        return {
            "lines": lines,
            "first_offset": first,
            "next_offset": lines[-1]["seq"] + 1 if lines else max(start, min(offset, self.next_seq)),
            "end_offset": self.next_seq,
        }

    def tail(self, n: int = 3) -> list[str]:
        """The last ``n`` lines the child printed (for last_error)."""
        return [text for _, _, stream, text in list(self.ring)[-50:] if stream != "supervisor" and text.strip()][-n:]

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
