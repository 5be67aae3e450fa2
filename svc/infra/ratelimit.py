"""Token buckets: per API key in the gateway, per client IP in model servers.

Time comes from an ``IReactorTime`` so tests use ``task.Clock``.  A bucket
holds up to ``burst`` tokens (default: one second's worth, at least one) and
refills at ``rate`` tokens per second; ``take`` returns 0 when a request may
pass, or the seconds until it could.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from twisted.internet.interfaces import IReactorTime


class TokenBucket:
    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now

    def take(self, now: float) -> float:
        """Spend one token; 0.0 when allowed, else seconds until one is back.

        Time that went backwards (a clock stepped back) refills nothing: it
        took tokens away, and locked a key out for as long as the step.
        """
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


#: The longest ``Retry-After``: a day.  A rate too small to refill in any time (5e-324 per second) made the
#: wait infinite, and ``math.ceil`` of it a 500 for every request after the first.
MAX_RETRY_AFTER_S = 86400


def retry_after_header(seconds: float) -> str:
    """Whole seconds for ``Retry-After``, at least 1, at most :data:`MAX_RETRY_AFTER_S`."""
    return str(max(1, math.ceil(min(seconds, MAX_RETRY_AFTER_S))))


class KeyedLimiter:
    """One bucket per key (API key name, client IP); 0 rate means unlimited."""

    def __init__(self, clock: IReactorTime, rate: float, burst: float | None = None, max_keys: int = 100_000) -> None:
        self.clock = clock
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, rate)
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def take(self, key: str, rate: float | None = None) -> float:
        """0.0 when ``key`` may pass now, else seconds to wait.

        ``rate`` overrides the limiter's rate for this key (per-key limits).
        """
        rate = self.rate if rate is None else rate
        if rate <= 0:
            return 0.0
        now = self.clock.seconds()
        bucket = self._buckets.get(key)
        if bucket is None or bucket.rate != rate:
            bucket = TokenBucket(rate, max(1.0, rate) if rate != self.rate else self.burst, now)
            self._buckets[key] = bucket
            if len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        return bucket.take(now)
