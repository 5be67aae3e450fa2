"""svc.infra.reactors.follow: one Deferred's result for any number of waiters, and no second report of its failure."""

from __future__ import annotations

import gc

from twisted.internet.defer import Deferred, succeed
from twisted.logger import globalLogPublisher

from svc.infra.reactors import follow


def test_every_follower_gets_the_result_early_or_late():
    d: Deferred = Deferred()
    got: list = []
    follow(d).addCallback(got.append)
    follow(d).addCallback(got.append)
    d.callback(7)
    follow(d).addCallback(got.append)  # after it fired
    assert got == [7, 7, 7]
    assert follow(succeed("x")).result == "x"


def test_a_failure_handed_to_its_followers_is_not_also_reported_as_unhandled():
    """A supervisor's failed restart answered its caller in one line, and then, once the shared Deferred was
    collected, logged the same failure twice more as a critical "Unhandled error in Deferred" traceback."""
    events: list = []
    observer = events.append
    globalLogPublisher.addObserver(observer)
    try:
        d: Deferred = Deferred()
        caught: list = []
        for _ in range(2):
            follow(d).addErrback(lambda f: caught.append(f.getErrorMessage()))
        d.errback(RuntimeError("could not start"))
        late: list = []
        follow(d).addErrback(lambda f: late.append(f.value))
        del d
        gc.collect()
        assert caught == ["could not start", "could not start"] and len(late) == 1
        assert [e for e in events if (e.get("log_format") or "").startswith("Unhandled error in Deferred")] == []
    finally:
        globalLogPublisher.removeObserver(observer)


def test_a_follower_that_ignores_the_failure_is_reported_as_any_deferred_is():
    events: list = []
    globalLogPublisher.addObserver(events.append)
    try:
        d: Deferred = Deferred()
        follow(d)  # nobody handles this one's failure: that is its owner's bug, and twisted says so
        d.errback(RuntimeError("lost"))
        gc.collect()
        unhandled = [e for e in events if (e.get("log_format") or "").startswith("Unhandled error in Deferred")]
        assert len(unhandled) == 1
    finally:
        globalLogPublisher.removeObserver(events.append)
