"""Gate release against the real kube-apiserver (issue 31 f), beside the same-run ceiling.

bench/gate_bench.py measures the gatekeeper against the emulator with an injected latency; this one runs it
against the newest release `make real-k8s` built (etcd + kube-apiserver on loopback, tests/realk8s.py):

* **gatekeeper**: `--pods` gated pods (bench/gate_bench.real_pod, ~5 KB each) are created while the verdict is
  not Ready; the `scheduler-patcher gatekeeper` process (its default QPS, burst and concurrency) caches them;
  the last control-plane node turns Ready and the wall time until every pod is released is measured (the
  gatekeeper's own gated-pods gauge reaching 0, then checked by a list of the pods);
* **ceiling**: a fresh backlog of the same pods, released by a plain client that sends only the same JSON patches
  (`patcher.core.gates.release_patch`) at the same concurrency over kept-open connections, with no cache, no
  verdict reads and no throttle: what this server on this machine allows.

The figure of merit is gatekeeper pods/s over ceiling pods/s (goal >= 0.8). Both sides share the 2 cores with
the API server and etcd, as they would on a control-plane node.

Run: ``.venv/bin/python bench/gate_real_bench.py`` (about 3 minutes; ``--pods 1000`` for a smoke run).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import rows  # noqa: E402
from bench.gate_bench import CP, NODES, free_port, metric, real_pod  # noqa: E402
from patcher.core.gates import DEFAULT_GATE, release_patch  # noqa: E402
from patcher.services.gatekeeper import DEFAULT_BURST  # noqa: E402
from tests.kubeemu import make_mirror_pod  # noqa: E402
from tests.kubeemu_ext import BEFORE, STARTED, marker, node_annotations_for  # noqa: E402
from tests.realk8s import ControlPlane, built_releases, control_plane, missing_reason  # noqa: E402

NAMESPACES = 20  # real_pod spreads pods over team-0 .. team-19


class Conn:
    """Kept-open HTTPS connections to the API server, one per thread (what a client's pool gives each worker)."""

    def __init__(self, cp: ControlPlane) -> None:
        self.host, self.port = "127.0.0.1", cp.port
        self.ctx = cp.ssl_context()
        self.local = threading.local()

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json") -> tuple[int, bytes]:
        conn: http.client.HTTPSConnection | None = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=60)
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": content_type, "Accept": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()


def in_parallel(work: Callable[[int], None], items: Iterable[int], workers: int) -> None:
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(work, items))


def creatable(pod: dict[str, Any]) -> dict[str, Any]:
    """bench/gate_bench.real_pod as a client creates it: the server sets status, timestamps, managed fields."""
    pod = json.loads(json.dumps(pod))
    for key in ("status",):
        pod.pop(key, None)
    for key in ("creationTimestamp", "managedFields", "generateName"):
        pod["metadata"].pop(key, None)
    return pod


def set_node(cp: ControlPlane, node: str, ready: bool) -> None:
    """A control-plane node as the agents leave it: annotations, and its mirror pod (running since STARTED, or
    since BEFORE the restart the agent waits for)."""
    annotations = node_annotations_for("Ready" if ready else "WaitingForRestart")
    status, _ = cp.request("GET", f"/api/v1/nodes/{node}")
    if status == 404:
        cp.ok("POST", "/api/v1/nodes", {"metadata": {"name": node, "labels": {CP: ""}, "annotations": annotations}})
    else:
        cp.ok("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"annotations": annotations}},
              "application/merge-patch+json")
    pod = make_mirror_pod(node_name=node, annotations=marker(), started_at=STARTED if ready else BEFORE)
    name = pod["metadata"]["name"]
    status, _ = cp.request("GET", f"/api/v1/namespaces/kube-system/pods/{name}")
    if status == 404:
        created = dict(pod, metadata={k: v for k, v in pod["metadata"].items() if k != "ownerReferences"})
        cp.ok("POST", "/api/v1/namespaces/kube-system/pods", created)
    cp.ok("PATCH", f"/api/v1/namespaces/kube-system/pods/{name}/status", {"status": pod["status"]},
          "application/merge-patch+json")


def create_backlog(cp: ControlPlane, conn: Conn, pods: int, batch: str, workers: int) -> float:
    started = time.perf_counter()

    def create(i: int) -> None:
        pod = creatable(real_pod(i, batch))
        status, body = conn.request("POST", f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods", pod)
        assert status == 201, (status, body[:300])

    in_parallel(create, range(pods), workers)
    return time.perf_counter() - started


def still_gated(cp: ControlPlane, batch: str) -> int:
    out = cp.ok("GET", f"/api/v1/pods?labelSelector=app.kubernetes.io/instance%3D{batch}")
    return sum(1 for p in out["items"] if any(g["name"] == DEFAULT_GATE
                                              for g in p["spec"].get("schedulingGates") or []))


def wait(pred: Callable[[], bool], timeout: float, step: float = 0.01) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise TimeoutError
        time.sleep(step)


def gatekeeper_drain(cp: ControlPlane, conn: Conn, args: argparse.Namespace, tmp: Path) -> float:
    for node in NODES:
        set_node(cp, node, node != "cp-3")
    took = create_backlog(cp, conn, args.pods, "gk", args.create_workers)
    print(f"{args.pods} gated pods created in {took:.1f}s ({args.pods / took:.0f}/s)")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "patcher", "gatekeeper", "--kubeconfig", str(cp.kubeconfig), "--leader-elect",
         "false", "--listen", f"127.0.0.1:{port}", "--log-level", "warning", "--resync-interval", "300s",
         "--namespace", "scheduler-patcher"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)
    try:
        wait(lambda: metric(port, "gated_pods") == args.pods, 300, 0.1)
        t0 = time.perf_counter()
        set_node(cp, "cp-3", True)  # the last scheduler runs the extender: the verdict turns Ready
        wait(lambda: metric(port, "gated_pods") == 0, 600, 0.005)
        wall = time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(30)
    left = still_gated(cp, "gk")
    assert left == 0, f"{left} pods still gated after the gatekeeper said none"
    print(f"gatekeeper: {args.pods} pods released in {wall:.2f}s ({args.pods / wall:.0f} pods/s)")
    return wall


def ceiling_drain(cp: ControlPlane, conn: Conn, args: argparse.Namespace) -> float:
    """The same PATCHes, nothing else, at the gatekeeper's concurrency."""
    create_backlog(cp, conn, args.pods, "ceiling", args.create_workers)
    out = cp.ok("GET", "/api/v1/pods?labelSelector=app.kubernetes.io/instance%3Dceiling")
    todo = [(p["metadata"]["namespace"], p["metadata"]["name"], release_patch(p, DEFAULT_GATE)) for p in out["items"]]
    t0 = time.perf_counter()

    def release(i: int) -> None:
        ns, name, patch = todo[i]
        status, body = conn.request("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}", patch,
                                    "application/json-patch+json")
        assert status == 200, (status, body[:300])

    in_parallel(release, range(len(todo)), args.concurrency)
    wall = time.perf_counter() - t0
    print(f"ceiling: {len(todo)} pods released in {wall:.2f}s ({len(todo) / wall:.0f} pods/s), "
          f"{args.concurrency} at once")
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--pods", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=1, help="pairs of drains (gatekeeper, ceiling), fresh server each")
    ap.add_argument("--concurrency", type=int, default=DEFAULT_BURST, help="the gatekeeper's default")
    ap.add_argument("--create-workers", type=int, default=16)
    args = ap.parse_args()
    if (why := missing_reason()) is not None:
        print(f"gate_real_bench: skipped ({why})")
        return 0
    binaries = built_releases()[0]
    ratios: list[float] = []
    gk_rates: list[float] = []
    ceiling_rates: list[float] = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as t, control_plane(binaries, Path(t) / "cp") as cp:
            print(f"run {run + 1}: kube-apiserver v{binaries.version} ready in {cp.started_in:.1f}s")
            for i in range(NAMESPACES):
                cp.ensure_namespace(f"team-{i}")
                cp.ok("POST", f"/api/v1/namespaces/team-{i}/serviceaccounts", {"metadata": {"name": "app"}})
            cp.ensure_namespace("scheduler-patcher")
            conn = Conn(cp)
            gk = gatekeeper_drain(cp, conn, args, Path(t))
            ceiling = ceiling_drain(cp, conn, args)
            gk_rates.append(args.pods / gk)
            ceiling_rates.append(args.pods / ceiling)
            ratios.append(ceiling / gk)
    print(f"gatekeeper / ceiling pods/s: {statistics.median(ratios):.2f} (goal >= 0.8)")
    rows.record(rows.Row("gatekeeper, real kube-apiserver: pods/s released", len(gk_rates),
                         statistics.median(gk_rates), min(gk_rates)))
    rows.record(rows.Row("plain client, same PATCHes and concurrency: pods/s", len(ceiling_rates),
                         statistics.median(ceiling_rates), min(ceiling_rates)))
    rows.record(rows.Row("gatekeeper / ceiling (goal >= 0.8)", len(ratios), statistics.median(ratios), min(ratios)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
