"""A wall clock that a test steps under a running process (tests/integration/test_clock_steps.py).

Python imports ``sitecustomize`` at start-up, before anything else: with this
folder first on a child's ``PYTHONPATH``, ``time.time`` and ``time.time_ns``
(and so twisted's ``runtime.seconds``, bound at its import, and the log's
times) read the real wall clock plus the offset in seconds written in
``$SVC_TEST_WALL_OFFSET_FILE``, read again at most every 0.1 s.  The monotonic
clock is left alone, as a clock stepped by NTP or a resumed virtual machine
leaves it.  (libfaketime does the same from C, but its ``clock_nanosleep``
fails ``time.sleep(0)`` with EINVAL while the monotonic clock is not faked.)
"""

import os
import time

_PATH = os.environ.get("SVC_TEST_WALL_OFFSET_FILE")
_real_time, _real_time_ns, _monotonic = time.time, time.time_ns, time.monotonic
_state = {"offset": 0.0, "read_at": float("-inf")}


def _offset() -> float:
    now = _monotonic()
    if now - _state["read_at"] >= 0.1:
        _state["read_at"] = now
        try:
            with open(_PATH) as f:
                _state["offset"] = float(f.read().strip() or 0)
        except (OSError, ValueError):
            pass
    return _state["offset"]


def _time() -> float:
    return _real_time() + _offset()


def _time_ns() -> int:
    return _real_time_ns() + int(_offset() * 1e9)


if _PATH:
    time.time, time.time_ns = _time, _time_ns
