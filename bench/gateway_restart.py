"""Gateway restarts under load: connection errors and latency per restart.

A whole service (supervisor and gateway, no model: the clients ask the
gateway's ``/healthz``, which needs no upstream) and N clients in closed
loops (by default 24 with a fresh connection per request and 8 with a
kept-alive one).  After a steady stretch, ``POST
/api/v1/servers/__gateway/restart`` R times in a row with a pause between.
Prints, per restart: how long the restart call took, the client errors and
5xx during its window (from the call until the pause ends), and the p50,
p99 and maximum latency of the requests that ended in that window; then the
same for the steady stretch before the first restart.

Run it on a tree before the handover (a gateway restart stops the old
process first) to see what clients met then.

    python -m bench.gateway_restart [--restarts 10] [--fresh 24] [--kept 8] [--pause 1.0] [--steady 3.0]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from pathlib import Path

from tests.support.clients import ClientLoops, percentile
from tests.support.http import request
from tests.support.stack import build_stack, stop_stack


def window(outcomes, start: float, end: float) -> tuple[list[float], int, int, Counter]:
    """Latencies, errors, 5xx and error kinds between two monotonic times."""
    with outcomes.lock:
        samples = [(t, ms, code) for t, ms, code in outcomes.samples if start <= t < end]
        errors = [e for e, t in zip(outcomes.errors, outcomes.error_times) if start <= t < end]
    kinds = Counter(e.split(":", 1)[0] for e in errors)
    return [ms for _, ms, _ in samples], len(errors), sum(1 for _, _, code in samples if code >= 500), kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=10)
    parser.add_argument("--fresh", type=int, default=24, help="clients with a new connection per request")
    parser.add_argument("--kept", type=int, default=8, help="clients with a kept-alive connection")
    parser.add_argument("--pause", type=float, default=1.0, help="seconds after each restart call")
    parser.add_argument("--steady", type=float, default=3.0, help="seconds of load before the first restart")
    args = parser.parse_args()

    stack = build_stack(Path(tempfile.mkdtemp(prefix="bench-gateway-restart-")), {})
    rows = []
    try:
        stack.wait_for("__gateway", lambda c: c["state"] == "running" and c["ready"], timeout=60)
        clients = ClientLoops(stack.gateway_port, "/healthz", fresh=args.fresh, kept=args.kept,
                              max_requests=10_000_000, timeout=60).start()
        time.sleep(1.0)  # warm-up
        steady_start = time.monotonic()
        time.sleep(args.steady)
        steady_end = time.monotonic()
        for i in range(args.restarts):
            start = time.monotonic()
            reply = request("POST", stack.url + "/api/v1/servers/__gateway/restart", headers=stack.auth, timeout=300)
            took = time.monotonic() - start
            time.sleep(args.pause)
            rows.append((i + 1, reply.status, took, *window(clients.outcomes, start, time.monotonic())))
        outcomes = clients.stop()
    finally:
        stop_stack(stack)

    steady, steady_errors, steady_5xx, _ = window(outcomes, steady_start, steady_end)
    clients_n = args.fresh + args.kept
    print(f"gateway restarts under {clients_n} clients on /healthz ({args.fresh} fresh connections, "
          f"{args.kept} kept-alive), {args.pause:g} s after each restart call")
    print(f"  {'restart':>7} {'reply':>5} {'call s':>6} {'requests':>8} {'errors':>6} {'5xx':>4} {'p50 ms':>7} "
          f"{'p99 ms':>7} {'max ms':>7}  error kinds")
    for n, status, took, lat, errors, fivexx, kinds in rows:
        print(f"  {n:7d} {status:5d} {took:6.2f} {len(lat):8d} {errors:6d} {fivexx:4d} {percentile(lat, 50):7.1f} "
              f"{percentile(lat, 99):7.1f} {max(lat, default=0.0):7.1f}  {dict(kinds) or ''}")
    print(f"  {'steady':>7} {'':>5} {'':>6} {len(steady):8d} {steady_errors:6d} {steady_5xx:4d} "
          f"{percentile(steady, 50):7.1f} {percentile(steady, 99):7.1f} {max(steady, default=0.0):7.1f}  "
          f"({args.steady:g} s before the first restart)")
    total_errors = sum(r[4] for r in rows)
    print(f"\n  total: {outcomes.requests} requests, {len(outcomes.errors)} errors ({total_errors} in restart "
          f"windows), {outcomes.server_errors} 5xx, {outcomes.stale_retries} kept-alive connections closed by the "
          "server and re-sent once")


if __name__ == "__main__":
    main()
