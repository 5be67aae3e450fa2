"""The reference point of bench/gateway.py: the least a Twisted proxy can do per request.

A twisted.web leaf resource that POSTs the body to one upstream URL with an
``Agent`` over a persistent pool and writes the reply back: no routing,
authentication, limits, metrics or access log.  What the gateway costs above
this is the price of its features.

    python -m bench.minimal_proxy PORT UPSTREAM_URL
"""

from __future__ import annotations

import sys
from typing import Any

from twisted.internet import reactor
from twisted.web import resource, server
from twisted.web.client import Agent, readBody
from twisted.web.http_headers import Headers

from svc.gateway.proxy import BytesProducer
from svc.web.client import QuietConnectionPool


class MinimalProxy(resource.Resource):
    isLeaf = True

    def __init__(self, agent: Agent, upstream: bytes) -> None:
        super().__init__()
        self.agent = agent
        self.upstream = upstream

    def render_POST(self, request: Any) -> int:
        gone: list = []
        request.notifyFinish().addErrback(gone.append)
        headers = Headers({b"content-type": [b"application/json"]})
        d = self.agent.request(b"POST", self.upstream, headers, BytesProducer(request.content.read()))

        def reply(response: Any) -> Any:
            def write(body: bytes) -> None:
                if not gone:
                    request.setResponseCode(response.code)
                    request.setHeader(b"Content-Type", b"application/json; charset=utf-8")
                    request.write(body)
                    request.finish()

            return readBody(response).addCallback(write)

        d.addCallback(reply)
        d.addErrback(lambda failure: None)
        return server.NOT_DONE_YET


def main() -> None:
    port, upstream = int(sys.argv[1]), sys.argv[2].encode()
    pool = QuietConnectionPool(reactor)
    pool.maxPersistentPerHost = 64
    site = server.Site(MinimalProxy(Agent(reactor, pool=pool), upstream))
    site.log = lambda request: None  # no access log: the minimum
    reactor.listenTCP(port, site, interface="127.0.0.1")
    print(port, flush=True)
    reactor.run()


if __name__ == "__main__":
    main()
