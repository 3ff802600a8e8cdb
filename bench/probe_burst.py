"""Probe latency under a burst (issue 13 item 7): 1000 GETs of /healthz, /readyz and /metrics, 200 at a time.

Prints the outcome counts and p50/p99/max latency of the answered requests. The test suite asserts only counts
(tests/test_health.py); the latency figures live here, where a busy machine cannot turn them into a failure.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.loadgen import burst  # noqa: E402

#: The server runs in a process of its own, as in the agent: client threads here must not share its GIL.
SERVER = """
import sys, threading
from patcher.adapters.health import Health, HealthServer, Metrics
from patcher.core.status import NodeState
metrics = Metrics()
health = Health(metrics=metrics)
health.beat()
health.set_state(NodeState.READY)
with HealthServer(health, metrics, "127.0.0.1:0") as server:
    print(server.port, flush=True)
    sys.stdin.read()
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=5.0, help="client timeout (the readiness probe's)")
    args = parser.parse_args()
    server = subprocess.Popen([sys.executable, "-c", SERVER], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdin is not None
    try:
        port = int(server.stdout.readline())
        result = burst("127.0.0.1", port, requests=args.requests, concurrency=args.concurrency,
                       timeout=args.timeout)
    finally:
        server.stdin.close()
        server.wait(10)
    lat = sorted(result.latencies_ms)
    q = statistics.quantiles(lat, n=100) if len(lat) > 1 else lat * 99
    print(f"probe burst: {args.requests} requests, {args.concurrency} concurrent, client timeout {args.timeout:g}s")
    print(f"  outcomes: {dict(sorted(result.outcomes.items()))}")
    if lat:
        print(f"  latency ms: p50 {q[49]:.1f}  p99 {q[98]:.1f}  max {lat[-1]:.1f}")
    return 0 if result.outcomes.get("200", 0) == args.requests else 1


if __name__ == "__main__":
    raise SystemExit(main())
