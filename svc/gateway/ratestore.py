"""Where the gateway's per-key token buckets live: this process, or Redis shared by every gateway.

``[gateway] rate_limit_store`` picks one.  ``"local"`` (:class:`LocalRates`)
is the in-process :class:`svc.infra.ratelimit.KeyedLimiter`: each gateway limits
on its own.  ``"redis://HOST:PORT/DB"`` (:class:`RedisRates`) keeps every
key's bucket in Redis, so that a key limited to N requests/s gets N in total
across all the gateways of a cluster:

* **One atomic step.** A request's check is one ``EVALSHA`` of :data:`SCRIPT`:
  read the bucket, refill it for the time passed, take a token or compute
  the wait, write it back.  Redis runs a script alone, so concurrent checks
  from several gateways never interleave.  The time is Redis's own
  (``TIME`` inside the script): the gateways' clocks do not matter.  The
  script is loaded once per connection (``SCRIPT LOAD``); a ``NOSCRIPT``
  answer (Redis restarted or its script cache was flushed) loads it again.
  The bucket is the hash ``service:ratelimit:<key name>``, with the same
  rule as the local one (burst: one second's worth, at least 1 token); it
  expires once it would be full again, so idle keys cost nothing.
  ``Retry-After`` is computed from the wait the script returns.
* **Never blocking, never holding a request.** txredisapi's protocol over a
  Twisted TCP connection: every call returns a Deferred.  One connection per
  gateway (Redis serves one command at a time anyway; requests are pipelined
  on it in order).  Each check has a deadline (``rate_limit_timeout_ms``):
  a Redis that does not answer in time is treated as gone for that request,
  which is checked against the local bucket instead.
* **Falling back and coming back by itself.** While Redis is unreachable
  (refused, closed, or past a deadline) or refuses checks (an error reply
  that is not about one bucket: READONLY on a replica after a failover, OOM
  under ``maxmemory``, MISCONF, NOAUTH; a connection's first check, on
  :data:`PROBE_KEY`, finds it before any request does) the gateway checks each request
  against its own local bucket at the key's full rate (so a cluster of N
  gateways then allows up to N times the rate), logs that once, and exports
  ``service_gateway_ratelimit_store_up 0``; it reconnects every
  ``rate_limit_retry_ms`` in the background, and once connected (and the
  script loaded) it uses Redis again, logs that once, and the gauge is 1.

The client is txredisapi (pinned in setup.py): a Twisted-native Redis
protocol.  Its own pool and reconnecting factory are not used, because they
queue commands while disconnected (a request would wait for a Redis that is
down) and read time from the global reactor; here the connection is made
with an endpoint on the injected reactor and its state decides per request.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Coroutine
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, ensureDeferred, succeed
from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint
from twisted.internet.interfaces import IDelayedCall, IReactorTime, IStreamClientEndpoint
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.gateway.config import GatewayConfig, RedisAddress, redis_address
from svc.infra.ratelimit import KeyedLimiter
from svc.infra.reactors import IServiceReactor

log = Logger()

#: The token bucket of one key, as one atomic step in Redis.  Returns the seconds until a token is
#: back, as a string ("0.000000": the request may pass now).
SCRIPT = b"""
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local bucket = redis.call('HMGET', KEYS[1], 'tokens', 'stamp')
local tokens = tonumber(bucket[1]) or burst
local stamp = tonumber(bucket[2]) or now
if now > stamp then
  tokens = tokens + (now - stamp) * rate
end
if tokens > burst then
  tokens = burst
end
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait = (1 - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'stamp', string.format('%.6f', now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return string.format('%.6f', wait)
"""
SCRIPT_SHA = hashlib.sha1(SCRIPT).hexdigest()
#: Redis key of a key's bucket: the prefix and the key name (names are ``[A-Za-z0-9_.-]``, svc.auth).
BUCKET_PREFIX = "service:ratelimit:"
#: The bucket each connection checks once before it is used (no key name has a colon): a Redis that refuses
#: writes (a read-only replica after a failover, ``maxmemory`` with ``noeviction``, a failed save) is caught
#: while connecting, as one that is down, instead of by every check.
PROBE_KEY = BUCKET_PREFIX + ":probe"
#: Error replies that concern one bucket (a key clobbered by something else), not the store: that check alone
#: is made locally.  Any other error reply (READONLY, OOM, MISCONF, NOAUTH, LOADING...) is the store's: local
#: buckets for every key, the gauge 0, reconnects, as when Redis is down.
KEY_ERRORS = ("WRONGTYPE", "unexpected reply to the rate-limit script")
#: Distinct reasons an outage logs (its first, then each new one, such as NOAUTH once Redis answers again).
OUTAGE_REASONS = 4


def burst_of(rate: float) -> float:
    """A key's burst: one second's worth, at least one token (as svc.infra.ratelimit.KeyedLimiter has it)."""
    return max(1.0, rate)


class LocalRates:
    """``rate_limit_store = "local"``: this process's buckets, answered at once."""

    up = True

    def __init__(self, limiter: KeyedLimiter) -> None:
        self.limiter = limiter

    def take(self, key: str, rate: float) -> Deferred:
        """Fires with 0.0 when ``key`` may pass now, else the seconds until it could."""
        return succeed(self.limiter.take(key, rate))


class StoreUnavailable(Exception):
    """Redis cannot be used: not connected, connection lost, no answer in time."""


class ErrorReply(Exception):
    """Redis answered a command with an error (``NOSCRIPT``, ``OOM``, ``WRONGTYPE``...)."""


def _redis_protocol() -> Any:
    from txredisapi import RedisProtocol  # import-light: only a gateway configured with Redis loads it

    return RedisProtocol()


def _is_ip(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).version == 4
    except ValueError:
        return False


class RedisRates(Service):
    """Per-key buckets in Redis, with local buckets while it is unreachable (module docstring).

    A service of the gateway's tree: it connects when started and closes its
    connection when stopped.  ``on_state(up)`` is told every change between
    Redis and the local fallback (the gauge).
    """

    def __init__(self, reactor: IServiceReactor, address: RedisAddress, local: KeyedLimiter, *, timeout_s: float,
                 retry_s: float, on_state: Callable[[bool], None] = lambda up: None) -> None:
        self.reactor = reactor
        self.address = address
        self.local = local
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.on_state = on_state
        self.up = False
        #: Connection attempts made (the first and every reconnect).
        self.attempts = 0
        self._protocol: Any = None
        self._connecting: Deferred | None = None
        self._retry: IDelayedCall | None = None
        self._down_reasons: set[str] = set()  # what this outage logged
        self._errors_logged: set[str] = set()
        self._stopping = False
        self._factory = Factory.forProtocol(_redis_protocol)
        self._factory.noisy = False
        #: One connection attempt (connect, SELECT, SCRIPT LOAD) gets this long.
        self.connect_timeout_s = max(1.0, timeout_s)
        self._endpoint: IStreamClientEndpoint
        if _is_ip(address.host):
            self._endpoint = TCP4ClientEndpoint(reactor, address.host, address.port, timeout=self.connect_timeout_s)
        else:  # a name: resolved off the reactor thread by the endpoint
            self._endpoint = HostnameEndpoint(reactor, address.host, address.port, timeout=self.connect_timeout_s)

    # -- the per-request check ---------------------------------------------------------------

    def take(self, key: str, rate: float) -> Deferred:
        """Fires with 0.0 when ``key`` may pass now, else the seconds until it could; never fails.

        Answered by Redis while it is up, else (and for a check Redis does not
        answer within the deadline) by the local bucket.
        """
        if rate <= 0:
            return succeed(0.0)
        if not self.up:
            return succeed(self.local.take(key, rate))
        protocol = self._protocol
        answer: Deferred = Deferred()

        def settle(value: Any) -> None:
            if answer.called:
                return
            if deadline.active():
                deadline.cancel()
            if isinstance(value, Failure):
                if value.check(ErrorReply) and value.getErrorMessage().startswith(KEY_ERRORS):
                    self._error_reply(value.getErrorMessage())
                else:  # the connection failed, or Redis refuses checks for every key
                    self._lost(protocol, _reason(value))
                value = self.local.take(key, rate)
            answer.callback(value)

        def expired() -> None:
            self._lost(protocol, f"no answer within {self.timeout_s * 1000:.0f} ms (rate_limit_timeout_ms)")
            settle(self.local.take(key, rate))

        deadline = self.reactor.callLater(self.timeout_s, expired)
        ensureDeferred(self._check(protocol, key, rate)).addBoth(settle)
        return answer

    async def _check(self, protocol: Any, key: str, rate: float) -> float:
        args = (1, BUCKET_PREFIX + key, repr(float(rate)), repr(burst_of(rate)))
        try:
            reply = await _command(protocol, "EVALSHA", SCRIPT_SHA, *args)
        except ErrorReply as e:
            if not str(e).startswith("NOSCRIPT"):
                raise
            await _command(protocol, "SCRIPT", "LOAD", SCRIPT)  # Redis restarted or flushed its scripts
            reply = await _command(protocol, "EVALSHA", SCRIPT_SHA, *args)
        try:
            return max(0.0, float(reply))
        except (TypeError, ValueError):
            raise ErrorReply(f"unexpected reply to the rate-limit script: {reply!r}"[:200]) from None

    def _error_reply(self, message: str) -> None:
        """Redis answered a check with an error about its bucket (:data:`KEY_ERRORS`): that request is checked
        locally, and the store stays in use for the other keys."""
        if message not in self._errors_logged and len(self._errors_logged) < 16:
            self._errors_logged.add(message)
            log.error("rate-limit store {store} answered a check with an error, checked locally instead: {error}",
                      store=str(self.address), error=message)

    # -- the connection ------------------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        self._stopping = False
        self._connect()

    def stopService(self) -> Deferred:
        super().stopService()
        self._stopping = True
        self.up = False  # a request still being answered while the gateway drains is checked locally
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        if self._connecting is not None:
            self._connecting.cancel()
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.loseConnection()
        return succeed(None)

    def _connect(self) -> None:
        """One attempt: connect, select the database, load the script, each within the deadline."""
        self._retry = None
        if self._stopping or self._connecting is not None:
            return
        self.attempts += 1
        d = ensureDeferred(self._open())
        self._connecting = d

        def done(result: Any) -> None:
            self._connecting = None
            if isinstance(result, Failure):
                self._went_down(_reason(result))
                self._schedule_retry()

        d.addBoth(done)

    async def _open(self) -> None:
        limit = self.connect_timeout_s
        protocol = await _within(self.reactor, self._endpoint.connect(self._factory), limit, "connecting")
        try:
            await _within(self.reactor, protocol.whenConnected(), limit, "connecting")
            if self.address.db:
                await _within(self.reactor, _command(protocol, "SELECT", self.address.db), limit, "SELECT")
            await _within(self.reactor, _command(protocol, "SCRIPT", "LOAD", SCRIPT), limit, "SCRIPT LOAD")
            await _within(self.reactor, _command(protocol, "EVALSHA", SCRIPT_SHA, 1, PROBE_KEY, "1000.0", "1000.0"),
                          limit, "a first check")
        except BaseException:
            protocol.transport.abortConnection()
            raise
        if self._stopping:
            protocol.transport.loseConnection()
            return
        protocol.whenDisconnected().addCallback(lambda p: self._lost(p, "the connection was closed"))
        self._protocol = protocol
        self.up = True
        self._down_reasons.clear()
        log.info("rate limits in {store}: shared with every gateway using it", store=str(self.address))
        self.on_state(True)

    def _lost(self, protocol: Any, why: str) -> None:
        """The connection ``protocol`` failed a check or closed: local buckets until a reconnect succeeds."""
        if protocol is None or protocol is not self._protocol:
            return  # an older connection, already replaced or given up
        self._protocol = None
        if protocol.transport is not None:
            protocol.transport.abortConnection()  # pending checks fail at once instead of waiting
        self._went_down(why)
        self._schedule_retry()

    def _went_down(self, why: str) -> None:
        """Local buckets from now on; logged once per outage, then once per new reason (a Redis back without
        the password the gateway cannot send says NOAUTH), not once per failed reconnect."""
        self.up = False
        if self._stopping:
            return
        if not self._down_reasons:
            log.warn("rate-limit store {store} unreachable or refusing checks ({why}): each key is limited by this "
                     "gateway's own bucket at its full rate until it is back (retried every {retry:g} s)",
                     store=str(self.address), why=why, retry=self.retry_s)
            self._down_reasons.add(why)
        elif why not in self._down_reasons and len(self._down_reasons) < OUTAGE_REASONS:
            log.warn("rate-limit store {store} still not in use: {why}", store=str(self.address), why=why)
            self._down_reasons.add(why)
        self.on_state(False)

    def _schedule_retry(self) -> None:
        if self._stopping or self._retry is not None or self._connecting is not None:
            return
        self._retry = self.reactor.callLater(self.retry_s, self._connect)


async def _command(protocol: Any, *args: Any) -> Any:
    """One Redis command on ``protocol``; StoreUnavailable for an error reply or a lost connection."""
    from txredisapi import ConnectionError as RedisConnectionError
    from txredisapi import ResponseError

    try:
        return await protocol.execute_command(*args)
    except ResponseError as e:
        raise ErrorReply(str(e)) from None
    except RedisConnectionError as e:
        raise StoreUnavailable(f"connection lost: {e}") from None


def _within(reactor: IReactorTime, d: Deferred | Coroutine[Any, Any, Any], seconds: float, what: str) -> Deferred:
    """``d``, failed with StoreUnavailable when it has no result within ``seconds``."""
    d = ensureDeferred(d) if not isinstance(d, Deferred) else d

    def on_timeout(result: Any, timeout: float) -> Any:
        raise StoreUnavailable(f"{what}: no answer within {timeout * 1000:.0f} ms")

    return d.addTimeout(seconds, reactor, onTimeoutCancel=on_timeout)


def _reason(failure: Failure) -> str:
    return failure.getErrorMessage()[:200] or failure.type.__name__


def make_rates(reactor: IServiceReactor, config: GatewayConfig, gauge: Any) -> LocalRates | RedisRates:
    """The store of ``rate_limit_store`` (a RedisRates is a service: the caller makes it a child of its tree).

    ``gauge`` is ``service_gateway_ratelimit_store_up``: 1 for local buckets; for Redis, 0 until
    connected and while unreachable.
    """
    local = KeyedLimiter(reactor, 0)
    address = redis_address(config.rate_limit_store)
    if address is None:
        gauge.set(1)
        return LocalRates(local)
    gauge.set(0)
    return RedisRates(reactor, address, local, timeout_s=config.rate_limit_timeout_ms / 1000.0,
                      retry_s=config.rate_limit_retry_ms / 1000.0, on_state=lambda up: gauge.set(1 if up else 0))
