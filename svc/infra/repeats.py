"""How often the same failure's traceback is logged: once per interval per cause.

A model or plugin that fails on every request would log a traceback per
request (500 lines for 50 requests); the first in each interval has it, the
repeats one line each.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: A cause's traceback is logged at most once per this many seconds.
TRACEBACK_EVERY_S = 60.0
#: Causes remembered at most (ones that name varying values would grow without bound).
MAX_CAUSES = 256


class TracebackBudget:
    """Whether this occurrence of ``cause`` gets its traceback logged (any thread)."""

    def __init__(self, every_s: float = TRACEBACK_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def allows(self, cause: str) -> bool:
        now = self.clock()
        with self._lock:
            last = self._last.get(cause)
            if last is not None and now - last < self.every_s:
                return False
            if len(self._last) >= MAX_CAUSES:
                self._last.clear()
            self._last[cause] = now
            return True
