"""What one API key may do at once and per second: its in-flight slots and its token bucket.

A mixin of :class:`svc.gateway.app.GatewayApp` (its ``in_flight``, ``key_max_in_flight``, ``rates`` and
``metrics``).  The slot is taken before the bucket, so that a request refused for it spends no token.  An
upload judged from its head (svc.web.bodylimits: a body over 64 KiB, chunked, or awaiting ``100 Continue``)
takes both from its head, so that a key over its rate is answered 429 before its body is read: a security
probe held twelve 50 MB uploads of a key limited to 1 request/s, each refused only once it had arrived (the
gateway's memory 69 MB -> 655 MB).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred

from svc.contract import status as st
from svc.contract.errors import ApiError
from svc.gateway.credentials import Principal
from svc.infra.ratelimit import retry_after_header


class KeyLimits:
    """The key's in-flight count and bucket, for the routes' ``admit`` and for an upload's head."""

    in_flight: dict[str, int]
    key_max_in_flight: int
    rates: Any
    metrics: Any

    def hold(self, request: Any, key: str) -> None:
        """Count the request among its key's in flight until it is answered or its client is gone; 429 past
        ``key_max_in_flight`` (checked and counted in one step on the reactor thread, before the bucket)."""
        held = self.in_flight.get(key, 0)
        if self.key_max_in_flight and held >= self.key_max_in_flight:
            self.metrics.key_rejections.labels(key, "in_flight").inc()
            raise ApiError(st.RATE_LIMITED, f"key {key} has {held} requests in flight, the most one key may have "
                                            f"(key_max_in_flight): retry when one has been answered",
                           headers={"Retry-After": "1"})
        self.in_flight[key] = held + 1

        def ended(_: Any) -> None:
            left = self.in_flight[key] - 1
            if left:
                self.in_flight[key] = left
            else:
                del self.in_flight[key]

        request.held = True
        request.notifyFinish().addBoth(ended)

    def rate_limited(self, principal: Principal, wait: float) -> ApiError:
        """The 429 of a key past its rate, ``wait`` seconds before it may pass (counted as a rejection)."""
        self.metrics.key_rejections.labels(principal.name, "rate_limited").inc()
        return ApiError(st.RATE_LIMITED,
                        f"rate limit of {principal.rate_limit_qps} requests/s for key {principal.name} exceeded",
                        headers={"Retry-After": retry_after_header(wait)})

    def take_token(self, request: Any, principal: Principal) -> Deferred:
        """The seconds ``principal`` must wait (0.0: it passes now): the token its upload's head took
        (:meth:`take_from_head`), else one taken now."""
        early = getattr(request, "early_take", None)
        return early if early is not None else self.rates.take(principal.name, principal.rate_limit_qps)

    def take_from_head(self, request: Any, principal: Principal, refuse: Any) -> ApiError | None:
        """Take the key's token as an upload's head arrives: its 429 (to answer now) when the bucket answers at
        once (the local store, or Redis down) and the key is over its rate.  Redis answers a moment later:
        ``refuse(error)`` then answers the upload mid-body, unless its body has already come (its route's
        ``admit`` then refuses it as any request)."""
        taken = request.early_take = self.rates.take(principal.name, principal.rate_limit_qps)
        now: list[ApiError] = []
        answering, postponed = True, False

        def judged(wait: float) -> float:
            if wait and answering:
                now.append(self.rate_limited(principal, wait))
            elif wait and request.reading_body:
                request.early_take = None  # answered here: no route will read it
                refuse(self.rate_limited(principal, wait))
            elif postponed:  # within the rate: the body may come now
                request.send_continue()
            return wait

        # An answer to come: a client awaiting "100 Continue" gets it only then (it was invited to send a body that
        # the 429 then refused, megabytes of it: a regression probe).
        postponed = not taken.called and request.postpone_continue()
        taken.addCallback(judged)
        answering = False
        return now[0] if now else None
