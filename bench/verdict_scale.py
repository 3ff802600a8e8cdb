"""The readiness verdict at cluster scale on the real kube-apiserver, today's read path beside the old one.

On etcd and kube-apiserver of the newest release `make real-k8s` built (tests/harness/real/controlplane.py, with the
audit log of the project's ServiceAccounts that tests/harness/real/simnodes.py writes), this builds:

* ``--nodes`` Node objects (5 000): three control-plane nodes registered by their kubelets' identities, each with
  a real agent (tests/harness/real/simnodes.Agents: the manifests' RBAC, a ServiceAccount token, a kubelet stand-in that
  restarts the scheduler and publishes its mirror pod as the kubelet does), one node without labels whose
  kube-scheduler mirror pod has no labels either (the seed's corner case: no agent there, so the verdict is
  NotReady until the bench plays its agent saying Ready), and the rest plain worker Nodes;
* ``--kube-system-pods`` (20 000) DaemonSet-like pods in kube-system, four a node (kube-proxy, a CNI, a CSI node
  plugin, a node exporter), bound, Running, 5-10 KB each as the server stores them;
* ``--gated`` (10 000) pods carrying the scheduling gate in the namespace ``workload``;

and measures, for the new read path and for the old one (the release ``--old-ref``, 50c20db by default: its
``cluster.collect`` loaded from ``git show`` for the in-process reads, its whole ``patcher`` package from
``git archive`` for the processes), in the same run:

* ``verdict_bytes``, ``verdict_requests``: one warm verdict (what the client received, ``tests.harness.traffic``);
* ``apiserver_cpu_s_per_verdict``: kube-apiserver's CPU time around warm verdicts, per verdict;
* ``growth``: the same three figures with 1 000, 5 000 and all the kube-system pods (read while building);
* ``idle_requests_per_min``: the three agents' and the gatekeeper's requests a minute over ``--idle-minutes``
  with nothing changing (the audit log: each request counted once, at its arrival), and by whom and what;
* ``agent_rss_mib`` (the largest of the three at the end of the idle minutes) and ``gatekeeper_rss_mib`` (its
  peak, VmHWM, after its drain);
* ``drain_ratio``: the gatekeeper's drain of the backlog (from the write that turns the verdict Ready until its
  ``pods_released`` counter has them all) against the same-run ceiling: a plain client sending the same
  PATCHes at the same concurrency (bench/gate_real_bench.py's). The old gatekeeper reads the whole kube-system
  between two batches; it drains ``--old-drain-pods`` (its rate is compared, pods/s).

Everything prints progress on stderr; ``--json`` prints one JSON object on stdout. The machine's load average
and the build times are in it. ``--quick`` shortens the idle minutes to one (the agents' 5-minute republish
may then fall outside the window: the per-minute rate is then an estimate of the watches and the gatekeeper's
resyncs). Scale flags (``--nodes``, ``--kube-system-pods``, ``--gated``) make a smaller run.

Run: ``.venv/bin/python bench/verdict_scale.py --json`` (about 30-40 minutes on 2 shared cores). Without built
binaries it says why in one line and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gate_bench import cpu_s, metric, real_pod, wait  # noqa: E402
from bench.gate_real_bench import Conn, creatable, each, wait_released  # noqa: E402
from patcher.adapters.kube.client import ClientSettings, build_api_client  # noqa: E402
from patcher.adapters.kube.cluster import collect  # noqa: E402
from patcher.adapters.kube.schedindex import SchedulerIndex  # noqa: E402
from patcher.adapters.kube.transport import JSON_PATCH, PODS, Api  # noqa: E402
from patcher.core.gates import DEFAULT_GATE, GatedPod, release_patch, slim  # noqa: E402
from patcher.core.readiness import ClusterVerdict  # noqa: E402
from patcher.services.gatekeeper import DEFAULT_BURST  # noqa: E402
from tests.harness.emu.kubeletsim import static_pod_annotations  # noqa: E402
from tests.harness.real.controlplane import (  # noqa: E402
    ControlPlane,
    built_releases,
    control_plane,
    listening_port,
    missing_reason,
    one_at_a_time,
    terminate,
)
from tests.harness.real.node_client import NodeClient  # noqa: E402
from tests.harness.real.simnodes import Agents, audit_events, audit_flags  # noqa: E402
from tests.harness.traffic import Traffic  # noqa: E402
from tests.real.test_real_install import apply_k  # noqa: E402

NS = "scheduler-patcher"
WORKLOAD = "workload"
CP_NODES = ("cp-1", "cp-2", "cp-3")
BARE = "bare-1"  #: no labels, and neither has its scheduler's mirror pod
AGENTS_OF_A_NODE = ("kube-proxy", "calico-node", "csi-node", "node-exporter")
MERGE = "application/merge-patch+json"
GOALS = {"verdict_bytes": 100_000, "verdict_requests": 10, "drain_ratio": 0.8, "rss_mib": 128,
         "idle_requests_per_min": 30}


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- the objects ----------------------------------------------------------------------------------------------

def worker_node(i: int) -> bytes:
    name = f"worker-{i:05d}"
    return json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "m6i.2xlarge", "topology.kubernetes.io/zone": f"zone-{i % 3}"}},
        "spec": {"podCIDR": f"10.{(i >> 8) % 256}.{i % 256}.0/24"}}).encode()


def node_agent_pod(i: int, node: str) -> tuple[str, bytes]:
    """A DaemonSet's pod as its controller creates it (bound to ``node``): ~5 KB sent, more stored."""
    agent = AGENTS_OF_A_NODE[i % len(AGENTS_OF_A_NODE)]
    name = f"{agent}-{i:05d}"
    prefix = agent.upper().replace("-", "_")
    env: list[dict[str, Any]] = [{"name": f"{prefix}_SETTING_{k}", "value": f"value-{k}-" + "x" * 40}
                                 for k in range(14)]
    env.append({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}})
    container = {
        "name": agent, "image": f"registry.example.com/system/{agent}:v1.31.2", "imagePullPolicy": "IfNotPresent",
        "args": ["--hostname-override=$(NODE_NAME)", "--v=2", "--metrics-bind-address=0.0.0.0:10249"], "env": env,
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": {"privileged": True},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 10256, "host": "127.0.0.1"}, "periodSeconds": 10},
        "volumeMounts": [{"name": "host-run", "mountPath": "/run"}, {"name": "lib-modules", "mountPath":
                         "/lib/modules", "readOnly": True}, {"name": "config", "mountPath": f"/etc/{agent}"}],
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": "kube-system", "generateName": f"{agent}-",
        "labels": {"k8s-app": agent, "controller-revision-hash": "6d9f8b7c5", "pod-template-generation": "3"},
        "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-20T10:00:00Z"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": agent,
                             "uid": f"00000000-0000-4000-8000-{AGENTS_OF_A_NODE.index(agent):012d}",
                             "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"nodeName": node, "containers": [container], "hostNetwork": True, "priorityClassName":
                 "system-node-critical", "serviceAccountName": agent, "dnsPolicy": "ClusterFirstWithHostNet",
                 "tolerations": [{"operator": "Exists"}],
                 "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                     "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                             "values": [node]}]}]}}},
                 "volumes": [{"name": "host-run", "hostPath": {"path": "/run", "type": "Directory"}},
                             {"name": "lib-modules", "hostPath": {"path": "/lib/modules", "type": ""}},
                             {"name": "config", "configMap": {"name": agent, "defaultMode": 420}}]}}
    return name, json.dumps(pod).encode()


def running_status(agent: str) -> bytes:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    conditions = [{"type": t, "status": "True", "lastTransitionTime": now}
                  for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")]
    return json.dumps({"status": {"phase": "Running", "conditions": conditions, "hostIP": "10.0.0.1",
                                  "hostIPs": [{"ip": "10.0.0.1"}], "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}],
                                  "startTime": now, "qosClass": "Burstable", "containerStatuses": [{
                                      "name": agent, "ready": True, "started": True, "restartCount": 0,
                                      "image": f"registry.example.com/system/{agent}:v1.31.2",
                                      "imageID": f"registry.example.com/system/{agent}@sha256:" + "ab" * 32,
                                      "containerID": "containerd://" + "cd" * 32,
                                      "state": {"running": {"startedAt": now}}}]}}).encode()


# -- the old read path ------------------------------------------------------------------------------------------

def old_package(ref: str, into: Path) -> Path:
    """The ``patcher`` package of ``ref`` (``git archive``), for the old agents and gatekeeper."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "patcher"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def old_collect(package_root: Path) -> Callable[..., ClusterVerdict]:
    """``collect`` of the old ``cluster.py``, on today's modules beside it (it calls nothing they changed)."""
    spec = importlib.util.spec_from_file_location("old_cluster", package_root / "patcher/adapters/kube/cluster.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn: Callable[..., ClusterVerdict] = module.collect
    return fn


# -- reads of one verdict -------------------------------------------------------------------------------------

def verdict_cost(cp: ControlPlane, api: Api, read: Callable[[], ClusterVerdict], repeat: int) -> dict[str, Any]:
    """One read to warm up, then ``repeat`` reads: requests, bytes (each) and kube-apiserver CPU s (per read)."""
    first = read()
    apiserver = psutil.Process(cp.procs[1].pid)
    traffic = Traffic(api)
    cpu = cpu_s(apiserver)
    t0 = time.perf_counter()
    for _ in range(repeat):
        assert read() == first
    wall = time.perf_counter() - t0
    return {"verdict_requests": traffic.requests / repeat, "verdict_bytes": traffic.received / repeat,
            "apiserver_cpu_s_per_verdict": round((cpu_s(apiserver) - cpu) / repeat, 4),
            "verdict_wall_s": round(wall / repeat, 4), "summary": first.summary()}


def growth_point(cp: ControlPlane, api: Api, index: SchedulerIndex, old: Callable[..., ClusterVerdict] | None,
                 pods: int) -> dict[str, Any]:
    assert wait_fresh(index)
    point: dict[str, Any] = {"kube_system_pods": pods,
                             "new": verdict_cost(cp, api, lambda: collect(api, index=index), 10)}
    if old is not None:
        point["old"] = verdict_cost(cp, api, lambda: old(api), 2 if pods > 5000 else 3)
    say(f"  verdict with {pods} kube-system pods: new {point['new']}; old {point.get('old')}")
    return point


def wait_fresh(index: SchedulerIndex) -> bool:
    return index.wait_fresh(120)


# -- the install ----------------------------------------------------------------------------------------------

def start_gatekeeper(cp: ControlPlane, tmp: Path, package_root: Path, tag: str) -> tuple[subprocess.Popen[bytes],
                                                                                          int]:
    """``scheduler-patcher gatekeeper`` as the Deployment runs it (its defaults: leader election, the Lease
    renewed every 5 s, a 5-minute resync) with its ServiceAccount's token."""
    kubeconfig = cp.token_kubeconfig(NS, "scheduler-patcher-gatekeeper", tmp / f"gatekeeper-{tag}.kubeconfig")
    log = tmp / f"gatekeeper-{tag}.log"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(package_root), "KUBECONFIG": str(kubeconfig),
           "POD_NAMESPACE": NS, "POD_NAME": f"gatekeeper-{tag}"}
    with log.open("wb") as out:
        # cwd: `python -m` imports from the working folder first, so the package_root's package runs
        proc = subprocess.Popen([sys.executable, "-m", "patcher", "gatekeeper", "--listen", "127.0.0.1:0",
                                 "--log-format", "json", "--log-level", "info"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, cwd=package_root)
    return proc, listening_port(proc, log)


def all_ready(agents: Agents) -> bool:
    return all(agents.annotations(n).get("state") == "Ready" for n in CP_NODES)


def bare_says(cp: ControlPlane, bare: NodeClient, ready: bool) -> None:
    """The unlabelled node's agent (the operator widened the DaemonSet's placement) as tests/component/test_readiness.py
    plays it: Ready copies cp-1's annotations and its scheduler pod's proof (marker, start); not Ready clears
    them (no agent there)."""
    if not ready:  # the scheduler as it was (a new mirror pod once it runs the patch again) and no agent
        bare.set_pod(bare_pod(cp.binaries.version))
        node = cp.ok("GET", f"/api/v1/nodes/{BARE}")
        gone = {k: None for k in (node["metadata"].get("annotations") or {}) if k.startswith("scheduler-patcher.io/")}
        if gone:
            cp.ok("PATCH", f"/api/v1/nodes/{BARE}", {"metadata": {"annotations": gone}}, MERGE)
        return
    ann = {k: v for k, v in (cp.ok("GET", "/api/v1/nodes/cp-1")["metadata"].get("annotations") or {}).items()
           if k.startswith("scheduler-patcher.io/")}
    # The annotations first: the gatekeeper watches no unlabelled Node; the new one sees the pod change next.
    cp.ok("PATCH", f"/api/v1/nodes/{BARE}", {"metadata": {"annotations": ann}}, MERGE)
    mirror = cp.ok("GET", "/api/v1/namespaces/kube-system/pods/kube-scheduler-cp-1")
    pod = {"metadata": {"name": f"kube-scheduler-{BARE}", "namespace": "kube-system", "labels": {},
                        "annotations": {k: v for k, v in (mirror["metadata"].get("annotations") or {}).items()
                                        if not k.startswith("kubernetes.io/config.seen")}},
           "spec": mirror["spec"], "status": {k: mirror["status"][k] for k in ("phase", "conditions",
                                                                               "containerStatuses")}}
    bare.set_pod(pod)


def bare_pod(version: str) -> dict[str, Any]:
    """The unlabelled node's scheduler before any patch: a mirror pod without labels."""
    return {"metadata": {"name": f"kube-scheduler-{BARE}", "namespace": "kube-system",
                         "annotations": static_pod_annotations({}, "0b5e1ec7ed0000000000000000000001")},
            "spec": {"containers": [{"name": "kube-scheduler", "image": f"registry.k8s.io/kube-scheduler:v{version}"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "kube-scheduler", "ready": True, "restartCount": 0,
                                              "state": {"running": {"startedAt": "2026-11-21T23:40:01Z"}}}]}}


def idle_requests(cp: ControlPlane, since: float, until: float) -> tuple[float, dict[str, int]]:
    """The project's ServiceAccounts' requests that arrived in [since, until): per minute, and by what."""
    seen: dict[str, str] = {}
    for event in audit_events(cp):
        at = datetime.datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp()
        if since <= at < until:
            ref = event.get("objectRef") or {}
            who = event["user"]["username"].rsplit(":", 1)[-1]
            seen[event["auditID"]] = f"{who} {event['verb']} {ref.get('resource', '')}"
    return len(seen) * 60 / (until - since), dict(Counter(seen.values()).most_common())


def rss_mib(proc: subprocess.Popen[bytes], peak: bool = False) -> float:
    if peak:
        return int(Path(f"/proc/{proc.pid}/status").read_text().split("VmHWM:")[1].split()[0]) / 1024
    return float(psutil.Process(proc.pid).memory_info().rss) / 2**20


def create_gated(conn: Conn, count: int, batch: str, workers: int) -> float:
    t0 = time.perf_counter()

    def create(i: int) -> None:
        pod = real_pod(i, batch)
        pod["metadata"]["namespace"] = WORKLOAD
        status, body = conn.send("POST", f"/api/v1/namespaces/{WORKLOAD}/pods", creatable(pod))
        assert status == 201, (status, body[:300])

    each(create, count, workers)
    return time.perf_counter() - t0


def batch_pods(cp: ControlPlane, batch: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    token = ""
    while True:
        page = cp.ok("GET", f"/api/v1/namespaces/{WORKLOAD}/pods?labelSelector=app.kubernetes.io%2Finstance%3D"
                     f"{batch}&limit=500" + (f"&continue={token}" if token else ""))
        out.extend(page["items"])
        token = page["metadata"].get("continue") or ""
        if not token:
            return out


def still_gated(cp: ControlPlane, batch: str) -> int:
    return sum(any(g.get("name") == DEFAULT_GATE for g in p["spec"].get("schedulingGates") or [])
               for p in batch_pods(cp, batch))


def ceiling(cp: ControlPlane, conn: Conn, count: int, workers: int) -> float:
    """Seconds the plain client takes to release ``count`` fresh gated pods at the gatekeeper's concurrency."""
    create_gated(conn, count, "ceiling", workers)
    todo: list[GatedPod] = sorted((slim(p) for p in batch_pods(cp, "ceiling")),
                                  key=lambda p: (p.created, p.namespace, p.name))

    def release(i: int) -> None:
        pod = todo[i]
        status, body = conn.send("PATCH", PODS.path(pod.namespace, pod.name),
                                 json.dumps(release_patch(pod, DEFAULT_GATE)).encode(), JSON_PATCH)
        assert status == 200, (status, body[:300])

    t0 = time.perf_counter()
    each(release, len(todo), DEFAULT_BURST)
    wall = time.perf_counter() - t0
    assert still_gated(cp, "ceiling") == 0
    # Released pods stay (bound to no node, gated no more): a collection delete of 10 000 pods outlasts the
    # server's own 60 s request timeout (504), and the gatekeepers that follow meet the same server either way.
    return wall


def install_run(cp: ControlPlane, agents: Agents, bare: NodeClient, conn: Conn, tmp: Path, args: argparse.Namespace,
                package_root: Path, tag: str, batch: str, pods: int) -> dict[str, Any]:
    """The agents and the gatekeeper of ``package_root``: idle minutes, RSS, then the drain of ``batch``."""
    out: dict[str, Any] = {}
    agents.package_root = package_root
    agents.kubeconfig = cp.token_kubeconfig(NS, "scheduler-patcher", tmp / f"agent-{tag}.kubeconfig")
    for sim in agents.sims.values():
        agents.start_agent(sim)
    keeper, port = start_gatekeeper(cp, tmp, package_root, tag)
    try:
        wait(lambda: all_ready(agents), 900, 1.0)
        wait(lambda: metric(port, "gated_pods") == pods, 900, 1.0)
        assert metric(port, "verdict_ready") == 0, "the unlabelled scheduler must keep the verdict NotReady"
        time.sleep(30)  # start-up over: every list done, every watch open
        since = time.time()
        say(f"  {tag}: idle for {args.idle_minutes} min (agents Ready, {pods} pods gated, verdict NotReady)")
        time.sleep(args.idle_minutes * 60)
        until = time.time()
        time.sleep(2)  # the audit log's last lines written
        out["idle_requests_per_min"], out["idle_requests_by"] = idle_requests(cp, since, until)
        out["agent_rss_mib"] = round(max(rss_mib(s.proc) for s in agents.sims.values() if s.proc), 1)
        out["gatekeeper_rss_mib_idle"] = round(rss_mib(keeper), 1)
        gk = psutil.Process(keeper.pid)
        gk_cpu = cpu_s(gk)
        said = time.perf_counter()
        bare_says(cp, bare, True)
        # From the first release on: the old gatekeeper watches no scheduler pod and learns of this one at its
        # next resync (up to 30 s); that wait is its reaction, said apart, not its drain.
        wait(lambda: metric(port, "pods_released_total") > 0, 120, 0.05)
        t0 = time.perf_counter()
        out["reaction_s"] = round(t0 - said, 2)
        wait_released(port, pods, 3600)
        out["drain_s"] = round(time.perf_counter() - t0, 2)
        out["drain_pods_per_s"] = round(pods / out["drain_s"], 1)
        out["gatekeeper_cpu_ms_per_pod"] = round((cpu_s(gk) - gk_cpu) * 1000 / pods, 3)
        out["gatekeeper_rss_mib"] = round(rss_mib(keeper, peak=True), 1)
        assert still_gated(cp, batch) == 0
    finally:
        terminate(keeper)
        for sim in agents.sims.values():  # SIGKILL: the patch stays (the next agents resume on it)
            if sim.proc is not None and sim.proc.poll() is None:
                sim.proc.kill()
                sim.proc.wait(10)
    bare_says(cp, bare, False)
    say(f"  {tag}: {out}")
    return out


# -- the run --------------------------------------------------------------------------------------------------

def build(cp: ControlPlane, conn: Conn, args: argparse.Namespace, api: Api, index: SchedulerIndex,
          old: Callable[..., ClusterVerdict] | None, out: dict[str, Any]) -> None:
    """Nodes, kube-system's node agents (verdicts read at the growth points on the way), the gated pods."""
    t0 = time.perf_counter()
    workers = args.nodes - len(CP_NODES) - 1
    each(lambda i: _ok(conn.send("POST", "/api/v1/nodes", worker_node(i))), workers, args.create_workers)
    out["build_nodes_s"] = round(time.perf_counter() - t0, 1)
    say(f"  {args.nodes} Nodes in {out['build_nodes_s']} s")
    for agent in AGENTS_OF_A_NODE:
        cp.ok("POST", "/api/v1/namespaces/kube-system/serviceaccounts", {"metadata": {"name": agent}})
    points = sorted({p for p in (1000, 5000, args.kube_system_pods) if p <= args.kube_system_pods})
    growth, done, t_pods = [], 0, 0.0
    for point in points:
        t1 = time.perf_counter()

        def create(i: int, first: int = done) -> None:
            k = first + i
            name, body = node_agent_pod(k, f"worker-{(k // len(AGENTS_OF_A_NODE)) % workers:05d}")
            _ok(conn.send("POST", "/api/v1/namespaces/kube-system/pods", body))
            _ok(conn.send("PATCH", f"/api/v1/namespaces/kube-system/pods/{name}/status",
                          running_status(AGENTS_OF_A_NODE[k % len(AGENTS_OF_A_NODE)]), MERGE))

        each(create, point - done, args.create_workers)
        t_pods += time.perf_counter() - t1
        done = point
        growth.append(growth_point(cp, api, index, old, point))
        out["growth"] = growth
        checkpoint(args, out)
    out["build_kube_system_pods_s"] = round(t_pods, 1)
    sample = cp.ok("GET", "/api/v1/namespaces/kube-system/pods/kube-proxy-00000")
    out["kube_system_pod_bytes"] = len(json.dumps(sample, separators=(",", ":")))
    out["growth"] = growth
    t2 = time.perf_counter()
    out["build_gated_s"] = round(create_gated(conn, args.gated, "gated-new", args.create_workers), 1)
    say(f"  {args.gated} gated pods in {out['build_gated_s']} s")
    out["build_s"] = round(time.perf_counter() - t0, 1)
    _ = t2


def checkpoint(args: argparse.Namespace, out: dict[str, Any]) -> None:
    if args.save is not None:
        args.save.write_text(json.dumps(out, indent=1, sort_keys=True, default=str))


def _ok(answer: tuple[int, bytes]) -> None:
    assert answer[0] in (200, 201), (answer[0], answer[1][:300])


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ap.add_argument("--quick", action="store_true", help="one idle minute instead of five")
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--kube-system-pods", type=int, default=20_000)
    ap.add_argument("--gated", type=int, default=10_000)
    ap.add_argument("--old-drain-pods", type=int, default=2000,
                    help="the old gatekeeper's backlog (it reads all of kube-system between two batches)")
    ap.add_argument("--idle-minutes", type=float, default=None)
    ap.add_argument("--old-ref", default="50c20db", help="the release whose read path is 'old'")
    ap.add_argument("--no-old", action="store_true", help="measure the new read path only")
    ap.add_argument("--create-workers", type=int, default=8)
    ap.add_argument("--no-lock", action="store_true",
                    help="do not take the real-cluster lock (the caller holds it: a real_cluster test)")
    ap.add_argument("--save", type=Path, default=None, help="also write the figures so far to this file after "
                    "each phase (a long run that fails late keeps what it measured)")
    args = ap.parse_args()
    args.idle_minutes = args.idle_minutes if args.idle_minutes is not None else (1.0 if args.quick else 5.0)
    if (why := missing_reason()) is not None:
        say(f"verdict_scale: skipped, {why}")
        if args.json:
            print(json.dumps({"skipped": why}))
        return 0
    binaries = built_releases()[0]
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "release": binaries.version,
                           "cores": os.cpu_count(), "load_at_start": round(os.getloadavg()[0], 2),
                           "nodes": args.nodes, "kube_system_pods": args.kube_system_pods, "gated": args.gated,
                           "idle_minutes": args.idle_minutes, "old_ref": None if args.no_old else args.old_ref,
                           "goals": GOALS}
    if not args.no_lock:
        say("taking the real-cluster lock (tests/harness/real/controlplane.one_at_a_time)")
    lock = contextlib.nullcontext() if args.no_lock else one_at_a_time()
    with lock, tempfile.TemporaryDirectory(prefix="verdict-scale-") as t:
        tmp = Path(t)
        old_root = None if args.no_old else old_package(args.old_ref, tmp / "old")
        old = None if old_root is None else old_collect(old_root)
        with control_plane(binaries, tmp / "cp", audit_flags(tmp / "cp" / "audit")) as cp:
            say(f"kube-apiserver v{binaries.version} ready in {cp.started_in:.1f}s")
            apply_k(cp, "base")
            apply_k(cp, "gatekeeper")
            cp.ensure_namespace(WORKLOAD)
            cp.ok("POST", f"/api/v1/namespaces/{WORKLOAD}/serviceaccounts", {"metadata": {"name": "app"}})
            agents = Agents(cp, tmp, NS, cp.token_kubeconfig(NS, "scheduler-patcher", tmp / "agent.kubeconfig"))
            for name in CP_NODES:
                agents.add_node(name)
            bare = NodeClient(cp, BARE).register()
            bare.set_pod(bare_pod(binaries.version))
            conn = Conn(cp)
            api = build_api_client(ClientSettings(kubeconfig=str(cp.kubeconfig), timeout=(10.0, 300.0)))
            index = SchedulerIndex(api)
            index.start()
            try:
                build(cp, conn, args, api, index, old, out)
                etcd, apiserver = (psutil.Process(p.pid) for p in cp.procs)
                out["etcd_rss_mib"] = round(etcd.memory_info().rss / 2**20, 1)
                out["apiserver_rss_mib"] = round(apiserver.memory_info().rss / 2**20, 1)
                final = out["growth"][-1]
                out["new"] = dict(final["new"])
                if "old" in final:
                    out["old"] = dict(final["old"])
                say(f"  verdict: {final['new']['summary']}")
                checkpoint(args, out)
            finally:
                index.stop()
                api.close()
            out["ceiling_s"] = round(ceiling(cp, conn, args.gated, args.create_workers), 2)
            out["ceiling_pods_per_s"] = round(args.gated / out["ceiling_s"], 1)
            try:
                new = install_run(cp, agents, bare, conn, tmp, args, ROOT, "new", "gated-new", args.gated)
                out["new"].update(new)
                out["new"]["drain_ratio"] = round(out["ceiling_s"] / new["drain_s"], 3)
                checkpoint(args, out)
                if old_root is not None:
                    create_gated(conn, args.old_drain_pods, "gated-old", args.create_workers)
                    old_run = install_run(cp, agents, bare, conn, tmp, args, old_root, "old", "gated-old",
                                          args.old_drain_pods)
                    out["old"].update(old_run)
                    out["old"]["drain_ratio"] = round(old_run["drain_pods_per_s"] / out["ceiling_pods_per_s"], 3)
                    checkpoint(args, out)
            finally:
                agents.kill_all()
    out["load_at_end"] = round(os.getloadavg()[0], 2)
    new_fig = out["new"]
    out["goals_met"] = {
        "verdict_bytes": new_fig["verdict_bytes"] <= GOALS["verdict_bytes"],
        "verdict_requests": new_fig["verdict_requests"] <= GOALS["verdict_requests"],
        "drain_ratio": new_fig.get("drain_ratio", 0) >= GOALS["drain_ratio"],
        "rss": max(new_fig.get("agent_rss_mib", 0), new_fig.get("gatekeeper_rss_mib", 0)) <= GOALS["rss_mib"],
        "idle_requests_per_min": new_fig.get("idle_requests_per_min", 1e9) <= GOALS["idle_requests_per_min"]}
    if args.json:
        print(json.dumps(out, sort_keys=True))
    else:
        print(json.dumps(out, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
