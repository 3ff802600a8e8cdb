"""Gatekeeper benchmark: a backlog of gated pods released once the verdict turns Ready.

Against the API emulator in this process (threaded: every connection has its own thread) with an injected
latency per request (``--latency-ms``, 5 by default), the real ``scheduler-patcher gatekeeper`` process (its
default QPS/burst/concurrency, no leader election) caches ``--pods`` gated pods with realistic specs (about
5 KB of JSON each), then:

* **drain** (``--runs`` times, 3 by default, each with a fresh backlog; the rows are the median, their p99
  the worst run: the machine may be shared, and one drain can fall on a neighbour's burst): the last
  control-plane node turns Ready; wall time from that write until every pod is released (each PATCH
  answered), the requests the gatekeeper sent meanwhile, pods/s, the gatekeeper's RSS with every pod cached
  and its peak RSS (``VmHWM``), and where the CPU went: the gatekeeper's CPU per released pod (its own cost,
  whatever shares the machine: the GIL gives it one core, so 1 ms per pod caps it at 1000 pods/s) and the
  emulator's per request (the API side, in this process);
* **stop**: a second backlog; while the ``--stop-at``-th oldest pod is being patched a node turns NotReady:
  the pods released after the emulator sent the gatekeeper the first watch event of that change (the Node's
  annotations, or its kube-scheduler pod for the metadata-only watch of ``kube-system``), against the bound
  docs/operator-contract.md states: at most ``--release-concurrency`` once a watch delivered the change (the
  releases in flight complete; none starts). Counted from the event's sending, not its delivery (the
  gatekeeper is another process), the figure can only be too high: within the bound, the bound is kept.
  The releases after the write itself are shown too: between the server storing a change and a watch
  delivering it releases go on, by contract.

Run: ``.venv/bin/python bench/gate_bench.py`` (about a minute; ``--pods 300 --runs 1`` for a smoke run).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import rows  # noqa: E402
from patcher.core.gates import DEFAULT_GATE  # noqa: E402
from patcher.services.gatekeeper import DEFAULT_BURST  # noqa: E402
from tests.harness.emu.kubeemu import KubeEmulator, make_mirror_pod  # noqa: E402
from tests.harness.emu.kubeemu_ext import BEFORE, STARTED, KubeEmulatorExt, marker, node_annotations_for  # noqa: E402

CP = "node-role.kubernetes.io/control-plane"
NODES = ("cp-1", "cp-2", "cp-3")
METRIC = "scheduler_patcher_gatekeeper_"
TARGET_WALL_S, TARGET_PODS_PER_S, TARGET_RSS_MIB = 10.0, 1000.0, 100.0
#: The environment manifests/gatekeeper/deployment.yaml gives the container besides its flags.
DEPLOYMENT_ENV: dict[str, str] = {}


def node_state(emu: KubeEmulator, node: str, ready: bool) -> None:
    emu.set_pod(make_mirror_pod(node_name=node, annotations=marker(), started_at=STARTED if ready else BEFORE))
    emu.upsert({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node, "labels": {CP: ""},
                             "annotations": node_annotations_for("Ready" if ready else "WaitingForRestart")}})


def real_pod(i: int, batch: str) -> dict[str, Any]:
    """A pod as a Deployment's ReplicaSet creates it: labels, owner, managed fields, two containers, volumes."""
    name = f"{batch}-{i:05d}"
    env = [{"name": f"SETTING_{k}", "value": f"value-{k}-" + "x" * 24} for k in range(12)]
    container = {
        "name": "app", "image": "registry.example.com/team/app:1.42.0", "imagePullPolicy": "IfNotPresent",
        "args": ["--listen=:8080", "--metrics=:9090", "--log-format=json"], "env": env,
        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http", "scheme": "HTTP"}, "periodSeconds": 10},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http", "scheme": "HTTP"}, "periodSeconds": 20},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "config", "mountPath": "/etc/app"},
                         {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                          "readOnly": True}],
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    sidecar = {**container, "name": "proxy", "image": "registry.example.com/proxy:2.7.1", "env": env[:4],
               "args": ["--upstream=127.0.0.1:8080"]}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": f"team-{i % 20}", "generateName": f"{batch}-",
            "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600 + i / 10)),
            "labels": {"app.kubernetes.io/name": "app", "app.kubernetes.io/instance": batch,
                       "pod-template-hash": "5d8f7c9b6d"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-25T05:00:00Z"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{batch}-5d8f7c9b6d",
                                 "uid": "0b3c2a4e-8f1d-4a57-9f0e-6c1d2b3a4f5e", "controller": True,
                                 "blockOwnerDeletion": True}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                               "time": "2026-11-25T05:00:00Z", "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:metadata": {"f:labels": {"f:app.kubernetes.io/name": {}}},
                                            "f:spec": {"f:containers": {'k:{"name":"app"}': {"f:env": {}}}}}}],
        },
        "spec": {
            "containers": [container, sidecar], "schedulingGates": [{"name": DEFAULT_GATE}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": f"data-{name}"}},
                        {"name": "config", "configMap": {"name": "app-config", "defaultMode": 420}},
                        {"name": "kube-api-access", "projected": {"sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt",
                                                                                   "path": "ca.crt"}]}}]}}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "app", "schedulerName": "default-scheduler", "priority": 0,
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 300}],
            "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {
                    "matchLabels": {"app.kubernetes.io/name": "app"}}}}]}},
        },
        "status": {"phase": "Pending", "qosClass": "Burstable", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
             "message": "Scheduling is blocked due to non-empty scheduling gates"}]},
    }


def wait(pred: Callable[[], bool], timeout: float, step: float = 0.01) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise TimeoutError
        time.sleep(step)


def metric(port: int, name: str) -> float:
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return -1.0
    for line in body.splitlines():
        if line.startswith(METRIC + name + " "):
            return float(line.split()[1])
    return -1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SentAt(KubeEmulatorExt):
    """The emulator, noting the pods released when the first watch event about one of ``armed`` (kind, name)
    is written to a watch stream: the earliest a watch can deliver that change."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.armed: set[tuple[str, str]] = set()
        self.sent_at: list[int] = []

    def _event_text(self, event: object) -> bytes:
        text = super()._event_text(event)
        obj = getattr(event, "object", None)
        if self.armed and not self.sent_at and isinstance(obj, dict) and (
                obj.get("kind"), obj.get("metadata", {}).get("name")) in self.armed:
            self.sent_at.append(released_count(self))  # the line goes out right after this returns
        return text


def released_count(emu: KubeEmulator) -> int:
    return emu.count("PATCH", 200)  # the gatekeeper patches nothing but pods


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


@dataclass(frozen=True)
class Drain:
    """One drain of the backlog: wall seconds, requests sent, CPU seconds of the gatekeeper and of this process
    (the emulator, and this script's polling)."""

    wall: float
    requests: int
    patches: int
    gk_cpu: float
    emu_cpu: float


def drain(emu: KubeEmulatorExt, gk: psutil.Process, args: argparse.Namespace) -> Drain:
    """Turn the verdict Ready and wait until every gated pod was released (each PATCH answered)."""
    emu.clear_requests()
    me = psutil.Process()
    gk_cpu0, emu_cpu0 = cpu_s(gk), cpu_s(me)
    t0 = time.perf_counter()
    node_state(emu, "cp-3", True)  # the last scheduler runs the extender: the verdict turns Ready
    wait(lambda: released_count(emu) >= args.pods, 300, step=0.005)
    wall = time.perf_counter() - t0
    gk_cpu, emu_cpu = cpu_s(gk) - gk_cpu0, cpu_s(me) - emu_cpu0
    sent = [r for r in emu.requests() if r.query.get("watch") != "true"]
    patches = sum(r.method == "PATCH" for r in sent)
    print(f"drain: {args.pods} pods released in {wall:.2f}s ({args.pods / wall:.0f} pods/s) with "
          f"{args.latency_ms:g} ms per request; {len(sent)} requests ({patches} PATCH, {len(sent) - patches} "
          f"verdict reads), at most {emu.peak_in_flight} in flight")
    print(f"       CPU: gatekeeper {gk_cpu:.1f}s ({gk_cpu * 1000 / args.pods:.2f} ms per pod: on a core of its own, "
          f"which the GIL allows it, {args.pods / gk_cpu:.0f} pods/s), emulator (+ this script) {emu_cpu:.1f}s "
          f"({emu_cpu * 1000 / len(sent):.2f} ms per request) over {wall:.1f}s on {os.cpu_count()} cores")
    return Drain(wall, len(sent), patches, gk_cpu, emu_cpu)


def record_drains(drains: list[Drain], pods: int, peak: float) -> None:
    """The rows of ``make bench``: the median of the drains (p99: the worst), and the peak RSS."""
    rows.record(rows.of("gatekeeper: 10k gated pods released, s (5 ms/request)", [d.wall for d in drains]))
    rows.record(rows.of("gatekeeper: ms per released pod (target >= 1000 pods/s)",
                        [d.wall * 1000 / pods for d in drains]))
    rates = [pods / d.wall for d in drains]  # a rate's worst run is its slowest: the p99 column holds the lowest
    rows.record(rows.Row("gatekeeper: pods/s released (5 ms/request)", len(rates), statistics.median(rates),
                         min(rates)))
    rows.record(rows.of("gatekeeper: requests per drain (PATCH + verdict reads)", [float(d.requests) for d in drains]))
    rows.record(rows.of("gatekeeper: CPU ms per released pod", [d.gk_cpu * 1000 / pods for d in drains]))
    rows.record(rows.of("emulator (+ bench script): CPU ms per request", [d.emu_cpu * 1000 / d.requests
                                                                         for d in drains]))
    rows.record(rows.Row("gatekeeper: peak RSS MiB, 10k pods cached", 1, peak, peak))
    gk_ms = statistics.median(d.gk_cpu * 1000 / pods for d in drains)
    print(f"median of {len(drains)} drains: {statistics.median(d.wall for d in drains):.2f}s, "
          f"{statistics.median(pods / d.wall for d in drains):.0f} pods/s, gatekeeper CPU {gk_ms:.2f} ms per pod")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, default=10_000)
    ap.add_argument("--latency-ms", type=float, default=5.0)
    ap.add_argument("--stop-pods", type=int, default=3000)
    ap.add_argument("--stop-at", type=int, default=1000, help="the NotReady write comes with this pod's patch")
    ap.add_argument("--concurrency", type=int, default=None, help="--release-concurrency (default: its own)")
    ap.add_argument("--runs", type=int, default=3, help="drains of a fresh backlog; the rows are their median "
                    "(the machine may be shared: one drain can fall on a neighbour's burst)")
    args = ap.parse_args()
    pool = args.concurrency or DEFAULT_BURST  # the gatekeeper's --release-concurrency (default: the burst)

    emu = SentAt(history=100_000)
    with tempfile.TemporaryDirectory() as t, emu:
        for n in NODES:
            node_state(emu, n, n != "cp-3")
        started = time.perf_counter()
        for i in range(args.pods):
            emu.create(real_pod(i, "drain"))
        print(f"{args.pods} gated pods stored in the emulator in {time.perf_counter() - started:.1f}s")
        emu.latency = args.latency_ms / 1000
        port = free_port()
        kubeconfig = emu.write_kubeconfig(Path(t) / "kubeconfig")
        proc = subprocess.Popen(
            [sys.executable, "-m", "patcher", "gatekeeper", "--kubeconfig", str(kubeconfig), "--leader-elect",
             "false", "--listen", f"127.0.0.1:{port}", "--log-level", "warning", "--resync-interval", "300s",
             *(["--release-concurrency", str(args.concurrency)] if args.concurrency else [])],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **DEPLOYMENT_ENV}, stdout=subprocess.DEVNULL)
        gk = psutil.Process(proc.pid)
        drains: list[Drain] = []
        try:
            for run in range(args.runs):
                if run:  # a fresh backlog, gated while the verdict is not Ready
                    node_state(emu, "cp-3", False)
                    wait(lambda: metric(port, "verdict_ready") == 0, 30)
                    for i in range(args.pods):
                        emu.create(real_pod(i, f"drain{run}"))
                wait(lambda: metric(port, "gated_pods") == args.pods, 120)
                if not run:
                    cached_rss = gk.memory_info().rss / 2**20
                    print(f"gatekeeper caches {args.pods} gated pods: RSS {cached_rss:.1f} MiB")
                drains.append(drain(emu, gk, args))
            peak = int(Path(f"/proc/{proc.pid}/status").read_text().split("VmHWM:")[1].split()[0]) / 1024
            print(f"       gatekeeper peak RSS {peak:.1f} MiB")
            record_drains(drains, args.pods, peak)

            # -- stop: a NotReady verdict during a drain ----------------------------------------------------
            node_state(emu, "cp-3", False)
            wait(lambda: metric(port, "verdict_ready") == 0, 30)
            stop_names = [f"stop-{i:05d}" for i in range(args.stop_pods)]
            for i in range(args.stop_pods):
                emu.create(real_pod(i, "stop"))
            wait(lambda: metric(port, "gated_pods") == args.stop_pods, 60)
            flipped: list[int] = []

            def flip(e: KubeEmulator) -> None:
                flipped.append(released_count(e))
                emu.armed = {("Node", "cp-2"), ("Pod", "kube-scheduler-cp-2")}
                node_state(e, "cp-2", False)

            target = stop_names[args.stop_at]
            emu.before("PATCH", f"/api/v1/namespaces/team-{args.stop_at % 20}/pods/{target}", flip)
            emu.clear_requests()
            node_state(emu, "cp-3", True)
            wait(lambda: bool(flipped) and metric(port, "verdict_ready") == 0, 60)
            time.sleep(1.0)  # anything still to come would come now
            done = released_count(emu)
            assert emu.sent_at, "no watch event of the NotReady change was sent"
            after = done - emu.sent_at[0]
            print(f"stop:  NotReady written while pod #{args.stop_at + 1} was being patched ({flipped[0]} released "
                  f"before): {done - flipped[0]} released after the write, {after} after its first watch event "
                  f"was sent; bound --release-concurrency {pool}; {args.stop_pods - done} stay gated")
            rows.record(rows.Row("gatekeeper: pods released after a NotReady watch event, per release slot", 1,
                                 after / pool, after / pool))
        finally:
            proc.terminate()
            proc.wait(20)
    wall = statistics.median(d.wall for d in drains)
    rate = args.pods / wall
    verdicts = [("wall", wall <= TARGET_WALL_S), ("pods/s", rate >= TARGET_PODS_PER_S),
                ("RSS", peak <= TARGET_RSS_MIB), ("stop", after <= pool)]
    print(f"targets (median of {len(drains)} drains: <= 10 s, >= 1000 pods/s; peak RSS <= 100 MiB, stop: at most "
          f"--release-concurrency ({pool}) after the NotReady watch event): "
          + ", ".join(f"{k} {'ok' if ok else 'MISSED'}" for k, ok in verdicts))


if __name__ == "__main__":
    main()
