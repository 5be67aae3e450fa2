"""The Redis rate-limit store against a real redis-server on loopback: shared buckets, fallback, return.

The store runs on the real reactor (its sockets are real), driven by
:func:`spin` without ``reactor.run()``; time is Redis's own (``TIME`` in the
script) and the reactor's, so waits are conditions with a bound, not sleeps.
"""

from __future__ import annotations

import time

import pytest
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.logger import formatEvent, globalLogPublisher

from svc.gateway.config import load_gateway_config
from svc.gateway.ratestore import BUCKET_PREFIX, SCRIPT_SHA, LocalRates, RedisRates, make_rates
from svc.infra.metrics import GatewayMetrics, new_registry, render
from svc.infra.ratelimit import retry_after_header
from tests.support.processes import free_port
from tests.support.redis import RedisServer

TIMEOUT_MS, RETRY_MS = 200, 100


def spin(d: Deferred, timeout: float = 10.0):
    """Run the reactor until ``d`` has a result; return it (raise its failure)."""
    box: list = []
    d.addBoth(box.append)
    deadline = time.monotonic() + timeout
    while not box:
        assert time.monotonic() < deadline, f"no result within {timeout} s"
        reactor.iterate(0.005)
    result = box[0]
    if hasattr(result, "raiseException"):
        result.raiseException()
    return result


def spin_until(predicate, what: str, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        reactor.iterate(0.005)


@pytest.fixture(scope="module")
def redis():
    server = RedisServer("127.0.0.1", free_port()).start()
    yield server
    server.stop()


@pytest.fixture
def restartable():
    """A redis-server of one test's own, which the test stops and starts again on the same port."""
    server = RedisServer("127.0.0.1", free_port()).start()
    yield server
    server.stop()


def config_for(tmp_path, store: str):
    path = tmp_path / "service.toml"
    path.write_text(f'[gateway]\nrate_limit_store = "{store}"\nrate_limit_timeout_ms = {TIMEOUT_MS}\n'
                    f"rate_limit_retry_ms = {RETRY_MS}\n")
    return load_gateway_config(str(path))


class Gateway:
    """What a gateway holds of the store: the store from the config, its gauge, and its log lines."""

    def __init__(self, tmp_path, store: str) -> None:
        self.registry = new_registry()
        self.metrics = GatewayMetrics(self.registry)
        self.rates = make_rates(reactor, config_for(tmp_path, store), self.metrics.ratelimit_store_up)
        self.events: list[dict] = []
        globalLogPublisher.addObserver(self.events.append)

    def __enter__(self) -> "Gateway":
        if isinstance(self.rates, RedisRates):
            self.rates.startService()
            spin_until(lambda: self.rates.up, "connected to Redis")
        return self

    def __exit__(self, *exc) -> None:
        globalLogPublisher.removeObserver(self.events.append)
        if isinstance(self.rates, RedisRates):
            spin(self.rates.stopService())

    def take(self, key: str, rate: float) -> float:
        return spin(self.rates.take(key, rate))

    def gauge(self) -> str:
        line = [x for x in render(self.registry).decode().splitlines()
                if x.startswith("service_gateway_ratelimit_store_up ")]
        return line[0].split()[1]

    def logged(self, text: str) -> int:
        return sum(1 for e in self.events if "log_format" in e and text in formatEvent(e))


def test_local_store_is_the_default_and_always_up(tmp_path):
    gw = Gateway(tmp_path, "local")
    assert isinstance(gw.rates, LocalRates) and gw.gauge() == "1.0"
    with gw:
        assert [gw.take("k", 2) for _ in range(3)][:2] == [0.0, 0.0]


def test_a_key_has_one_bucket_across_gateways(tmp_path, redis):
    with Gateway(tmp_path, redis.url) as one, Gateway(tmp_path, redis.url) as two:
        assert one.gauge() == "1.0"
        # rate 3: burst 3, shared: whichever gateway asks, the fourth request within the second waits.
        assert [one.take("shared", 3), two.take("shared", 3), one.take("shared", 3)] == [0.0, 0.0, 0.0]
        wait = two.take("shared", 3)
        assert 0 < wait <= 1 / 3 + 0.01 and retry_after_header(wait) == "1"
        assert 0 < one.take("shared", 3) <= 1 / 3 + 0.01
        # Other keys have buckets of their own; an unlimited key never waits.
        assert one.take("other", 3) == 0.0 and two.take("free", 0) == 0.0
        assert redis.cli("EXISTS", BUCKET_PREFIX + "free") == "0"
        # The bucket is a hash that expires once it would be full again (1 s at 3/s, plus 1 s).
        assert redis.cli("HEXISTS", BUCKET_PREFIX + "shared", "tokens") == "1"
        assert 0 < int(redis.cli("PTTL", BUCKET_PREFIX + "shared")) <= 2000


def test_the_bucket_refills_at_the_rate_by_redis_time(tmp_path, redis):
    with Gateway(tmp_path, redis.url) as gw:
        assert [gw.take("refill", 10) for _ in range(10)] == [0.0] * 10
        wait = gw.take("refill", 10)
        assert 0 < wait <= 0.1 + 0.01
        spin_until(lambda: gw.take("refill", 10) == 0.0, "a token back after about 0.1 s")


def test_a_flushed_script_is_loaded_again(tmp_path, redis):
    with Gateway(tmp_path, redis.url) as gw:
        assert gw.take("noscript", 5) == 0.0
        assert redis.cli("SCRIPT", "FLUSH") == "OK"
        assert redis.cli("SCRIPT", "EXISTS", SCRIPT_SHA) == "0"
        assert gw.take("noscript", 5) == 0.0  # NOSCRIPT -> SCRIPT LOAD -> EVALSHA, in the same check
        assert redis.cli("SCRIPT", "EXISTS", SCRIPT_SHA) == "1"
        assert redis.cli("HGET", BUCKET_PREFIX + "noscript", "tokens").startswith("3")
        assert gw.rates.up


def test_an_error_reply_checks_that_request_locally_and_keeps_redis(tmp_path, redis):
    redis.cli("SET", BUCKET_PREFIX + "clobbered", "not a hash")
    with Gateway(tmp_path, redis.url) as gw:
        assert gw.take("clobbered", 1) == 0.0  # WRONGTYPE: checked against the local bucket (fresh)
        assert gw.take("clobbered", 1) > 0  # the local bucket of rate 1 is empty now
        assert gw.rates.up and gw.gauge() == "1.0" and gw.take("fine", 1) == 0.0
        assert gw.logged("answered a check with an error") == 1  # once per distinct error


def test_redis_stopped_falls_back_to_local_buckets_then_comes_back(tmp_path, restartable):
    with Gateway(tmp_path, restartable.url) as gw:
        assert gw.take("k", 3) == 0.0
        restartable.stop()
        spin_until(lambda: not gw.rates.up, "the closed connection noticed")
        assert gw.gauge() == "0.0"
        # Local buckets at the key's full rate: 3 pass (the local bucket is fresh), the 4th waits.
        assert [gw.take("k", 3) for _ in range(3)] == [0.0] * 3
        assert 0 < gw.take("k", 3) <= 1 / 3 + 0.01
        spin_until(lambda: gw.logged("retried every") == 1, "the outage logged")
        attempts = gw.rates.attempts
        spin_until(lambda: gw.rates.attempts >= attempts + 3, "three more reconnects, refused")
        assert gw.logged("retried every") == 1 and gw.gauge() == "0.0"
        restartable.start()
        spin_until(lambda: gw.rates.up, "back on Redis by itself", timeout=10)
        assert gw.gauge() == "1.0" and gw.logged("shared with every gateway") == 2  # first connect, and now
        assert gw.take("k", 3) == 0.0
        assert restartable.cli("HEXISTS", BUCKET_PREFIX + "k", "tokens") == "1"  # checked in Redis again


def test_a_redis_that_does_not_answer_is_bypassed_within_the_deadline(tmp_path, restartable):
    with Gateway(tmp_path, restartable.url) as gw:
        assert gw.take("slow", 2) == 0.0
        restartable.pause()
        try:
            # Answered (spin would fail after 10 s): by the local bucket (fresh) once the deadline passed.
            assert gw.take("slow", 2) == 0.0
            assert not gw.rates.up and gw.gauge() == "0.0"
            assert gw.take("slow", 2) == 0.0 and gw.take("slow", 2) > 0  # local, at once, at the full rate
        finally:
            restartable.resume()
        spin_until(lambda: gw.rates.up, "back once Redis answers again", timeout=10)
        assert gw.gauge() == "1.0"
        assert gw.logged("no answer within 200 ms") == 1


@pytest.mark.parametrize("refuse, allow, error", [
    (("REPLICAOF", "127.0.0.1", "1"), ("REPLICAOF", "NO", "ONE"), "READONLY"),  # a replica after a failover
    (("CONFIG", "SET", "maxmemory", "1"), ("CONFIG", "SET", "maxmemory", "0"), "OOM"),  # noeviction, full
])
def test_a_redis_that_refuses_every_check_is_a_store_down_not_a_bucket_error(tmp_path, restartable, refuse, allow,
                                                                              error):
    """READONLY or OOM answered every check as an error about its bucket: each gateway limited on its own (N
    times the rate) with the gauge at 1, logged once per process, and a later episode not at all."""
    restartable.cli("CONFIG", "SET", "maxmemory-policy", "noeviction")
    with Gateway(tmp_path, restartable.url) as gw:
        assert gw.take("k", 2) == 0.0
        for episode in (1, 2):
            key = f"k{episode}"  # a key the local buckets have not seen
            assert restartable.cli(*refuse) == "OK"
            assert gw.take(key, 2) == 0.0  # answered locally (a fresh local bucket)
            assert not gw.rates.up and gw.gauge() == "0.0"
            assert gw.take(key, 2) == 0.0 and gw.take(key, 2) > 0  # local, at the key's full rate
            attempts = gw.rates.attempts
            spin_until(lambda start=attempts: gw.rates.attempts >= start + 2, "reconnects refused by the first check")
            assert not gw.rates.up and gw.gauge() == "0.0"  # a connection is used only once a check passes
            assert restartable.cli(*allow) == "OK"
            spin_until(lambda: gw.rates.up, "back on Redis by itself")
            assert gw.gauge() == "1.0" and gw.take("k", 2) >= 0.0
            assert gw.logged(f"unreachable or refusing checks ({error}") == episode  # each episode, once
        assert gw.logged("answered a check with an error") == 0


def test_a_new_reason_within_one_outage_is_logged_once(tmp_path, restartable):
    """A Redis back with a password the gateway cannot send: the outage said "connection closed" only, and
    NOAUTH on every reconnect was never logged."""
    with Gateway(tmp_path, restartable.url) as gw:
        restartable.stop()
        spin_until(lambda: not gw.rates.up, "the closed connection noticed")
        restartable.start()
        restartable.cli("CONFIG", "SET", "requirepass", "pw")
        attempts = gw.rates.attempts
        spin_until(lambda: gw.rates.attempts >= attempts + 3, "reconnects refused")
        assert not gw.rates.up and gw.gauge() == "0.0"
        assert gw.logged("unreachable or refusing checks") == 1
        assert gw.logged("still not in use: NOAUTH") == 1  # once, not once per reconnect
        restartable.cli("-a", "pw", "CONFIG", "SET", "requirepass", "")
        spin_until(lambda: gw.rates.up, "back once Redis takes the gateway again")
