"""Gate release against the real kube-apiserver, beside the same-run ceiling.

bench/gate_bench.py measures the gatekeeper against the emulator with an injected latency; this one runs it
against the newest release `make real-k8s` built (``--release`` picks another): etcd and kube-apiserver on
loopback (tests/harness/real/controlplane.py), three control-plane Nodes registered by their kubelets' identities and
their kube-scheduler mirror pods published as the kubelet publishes them (tests/harness/real/node_client.py), so the
verdict the gatekeeper reads is the real one:

* **gatekeeper**: ``--pods`` gated pods (bench/gate_bench.real_pod, ~5 KB each, created concurrently: set-up,
  not measured) while the last node waits for its scheduler's restart; the real ``scheduler-patcher
  gatekeeper`` process (the Deployment's QPS, burst and concurrency, no leader election) lists them; its
  scheduler restarts (a new mirror pod) and the agent's ``Ready`` annotation is written: the drain is the wall
  time from that write until the gatekeeper's ``pods_released`` counter says every PATCH was answered (read
  from its metrics about 30 times a drain, more often near the end: see ``POLL_MIN_S``; a watch of our own
  would load the API server the gatekeeper shares), then checked by listing the pods: none may still carry
  the gate;
* **ceiling**: a fresh backlog of the same pods (the first one deleted, so the server holds as many), released
  by a plain client (http.client, one kept-open connection per worker) sending only the same PATCH (the same
  JSON patch bytes and content type as ``patcher.adapters.kube.gaterelease.release_gate``) at the same
  concurrency: no cache, no watch, no verdict reads, no throttle.

Before the runs, ``--warmup`` pods are released by the plain client, unmeasured (a fresh server's first drain
is its slowest), and the runs alternate which side drains first. The figure of merit is gatekeeper pods/s over
ceiling pods/s (goal >= 0.8). Everything shares this machine's cores with the API server and etcd, as on a
control-plane node, and with whatever else runs on it: the CPU each process used during each drain, what every
other process used meanwhile, and the load average are printed beside the figures, and so is the machine's CPU
per released pod of each side (releaser + kube-apiserver + etcd), ceiling over gatekeeper: where the cores are
the bound, the ratio the wall-time ratio tends to, and one that a neighbour's burst during one drain moves far
less (four runs with bursts on either side: wall ratios 0.84-1.41, CPU ratios 0.98-1.11). The real-cluster lock
of the tests (tests/harness/real/controlplane.py) is held throughout, so no real-cluster test runs its API server beside
this one.

Run: ``.venv/bin/python bench/gate_real_bench.py`` (10 000 pods, about 2 minutes a run; ``--pods 300 --runs 1``
for a smoke run). Without built binaries it says why in one line and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import rows  # noqa: E402
from bench.gate_bench import cpu_s, free_port, metric, real_pod, wait  # noqa: E402
from patcher.adapters.kube.client import ClientSettings, build_api_client  # noqa: E402
from patcher.adapters.kube.cluster import collect  # noqa: E402
from patcher.adapters.kube.transport import JSON, JSON_PATCH, PODS, USER_AGENT  # noqa: E402
from patcher.core.gates import DEFAULT_GATE, GatedPod, release_patch, slim  # noqa: E402
from patcher.core.readiness import render_table  # noqa: E402
from patcher.services.gatekeeper import DEFAULT_BURST  # noqa: E402
from tests.harness.emu.kubeemu import make_mirror_pod  # noqa: E402
from tests.harness.emu.kubeemu_ext import BEFORE, CONFIG_HASH, OTHER_HASH, STARTED, marker, node_annotations_for  # noqa: E402
from tests.harness.emu.kubeletsim import static_pod_annotations  # noqa: E402
from tests.harness.real.controlplane import (  # noqa: E402
    Binaries,
    ControlPlane,
    built_releases,
    control_plane,
    missing_reason,
    one_at_a_time,
    terminate,
)
from tests.harness.real.node_client import NodeClient  # noqa: E402

NODES = ("cp-1", "cp-2", "cp-3")
LAST = NODES[-1]  #: the node whose scheduler restarts last: its Ready annotation turns the verdict Ready
NAMESPACES = 20  #: real_pod spreads the pods over team-0 .. team-19
INSTANCE = "app.kubernetes.io/instance"  #: real_pod's label naming the backlog (its batch)
MERGE = "application/merge-patch+json"
#: The gatekeeper's counter is read sparsely during a drain: each read costs the gatekeeper ~0.7 ms of CPU
#: (its /metrics render and HTTP server); read every 50 ms, as at first, that was ~11 % of its busy samples
#: in a py-spy profile, load the bench put on what it measures. Now: half the time the pods left need at the
#: rate so far, between these bounds: ~30 reads a drain, and the end is still seen within 50 ms.
POLL_MIN_S, POLL_MAX_S = 0.05, 1.0
GOAL = 0.8


class Conn:
    """Kept-open HTTPS connections to the API server as admin, one per thread (what a client's pool gives each
    worker): for creating the backlogs and for the ceiling's PATCHes."""

    def __init__(self, cp: ControlPlane) -> None:
        self.port = cp.port
        self.ctx = cp.ssl_context()
        self.local = threading.local()

    def send(self, method: str, path: str, body: bytes | None = None,
             content_type: str = JSON) -> tuple[int, bytes]:
        conn: http.client.HTTPSConnection | None = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx,
                                                                 timeout=60)
        headers = {"Accept": JSON, "User-Agent": USER_AGENT}
        if body is not None:
            headers["Content-Type"] = content_type
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()


def each(work: Callable[[int], None], count: int, workers: int) -> None:
    """``work(i)`` for i in 0..count-1 on ``workers`` threads, each taking the next index (as the gatekeeper's
    release workers take the next pod), so no future per item weighs on the client."""
    taken = itertools.count()
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                i = next(taken)
            if i >= count:
                return
            work(i)

    with ThreadPoolExecutor(workers) as pool:
        for f in [pool.submit(worker) for _ in range(min(workers, count))]:
            f.result()


def creatable(pod: dict[str, Any]) -> bytes:
    """bench/gate_bench.real_pod as its ReplicaSet would POST it: the server sets status, timestamps and managed
    fields itself."""
    pod = {**pod, "metadata": {k: v for k, v in pod["metadata"].items()
                               if k not in ("creationTimestamp", "managedFields", "generateName")}}
    pod.pop("status", None)
    return json.dumps(pod).encode()


def create_backlog(conn: Conn, pods: int, batch: str, workers: int) -> None:
    started = time.perf_counter()

    def create(i: int) -> None:
        status, body = conn.send("POST", f"/api/v1/namespaces/team-{i % NAMESPACES}/pods",
                                 creatable(real_pod(i, batch)))
        assert status == 201, (status, body[:300])

    each(create, pods, workers)
    took = time.perf_counter() - started
    print(f"  {pods} gated pods created ({batch}) in {took:.1f}s ({pods / took:.0f}/s, {workers} at once)")


def backlog(cp: ControlPlane, batch: str) -> Iterator[dict[str, Any]]:
    """Every pod of one backlog, as the server has it now (paged lists, as the gatekeeper lists)."""
    token = ""
    while True:
        out = cp.ok("GET", f"/api/v1/pods?labelSelector={INSTANCE}%3D{batch}&limit=500"
                    + (f"&continue={token}" if token else ""))
        yield from out["items"]
        token = out["metadata"].get("continue") or ""
        if not token:
            return


def still_gated(cp: ControlPlane, batch: str) -> tuple[int, int]:
    """(pods of the backlog, those still carrying the gate)."""
    total = gated = 0
    for pod in backlog(cp, batch):
        total += 1
        gated += any(g.get("name") == DEFAULT_GATE for g in pod["spec"].get("schedulingGates") or [])
    return total, gated


def delete_backlog(cp: ControlPlane, batch: str) -> None:
    """Gone at once: a pod bound to no node is deleted without a grace period."""
    for i in range(NAMESPACES):
        cp.ok("DELETE", f"/api/v1/namespaces/team-{i}/pods?labelSelector={INSTANCE}%3D{batch}")
    wait(lambda: not any(True for _ in backlog(cp, batch)), 120, 0.5)


# -- the control-plane nodes, as their kubelets and agents leave them -----------------------------------------

def run_scheduler(node: NodeClient, config_hash: str, started: str) -> None:
    """The node's kubelet (re)starts kube-scheduler from a manifest patched for ``config_hash`` (its marker) and
    publishes the mirror pod, kubeadm's labels included: a new config is a new static pod, so the old mirror pod
    is deleted and a new one created (tests/harness/real/node_client.NodeClient.set_pod), then the status follows."""
    uid = f"{config_hash[:16]}-{node.name}"
    pod = make_mirror_pod(node_name=node.name, annotations=static_pod_annotations(marker(config_hash), uid),
                          started_at=started)
    pod["metadata"]["labels"] = {"component": "kube-scheduler", "tier": "control-plane"}
    node.set_pod(pod)


def agent_says(cp: ControlPlane, node: str, state: str) -> None:
    """The node's agent writes its state annotations (one merge patch, as the agent's reporter does)."""
    cp.ok("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"annotations": node_annotations_for(state)}}, MERGE)


def control_plane_nodes(cp: ControlPlane) -> dict[str, NodeClient]:
    """Three registered control-plane Nodes: the first two run the patched scheduler and say Ready, the last one
    still runs the old scheduler while its agent waits for the restart (the verdict is NotReady)."""
    nodes = {}
    for name in NODES:
        node = nodes[name] = NodeClient(cp, name).register()
        node.mark_control_plane()
        last = name == LAST
        run_scheduler(node, OTHER_HASH if last else CONFIG_HASH, BEFORE if last else STARTED)
        agent_says(cp, name, "WaitingForRestart" if last else "Ready")
    return nodes


def verdict(cp: ControlPlane) -> str:
    """The verdict's summary and reasons as `scheduler-patcher readiness` prints them, read from this server."""
    api = build_api_client(ClientSettings(kubeconfig=str(cp.kubeconfig)))
    try:
        return "\n".join(line for line in render_table(collect(api)).splitlines()
                         if line.startswith(("verdict", "  ")))
    finally:
        api.close()


# -- one drain each ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Usage:
    """CPU seconds per process during a drain, what the rest of the machine used meanwhile, and the load
    average when it ended."""

    gatekeeper: float
    client: float  #: this process: the ceiling's client, or the gatekeeper drain's counter reads
    apiserver: float
    etcd: float
    others: float  #: CPU s of every other process on the machine (the other sessions sharing its cores)
    load: float

    def machine(self, releaser: float) -> float:
        """CPU s the release cost the machine: the releaser's (the gatekeeper, or the plain client) and the
        server's (kube-apiserver and etcd). Where the cores are the bound, as here, drains compare as these
        do; a neighbour's burst moves them far less than the wall times (it inflates them a little: the
        server's CPU per request grows when it waits for a core)."""
        return releaser + self.apiserver + self.etcd


def busy_s() -> float:
    """CPU seconds the whole machine has been busy (every core, every process, the kernel's work included)."""
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0)
                 - getattr(t, "guest_nice", 0.0))  # guest time is counted in user time already


def usage_probe(cp: ControlPlane, gk: psutil.Process | None) -> Callable[[], Usage]:
    """Call it before a drain; call what it returns after: the CPU each process used in between."""
    me = psutil.Process()
    etcd, apiserver = (psutil.Process(p.pid) for p in cp.procs)
    procs = (gk, me, apiserver, etcd)
    before = [cpu_s(p) if p is not None else 0.0 for p in procs]
    busy_before = busy_s()

    def done() -> Usage:
        after = [cpu_s(p) if p is not None else 0.0 for p in procs]
        gk_s, me_s, api_s, etcd_s = (a - b for a, b in zip(after, before, strict=True))
        others = busy_s() - busy_before - (gk_s + me_s + api_s + etcd_s)
        return Usage(gk_s, me_s, api_s, etcd_s, max(0.0, others), os.getloadavg()[0])

    return done


def show(what: str, pods: int, wall: float, use: Usage, note: str = "") -> None:
    print(f"  {what}: {pods} pods released in {wall:.2f}s ({pods / wall:.0f} pods/s); CPU s: gatekeeper "
          f"{use.gatekeeper:.1f}, this script {use.client:.1f}, kube-apiserver {use.apiserver:.1f}, etcd "
          f"{use.etcd:.1f}, other processes {use.others:.1f} of {wall * (os.cpu_count() or 1):.0f} on "
          f"{os.cpu_count()} cores; load average {use.load:.1f}{note}")


@dataclass(frozen=True)
class Run:
    gk_wall: float
    ceiling_wall: float
    gk_cpu_ms: float  #: the gatekeeper's CPU per released pod
    cached_rss: float  #: MiB, with the backlog cached
    peak_rss: float  #: MiB, VmHWM when the drain ended
    gk_use: Usage
    ceiling_use: Usage
    polls: int  #: reads of the gatekeeper's counter during its drain
    gk_first: bool  #: the gatekeeper drained first in this run (the runs alternate)

    @property
    def ratio(self) -> float:
        return self.ceiling_wall / self.gk_wall

    @property
    def cpu_ratio(self) -> float:
        """The machine's CPU per pod, ceiling over gatekeeper: the ratio the drains tend to where the cores
        are the bound, free of what else ran meanwhile."""
        return self.ceiling_use.machine(self.ceiling_use.client) / self.gk_use.machine(self.gk_use.gatekeeper)


def profiler(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling the gatekeeper (``--profile``; ``pip install py-spy``): where its CPU goes in a drain."""
    beside = Path(sys.executable).parent / "py-spy"
    argv = [str(beside) if beside.is_file() else "py-spy", "record", "--pid", str(pid), "--format", "raw",
            "--rate", "200", "--nonblocking", "--output", str(out)]
    spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached
    return spy


def top_frames(spy: subprocess.Popen[bytes], out: Path, shown: int = 15) -> None:
    """Stop py-spy and print the functions the gatekeeper's samples were in, by own (leaf) samples."""
    spy.send_signal(signal.SIGINT)  # py-spy writes its output and exits
    spy.wait(30)
    leaves: dict[str, int] = {}
    total = 0
    for line in out.read_text().splitlines() if out.is_file() else []:
        stack, _, count = line.rpartition(" ")
        leaf = stack.rsplit(";", 1)[-1]
        leaves[leaf] = leaves.get(leaf, 0) + int(count)
        total += int(count)
    print(f"  py-spy, {total} samples of the gatekeeper's busy threads, by the function they were in:")
    for leaf, n in sorted(leaves.items(), key=lambda kv: -kv[1])[:shown]:
        print(f"    {n * 100 / max(total, 1):5.1f}%  {leaf}")


def wait_released(port: int, pods: int, timeout: float) -> int:
    """Until the gatekeeper's ``pods_released`` counter reaches ``pods``, read sparsely (``POLL_MIN_S``); the
    number of reads."""
    t0 = time.perf_counter()
    reads = 0
    while True:
        done = metric(port, "pods_released_total")
        reads += 1
        elapsed = time.perf_counter() - t0
        if done >= pods:
            return reads
        if elapsed > timeout:
            raise TimeoutError(f"{max(done, 0):.0f} of {pods} pods released after {elapsed:.0f}s")
        left_s = (pods - done) * elapsed / done if done > 0 else POLL_MAX_S
        time.sleep(min(POLL_MAX_S, max(POLL_MIN_S, left_s / 2)))


def gatekeeper_drain(cp: ControlPlane, nodes: dict[str, NodeClient], conn: Conn, args: argparse.Namespace,
                     batch: str, tmp: Path) -> tuple[float, float, float, Usage, int]:
    """(wall s, RSS MiB with the backlog cached, peak RSS MiB, CPU use, counter reads) of the gatekeeper's
    drain."""
    create_backlog(conn, args.pods, batch, args.create_workers)
    port = free_port()
    log = tmp / f"gatekeeper-{batch}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "patcher", "gatekeeper", "--kubeconfig", str(cp.kubeconfig), "--leader-elect",
         "false", "--listen", f"127.0.0.1:{port}", "--log-level", "warning", "--resync-interval", "300s",
         *args.gatekeeper_arg],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
        stderr=log.open("wb"))
    try:
        gk = psutil.Process(proc.pid)
        wait(lambda: metric(port, "gated_pods") == args.pods, 300, 0.2)
        assert metric(port, "verdict_ready") == 0, "the verdict is Ready before the last node said so"
        cached = gk.memory_info().rss / 2**20
        # The last node's scheduler restarts onto the patched manifest (a new mirror pod): still NotReady, its
        # agent has not said so yet. Then the agent's Ready annotation: the drain starts with that write.
        run_scheduler(nodes[LAST], CONFIG_HASH, STARTED)
        time.sleep(1.0)  # the mirror pod's events are in; the gatekeeper reads the verdict on Node changes only
        assert metric(port, "pods_released_total") == 0, "released before the verdict turned Ready"
        spy = profiler(proc.pid, tmp / f"profile-{batch}.txt") if args.profile else None
        used = usage_probe(cp, gk)
        t0 = time.perf_counter()
        agent_says(cp, LAST, "Ready")
        polls = wait_released(port, args.pods, 600)
        wall = time.perf_counter() - t0
        use = used()
        if spy is not None:
            top_frames(spy, tmp / f"profile-{batch}.txt")
        peak = int(Path(f"/proc/{proc.pid}/status").read_text().split("VmHWM:")[1].split()[0]) / 1024
    finally:
        terminate(proc)
        errors = log.read_text(errors="replace").strip()
        if errors:
            print(f"  gatekeeper's log:\n{errors[-2000:]}")
    total, gated = still_gated(cp, batch)
    assert (total, gated) == (args.pods, 0), f"{gated} of {total} pods still gated after the gatekeeper's drain"
    show("gatekeeper", args.pods, wall, use, f"; {polls} reads of its counter")
    return wall, cached, peak, use, polls


def ceiling_drain(cp: ControlPlane, conn: Conn, args: argparse.Namespace, batch: str) -> tuple[float, Usage]:
    """The same PATCHes and nothing else, at the gatekeeper's concurrency, over kept-open connections."""
    create_backlog(conn, args.pods, batch, args.create_workers)
    todo: list[GatedPod] = [slim(p) for p in backlog(cp, batch)]
    assert len(todo) == args.pods
    todo.sort(key=lambda p: (p.created, p.namespace, p.name))  # the gatekeeper's order: oldest first

    def release(i: int) -> None:
        pod = todo[i]
        status, body = conn.send("PATCH", PODS.path(pod.namespace, pod.name),
                                 json.dumps(release_patch(pod, DEFAULT_GATE)).encode(), JSON_PATCH)
        assert status == 200, (status, body[:300])

    used = usage_probe(cp, None)
    t0 = time.perf_counter()
    each(release, len(todo), args.concurrency)
    wall = time.perf_counter() - t0
    use = used()
    total, gated = still_gated(cp, batch)
    assert (total, gated) == (args.pods, 0), f"{gated} of {total} pods still gated after the ceiling's drain"
    show(f"ceiling ({args.concurrency} at once)", args.pods, wall, use)
    return wall, use


def warm_up(cp: ControlPlane, conn: Conn, args: argparse.Namespace) -> None:
    """A backlog released by the plain client and deleted, unmeasured: the first drain on a fresh server was
    always the slowest (its heap and watch cache grow, etcd's first compaction), and the gatekeeper's drain
    comes first in a run: without this the first run's ratio was 0.62-0.67, the second's 0.88."""
    if args.warmup:
        print(f"  warm-up, not measured: {args.warmup} pods released by the plain client")
        pods = args.pods
        args.pods = args.warmup
        try:
            ceiling_drain(cp, conn, args, "warmup")
        finally:
            args.pods = pods
        delete_backlog(cp, "warmup")


def one_run(cp: ControlPlane, nodes: dict[str, NodeClient], conn: Conn, args: argparse.Namespace, run: int,
            tmp: Path) -> Run:
    """One drain of each on a fresh backlog; the order alternates from run to run (gatekeeper first in the
    first), so neither side always meets the server as the other left it."""
    gk_first = run % 2 == 0

    def ceiling() -> tuple[float, Usage]:
        out = ceiling_drain(cp, conn, args, f"ceiling{run}")
        delete_backlog(cp, f"ceiling{run}")  # the next drain meets a server holding as many pods
        return out

    if not gk_first:
        ceiling_wall, ceiling_use = ceiling()
    if run:  # the last node's scheduler is being restarted again: NotReady while a fresh backlog is gated
        run_scheduler(nodes[LAST], OTHER_HASH, BEFORE)
        agent_says(cp, LAST, "WaitingForRestart")
    gk_wall, cached, peak, gk_use, polls = gatekeeper_drain(cp, nodes, conn, args, f"gk{run}", tmp)
    delete_backlog(cp, f"gk{run}")
    if gk_first:
        ceiling_wall, ceiling_use = ceiling()
    out = Run(gk_wall, ceiling_wall, gk_use.gatekeeper * 1000 / args.pods, cached, peak, gk_use, ceiling_use,
              polls, gk_first)
    print(f"  run {run + 1}: gatekeeper / ceiling = {out.ratio:.2f} (wall), {out.cpu_ratio:.2f} (the machine's "
          "CPU per pod)")
    return out


def record(runs: list[Run], pods: int) -> None:
    """The rows of ``make bench``: medians over the runs; for rates the p99 column holds the slowest run."""
    def rate_row(figure: str, values: list[float]) -> rows.Row:
        return rows.Row(figure, len(values), statistics.median(values), min(values))

    rows.record(rows.of("real apiserver: 10k gated pods released by the gatekeeper, s",
                        [r.gk_wall for r in runs]))
    rows.record(rate_row("real apiserver: gatekeeper pods/s released", [pods / r.gk_wall for r in runs]))
    rows.record(rate_row("real apiserver: plain client, same PATCHes and concurrency (ceiling), pods/s",
                         [pods / r.ceiling_wall for r in runs]))
    rows.record(rate_row(f"real apiserver: gatekeeper / ceiling (goal >= {GOAL})", [r.ratio for r in runs]))
    rows.record(rate_row("real apiserver: machine CPU per pod, ceiling / gatekeeper", [r.cpu_ratio for r in runs]))
    rows.record(rows.of("real apiserver: gatekeeper CPU ms per released pod", [r.gk_cpu_ms for r in runs]))
    rows.record(rows.of("real apiserver: gatekeeper peak RSS MiB, backlog cached", [r.peak_rss for r in runs]))


def others_pct(use: Usage, wall: float) -> float:
    """The share of the machine's cores other processes used during a drain, in %."""
    return use.others * 100 / (wall * (os.cpu_count() or 1))


def table(runs: list[Run], pods: int) -> None:
    print(f"\n{'run':>3}  {'first':>10}  {'drain s':>7}  {'pods/s':>6}  {'ceiling pods/s':>14}  {'ratio':>5}  "
          f"{'CPU ratio':>9}  {'CPU ms/pod':>10}  {'RSS MiB':>7}  {'peak MiB':>8}  {'others %':>9}  {'load':>4}")
    for i, r in enumerate(runs):
        others = f"{others_pct(r.gk_use, r.gk_wall):.0f}/{others_pct(r.ceiling_use, r.ceiling_wall):.0f}"
        print(f"{i + 1:>3}  {'gatekeeper' if r.gk_first else 'ceiling':>10}  {r.gk_wall:>7.2f}  "
              f"{pods / r.gk_wall:>6.0f}  {pods / r.ceiling_wall:>14.0f}  {r.ratio:>5.2f}  {r.cpu_ratio:>9.2f}  "
              f"{r.gk_cpu_ms:>10.3f}  {r.cached_rss:>7.1f}  {r.peak_rss:>8.1f}  {others:>9}  {r.gk_use.load:>4.1f}")
    ratio = statistics.median(r.ratio for r in runs)
    cpu_ratio = statistics.median(r.cpu_ratio for r in runs)
    print(f"median gatekeeper / ceiling: {ratio:.2f} (goal >= {GOAL}: {'ok' if ratio >= GOAL else 'MISSED'}); "
          f"the machine's CPU per pod, ceiling / gatekeeper: {cpu_ratio:.2f}")
    print("(others %: the cores' share other processes used during the gatekeeper's / the ceiling's drain; "
          "load: the load average as the gatekeeper's drain ended)")


def pick(release: str | None) -> Binaries:
    built = built_releases()
    if release is None:
        return built[0]
    for b in built:
        if b.version == release.lstrip("v"):
            return b
    raise SystemExit(f"gate_real_bench: release {release} is not built (built: "
                     f"{', '.join(b.version for b in built)})")


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--pods", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=2, help="pairs of drains (gatekeeper, then ceiling), each on a "
                    "fresh backlog of the same server; the rows are their median")
    ap.add_argument("--release", default=None, help="a version `make real-k8s` built (default: the newest)")
    ap.add_argument("--concurrency", type=int, default=DEFAULT_BURST,
                    help="the ceiling's workers: the gatekeeper's default release concurrency")
    ap.add_argument("--warmup", type=int, default=3000, help="pods released unmeasured first (0: none)")
    ap.add_argument("--create-workers", type=int, default=8, help="concurrent POSTs creating a backlog")
    ap.add_argument("--gatekeeper-arg", action="append", default=[], metavar="ARG",
                    help="one more argument of the gatekeeper (repeat it), to find where its time goes: e.g. "
                    "--gatekeeper-arg=--release-batch=100000; the Deployment's defaults otherwise")
    ap.add_argument("--profile", action="store_true", help="sample the gatekeeper with py-spy during its drains")
    ap.add_argument("--no-lock", action="store_true",
                    help="do not take the real-cluster lock (the caller holds it: a real_cluster test)")
    args = ap.parse_args()
    if (why := missing_reason()) is not None:
        print(f"gate_real_bench: skipped, {why}")
        return 0
    binaries = pick(args.release)
    lock = contextlib.nullcontext() if args.no_lock else one_at_a_time()
    if not args.no_lock:
        print("taking the real-cluster lock (tests/harness/real/controlplane.one_at_a_time; a real-cluster test may "
              "hold it)", flush=True)
    with lock, tempfile.TemporaryDirectory(prefix="gate-real-") as t, \
            control_plane(binaries, Path(t) / "cp") as cp:
        print(f"kube-apiserver v{binaries.version} ready in {cp.started_in:.1f}s; {args.pods} pods a backlog, "
              f"{args.runs} run(s), load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        for i in range(NAMESPACES):
            cp.ensure_namespace(f"team-{i}")
            cp.ok("POST", f"/api/v1/namespaces/team-{i}/serviceaccounts", {"metadata": {"name": "app"}})
        nodes = control_plane_nodes(cp)
        print(verdict(cp))
        conn = Conn(cp)
        warm_up(cp, conn, args)
        runs = [one_run(cp, nodes, conn, args, run, Path(t)) for run in range(args.runs)]
    table(runs, args.pods)
    record(runs, args.pods)
    return 0


if __name__ == "__main__":
    sys.exit(main())
