"""Probe latency under a burst: 1000 GETs of /healthz, /readyz and /metrics, 200 at a time.

Prints the outcome counts and p50/p99/max latency of the answered requests. Then ``--idle``
connections that send nothing are held open and ``/healthz`` is probed one request at a time: before the
eviction of idle connections a probe waited for the idle ones' timeout (2.0 s with 500). The test suite
asserts only counts (tests/component/test_health.py); the latency figures live here, where a busy machine cannot turn
them into a failure. Last, the same beside ``--idle`` connections that each sent a request line and
a Host header and never finished their head ("half-sent"): before, they were never evicted and a probe waited
for their timeout (2.0 s with 500).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.harness.emu.loadgen import burst, get_once  # noqa: E402

#: The server runs in a process of its own, as in the agent: client threads here must not share its GIL.
SERVER = """
import sys, threading
from patcher.adapters.health import Health, HealthServer, Metrics
from patcher.core.status import NodeState
metrics = Metrics()
health = Health()
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
    parser.add_argument("--idle", type=int, default=500, help="idle connections held open for the probe test")
    parser.add_argument("--probes", type=int, default=20, help="sequential /healthz probes beside them")
    args = parser.parse_args()
    server = subprocess.Popen([sys.executable, "-c", SERVER], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdin is not None
    try:
        port = int(server.stdout.readline())
        result = burst("127.0.0.1", port, requests=args.requests, concurrency=args.concurrency,
                       timeout=args.timeout)
        probes = {kind: probes_beside(port, args, head) for kind, head in (("idle", b""), ("half-sent", HALF))}
    finally:
        server.stdin.close()
        server.wait(10)
    lat = sorted(result.latencies_ms)
    q = statistics.quantiles(lat, n=100) if len(lat) > 1 else lat * 99
    print(f"probe burst: {args.requests} requests, {args.concurrency} concurrent, client timeout {args.timeout:g}s")
    print(f"  outcomes: {dict(sorted(result.outcomes.items()))}")
    if lat:
        print(f"  latency ms: p50 {q[49]:.1f}  p99 {q[98]:.1f}  max {lat[-1]:.1f}")
    ok = result.outcomes.get("200", 0) == args.requests
    for kind, outcomes in probes.items():
        answered = sorted(ms for outcome, ms in outcomes if outcome == "200")
        print(f"/healthz beside {args.idle} {kind} connections held open: {len(answered)}/{args.probes} answered"
              + (f", ms p50 {statistics.median(answered):.1f}  max {answered[-1]:.1f}" if answered else ""))
        ok = ok and len(answered) == args.probes
    return 0 if ok else 1


#: What a half-sent request has sent: a request line and a Host header, and no end of its head.
HALF = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"


def probes_beside(port: int, args: argparse.Namespace, head: bytes) -> list[tuple[str, float]]:
    """``args.probes`` sequential /healthz probes while ``args.idle`` connections that sent ``head`` are held."""
    held = []
    try:
        for _ in range(args.idle):
            sock = socket.create_connection(("127.0.0.1", port), timeout=args.timeout)
            held.append(sock)
            if head:
                sock.sendall(head)
        return [get_once("127.0.0.1", port, "/healthz", args.timeout) for _ in range(args.probes)]
    finally:
        for sock in held:
            sock.close()


if __name__ == "__main__":
    raise SystemExit(main())
