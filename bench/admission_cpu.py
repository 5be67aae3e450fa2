"""The model server's reactor work per job submit, in process: no sockets, no workers, no neighbours.

What ``bench.jobs_burst`` cannot separate on a loaded machine: the Python
work one ``POST /jobs`` costs the reactor thread, from the bytes of the
request to the 202's bytes, the access line, the connection's close and
the start of the job's run.  The real model server's service tree
(``tests.support.inmemory``: the site, its limits and access log, the
routes, the validation, the job table; the TESTFAULTS model, whose worker
never runs here) on the global reactor, which is not running: each request
is one connection on a ``StringTransport``, fed one 224x224 JPEG (41 KB of
JSON) at once, and ``reactor.runUntilCurrent`` runs what the reactor would
run next (the runs' starts).  The access log goes to ``/dev/null`` through
twisted's text observer, as ``twist --log-format text`` writes it.  Prints
the thread CPU per submit of each round (``time.thread_time``).

``--tree NAME=PATH`` runs the same in a child process per round on another
checkout's code, alternating with this one's: the ratio of the two is what
the load disturbs least.

    python -m bench.admission_cpu [--submits 200] [--rounds 5] [--tree NAME=PATH ...]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def measure(submits: int, rounds: int, root: Path = REPO) -> list[float]:
    """Thread CPU ms per submit, one value per round, in this process on the code of the checkout at ``root``."""
    sys.path[:0] = [str(root), str(root / "tests" / "plugins")]
    from twisted.internet import reactor
    from twisted.internet.address import IPv4Address
    from twisted.internet.error import ConnectionDone
    from twisted.internet.testing import StringTransport
    from twisted.logger import (
        FilteringLogObserver,
        LogLevel,
        LogLevelFilterPredicate,
        globalLogBeginner,
        textFileLogObserver,
    )
    from twisted.python.failure import Failure

    from tests.support.images import image_b64
    from tests.support.inmemory import TOKEN, build_model_server

    sink = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
    globalLogBeginner.beginLoggingTo([FilteringLogObserver(textFileLogObserver(sink), [
        LogLevelFilterPredicate(defaultLogLevel=LogLevel.info)])], redirectStandardIO=False)
    server = build_model_server(reactor, async_enabled=True, async_max_queue=10 * submits, max_batch_size=8)
    site = server.service.site
    body = json.dumps({"images": [image_b64(width=224, height=224, fmt="JPEG", seed=3)]}).encode()
    head = (f"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()

    def burst(n: int) -> None:
        connections = []
        for i in range(n):
            peer = IPv4Address("TCP", "127.0.0.1", 20000 + i)
            protocol = site.buildProtocol(peer)
            transport = StringTransport(peerAddress=peer)
            protocol.makeConnection(transport)
            protocol.dataReceived(head + body)
            connections.append((protocol, transport))
        reactor.runUntilCurrent()  # the turn after the I/O pass that wrote the 202s
        reactor.runUntilCurrent()  # the runs start
        for protocol, _ in connections:
            protocol.connectionLost(Failure(ConnectionDone()))
        codes = {transport.value()[9:12] for _, transport in connections}
        if codes != {b"202"}:
            raise SystemExit(f"expected only 202s, got {sorted(codes)}")
        # Forget the jobs and the timers (header deadlines, job budgets): each round starts alike.
        for call in reactor.getDelayedCalls():
            call.cancel()
        server.service.jobs.jobs.clear()
        server.service.jobs.depth = 0
        server.workers.calls.clear()

    burst(submits)  # warm
    gc.collect()
    gc.freeze()  # as the model server does after its load
    out = []
    for _ in range(rounds):
        started = time.thread_time()
        burst(submits)
        out.append((time.thread_time() - started) * 1000.0 / submits)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submits", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--child", metavar="ROOT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.submits, 3, Path(args.child))))
        return
    if not args.tree:
        values = measure(args.submits, args.rounds)
        print(f"reactor CPU per submit ({args.submits} submits a round): "
              + " ".join(f"{v:.3f}" for v in values) + f" ms; median {statistics.median(values):.3f}")
        return
    trees = [("this", REPO)] + [(spec.partition("=")[0], Path(spec.partition("=")[2]).resolve()) for spec in args.tree]
    found: dict[str, list[float]] = {name: [] for name, _ in trees}
    for round_ in range(args.rounds):
        for name, tree in trees if round_ % 2 == 0 else trees[::-1]:
            env = {**os.environ, "PYTHONPATH": f"{tree}:{tree / 'tests' / 'plugins'}"}
            # The child runs this checkout's script on the tree's code: the tree comes first on sys.path.
            done = subprocess.run([sys.executable, __file__, "--child", str(tree), "--submits", str(args.submits)],
                                  env=env, cwd=tree, capture_output=True, text=True, check=True)
            values = json.loads(done.stdout.strip().splitlines()[-1])
            found[name].extend(values)
            print(f"  round {round_ + 1} {name:<8} " + " ".join(f"{v:.3f}" for v in values) + " ms/submit", flush=True)
    base = statistics.median(found["this"])
    for name, values in found.items():
        print(f"  {name:<8} median {statistics.median(values):.3f} ms/submit, min {min(values):.3f} "
              f"({statistics.median(values) / base:.2f} x this)")


if __name__ == "__main__":
    main()
