"""Token buckets on a fake clock."""

from twisted.internet.task import Clock

from svc.infra.ratelimit import KeyedLimiter, retry_after_header


def test_rate_is_enforced_and_refills():
    clock = Clock()
    limiter = KeyedLimiter(clock, rate=2)
    assert [limiter.take("k") for _ in range(2)] == [0.0, 0.0]
    wait = limiter.take("k")
    assert 0 < wait <= 0.5
    clock.advance(0.5)
    assert limiter.take("k") == 0.0


def test_keys_are_independent_and_zero_is_unlimited():
    clock = Clock()
    limiter = KeyedLimiter(clock, rate=1)
    assert limiter.take("a") == 0.0 and limiter.take("b") == 0.0
    assert limiter.take("a") > 0
    unlimited = KeyedLimiter(clock, rate=0)
    assert all(unlimited.take("a") == 0.0 for _ in range(100))


def test_per_key_rate_override():
    clock = Clock()
    limiter = KeyedLimiter(clock, rate=0)
    assert limiter.take("slow", rate=1) == 0.0
    assert limiter.take("slow", rate=1) > 0
    assert limiter.take("fast", rate=0) == 0.0


def test_retry_after_header_is_whole_seconds_at_least_one():
    assert retry_after_header(0.01) == "1"
    # a rate too small to refill (5e-324/s) waits forever: math.ceil(inf) was a 500 for every later request
    assert retry_after_header(float("inf")) == retry_after_header(1e300) == "86400"
    assert retry_after_header(1.2) == "2"


def test_a_clock_stepped_back_takes_no_tokens_away():
    """Time going backwards added a negative refill: two minutes back answered Retry-After: 118."""
    clock = Clock()
    clock.advance(1000.0)
    limiter = KeyedLimiter(clock, rate=3)
    assert [limiter.take("k") for _ in range(2)] == [0.0, 0.0]
    clock.rightNow -= 120.0
    assert limiter.take("k") == 0.0  # the third token of the burst is still there
    assert 0 < limiter.take("k") <= 1 / 3
    clock.advance(1 / 3)
    assert limiter.take("k") == 0.0
