"""A trivial stand-in for a model server's ``POST /jobs`` in bench/jobs_burst.py: every request gets one fixed 202.

Like bench/oip_upstream.py (asyncio, keep-alive, much cheaper than the
gateway), so that a burst through the gateway measures the gateway alone:
the 202 carries what a model server's does (``Location``, ``X-Request-ID``,
``Cache-Control``, the job body with its model-port URLs, which the gateway
rewrites).  Prints its port as one JSON line.

    python -m bench.jobs_upstream [--port 0]
"""

from __future__ import annotations

from bench import trivial_upstream

BODY = (b'{"job_id":"j-1","state":"queued","poll_url":"/jobs/j-1","result_url":"/jobs/j-1/result","task_id":"t",'
        b'"model":{"name":"MOBILENETV2","version":"0"}}')
ACCEPTED = (b"HTTP/1.1 202 Accepted\r\nContent-Type: application/json; charset=utf-8\r\nLocation: /jobs/j-1\r\n"
            b"X-Request-ID: t\r\nCache-Control: no-store\r\nContent-Length: " + str(len(BODY)).encode()
            + b"\r\n\r\n" + BODY)


class Upstream(trivial_upstream.Upstream):
    def reply_for(self, head: bytes) -> bytes:
        return ACCEPTED


def main() -> None:
    trivial_upstream.main(Upstream, __doc__)


if __name__ == "__main__":
    main()
