"""The gap, measured: how long pods wait to be scheduled while the chart's agents reconfigure every kube-scheduler
of three control-plane nodes, for three ways of rolling out, same run, same cluster.

The cluster is tests/harness/real/kubeadm_cluster.py's (the newest built release: three nodes made by the real
`kubeadm init` and `kubeadm join --control-plane`, stacked etcd, haproxy in front), the chart installed and
uninstalled with the real helm (tests/harness/real/kubeadm_chart.py: the agent's image imported into each node, the
sandbox's values). A *prober* runs in the first node's network for the whole run (this file with ``--probe``, the
official client as kubeadm's admin):

* every 250 ms it creates a pod that only needs binding: no node name, a toleration of kubeadm's control-plane
  taint, no service-account token, and a volume of a Secret that does not exist, so that the kubelet the pod is
  bound to never starts its sandbox (it waits for the volume) and the pod costs the machine nothing beyond the
  scheduler's work. A watch of those pods stamps the first event that shows ``spec.nodeName``; the pod is then
  deleted at once (grace 0). A pod's wait is that stamp minus the stamp at its create's response, both this
  machine's monotonic clock (one clock for every namespace here), not the server's ``creationTimestamp`` (whole
  seconds);
* a watch of ``kube-system/kube-scheduler``'s Lease stamps every change of ``holderIdentity`` (``<node>_<uuid>``:
  a restarted scheduler that takes the Lease again is a new holder) and of ``leaseTransitions``.

First the cluster's idle p99 wait (``--idle`` seconds of probing, nothing else happening); then, for each way, the
journeys: ``install`` (`helm install` until every Node says Ready and every scheduler runs with ``--config``),
``config`` (`helm upgrade` with the extender's weight changed, until every scheduler runs another ``--config`` and
every Node says Ready: the kubelet's ConfigMap sync, up to a minute, is in the window), ``agent_upgrade`` (`helm
upgrade` to another image of the same code, built and imported before the windows: the DaemonSet's rolling update
until every agent runs it Ready; every scheduler must keep its config) and ``uninstall`` (`helm
uninstall` as with its pre-delete hook, whose command ``stop-agents`` runs here from the first node's network, until
the agents are gone and every scheduler runs kubeadm's manifest again), each window followed by ``TAIL_S`` of
probing. The ways are the chart's values: ``leader_aware`` (the defaults), ``order_only``
(``PATCHER_LEADER_WAIT=0``, ``--leader-wait=0``'s env form: the rollout Lease, one node at a time, whoever leads) and
``all_at_once`` (``agent.rollout: independent``, every node patched at once: the peer's way). A journey's figures:
pods probed, the longest wait and ``max_wait_s``, the longest wait beyond the idle p99 (0 when none waited longer),
pods still unbound at the window's end (their wait so far counts), the Lease's holder changes (``leader_changes``)
and ``leaseTransitions`` moved. A way's ``max_wait_s`` and ``leader_changes`` are the largest and the sum over its
journeys.

Run: ``.venv/bin/python bench/rollout_gap.py --json`` (as root; ~20 min: the cluster ~1.5 min, each way's install,
config change, agent upgrade and uninstall 1-4 min each). Holds the real tests' machine-wide lock throughout.
Without kubeadm, containerd, haproxy or helm it says why in one line and exits 0 (1 under CI=true).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PROBE_NAMESPACE = "default"
PROBE_LABEL = "scheduler-patcher-bench"
PERIOD_S = 0.25
TAIL_S = 5.0
WAYS: dict[str, dict[str, Any]] = {
    "leader_aware": {},
    # the env form of --leader-wait: the chart's extraArgs check does not list that flag yet
    "order_only": {"extraEnv": [{"name": "PATCHER_LEADER_WAIT", "value": "0"}]},
    "all_at_once": {"agent": {"rollout": "independent"}},
}


def with_weight(values: dict[str, Any], weight: int) -> dict[str, Any]:
    """The values with every extender's weight set: a new scheduler config, the same extenders."""
    return {**values, "extenders": [{**e, "weight": weight} for e in values["extenders"]]}


def way_values(base: dict[str, Any], way: str) -> dict[str, Any]:
    """The sandbox's chart values with the way's: lists (extraEnv) joined, since helm replaces a list whole."""
    values = dict(base)
    for key, value in WAYS[way].items():
        values[key] = [*values.get(key, []), *value] if isinstance(value, list) else value
    return values


# -- the prober: runs in a node's network namespace, prints one JSON line per event --------------------------------

def probe_pod(name: str) -> dict[str, Any]:
    """A pod only a scheduler has work with: see the module's docstring."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": PROBE_LABEL}},
        "spec": {
            "automountServiceAccountToken": False,
            "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
                             "effect": "NoSchedule"}],
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "imagePullPolicy": "Never"}],
            "volumes": [{"name": "never", "secret": {"secretName": f"{PROBE_LABEL}-absent"}}],
        },
    }


def probe(kubeconfig: str) -> None:
    """Creates a pod every PERIOD_S, stamps each one's create response and first bound event, deletes it, and
    stamps the scheduler Lease's changes, until stdin closes."""
    import kubernetes

    # the package's types are partly stubbed; the prober uses it as a script would
    kube: Any = kubernetes
    client, watch = kube.client, kube.watch
    kube.config.load_kube_config(kubeconfig)
    out_lock = threading.Lock()

    def emit(**event: Any) -> None:
        with out_lock:
            sys.stdout.write(json.dumps(event) + "\n")
            sys.stdout.flush()

    stop = threading.Event()
    doomed: queue.Queue[str] = queue.Queue()

    def create() -> None:
        api = client.CoreV1Api(client.ApiClient())
        n, tick = 0, time.monotonic()
        while not stop.is_set():
            name = f"gap-{os.getpid()}-{n}"
            n += 1
            try:
                api.create_namespaced_pod(PROBE_NAMESPACE, probe_pod(name), _request_timeout=10)
                emit(kind="created", name=name, t=time.monotonic())
            except Exception as exc:  # an API server busy or restarting: the tick is lost, said so
                emit(kind="create_failed", name=name, t=time.monotonic(), error=str(exc)[:200])
            tick += PERIOD_S
            stop.wait(max(0.0, tick - time.monotonic()))

    def bound() -> None:
        api = client.CoreV1Api(client.ApiClient())
        seen: set[str] = set()
        version = ""
        while not stop.is_set():
            try:
                stream = watch.Watch().stream(api.list_namespaced_pod, PROBE_NAMESPACE,
                                              label_selector=f"app={PROBE_LABEL}", resource_version=version,
                                              timeout_seconds=60)
                for ev in stream:
                    pod = ev["object"]
                    version = pod.metadata.resource_version
                    name = pod.metadata.name
                    if pod.spec.node_name and name not in seen and ev["type"] != "DELETED":
                        seen.add(name)
                        emit(kind="bound", name=name, t=time.monotonic(), node=pod.spec.node_name)
                        doomed.put(name)
            except Exception as exc:  # expired resource version or a dropped connection: list again
                emit(kind="watch_restart", t=time.monotonic(), error=str(exc)[:200])
                version = ""

    def delete() -> None:
        api = client.CoreV1Api(client.ApiClient())
        while True:
            name = doomed.get()
            # already gone, or the server busy: the run's end deletes what is left
            with contextlib.suppress(Exception):
                api.delete_namespaced_pod(name, PROBE_NAMESPACE, grace_period_seconds=0, _request_timeout=10)

    def lease() -> None:
        api = client.CoordinationV1Api(client.ApiClient())
        last: tuple[str, int] | None = None
        while not stop.is_set():
            try:
                for ev in watch.Watch().stream(api.list_namespaced_lease, "kube-system",
                                               field_selector="metadata.name=kube-scheduler", timeout_seconds=60):
                    spec = ev["object"].spec
                    now = (spec.holder_identity or "", int(spec.lease_transitions or 0))
                    if now != last:
                        last = now
                        emit(kind="lease", t=time.monotonic(), holder=now[0], transitions=now[1])
            except Exception as exc:
                emit(kind="watch_restart", t=time.monotonic(), error=str(exc)[:200])
                time.sleep(0.5)

    for target in (create, bound, delete, lease):
        threading.Thread(target=target, daemon=True).start()
    sys.stdin.read()  # the parent closes it to stop the prober
    stop.set()
    # the pods still there (unbound ones above all) go with the run
    api = client.CoreV1Api(client.ApiClient())
    api.delete_collection_namespaced_pod(PROBE_NAMESPACE, label_selector=f"app={PROBE_LABEL}",
                                         grace_period_seconds=0)


# -- the parent: reads the prober's lines, and turns windows of them into figures ---------------------------------

@dataclass
class Prober:
    """The prober's process in a node and what it said so far."""

    proc: subprocess.Popen[bytes] | None = None
    created: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    failed: list[float] = field(default_factory=list)
    lease: list[tuple[float, str, int]] = field(default_factory=list)
    restarts: list[tuple[float, str]] = field(default_factory=list)

    @classmethod
    def start(cls, inside: Callable[[list[str]], list[str]]) -> Prober:
        """The prober run with `inside` (a node's namespaces around an argv), its lines read in a thread."""
        argv = inside([sys.executable, str(Path(__file__).resolve()), "--probe", "/etc/kubernetes/admin.conf"])
        prober = cls(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT))
        threading.Thread(target=prober._read, daemon=True).start()
        return prober

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.record(json.loads(line))

    def record(self, ev: dict[str, Any]) -> None:
        """One line of the prober's."""
        if ev["kind"] == "created":
            self.created[ev["name"]] = ev["t"]
        elif ev["kind"] == "bound":
            self.bound[ev["name"]] = ev["t"]
        elif ev["kind"] == "create_failed":
            self.failed.append(ev["t"])
        elif ev["kind"] == "lease":
            self.lease.append((ev["t"], ev["holder"], ev["transitions"]))
        else:
            self.restarts.append((ev["t"], ev.get("error", "")))

    def waits(self, since: float, until: float) -> tuple[list[float], int]:
        """(the waits of the pods created in [since, until), counting an unbound one's wait until `until`; how
        many were still unbound at `until`)."""
        waits, unbound = [], 0
        for name, created in list(self.created.items()):
            if since <= created < until:
                done = self.bound.get(name)
                unbound += done is None or done > until
                waits.append(max(0.0, (until if done is None else done) - created))
        return waits, unbound

    def leader_changes(self, since: float, until: float) -> tuple[int, int]:
        """(holder changes in [since, until): a new non-empty holderIdentity other than the last one before it;
        how far leaseTransitions moved)."""
        before = [e for e in self.lease if e[0] < since]
        holder = next((h for _, h, _ in reversed(before) if h), "")
        start_transitions = before[-1][2] if before else None
        changes, last_transitions = 0, start_transitions
        for stamp, who, transitions in self.lease:
            if since <= stamp < until:
                if who and who != holder:
                    changes += 1 if holder else 0
                    holder = who
                if start_transitions is None:
                    start_transitions = transitions
                last_transitions = transitions
        moved = (last_transitions or 0) - (start_transitions or 0)
        return changes, moved

    def stop(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))] if ordered else 0.0


def figures(prober: Prober, since: float, until: float, idle_p99: float) -> dict[str, Any]:
    waits, unbound = prober.waits(since, until)
    changes, transitions = prober.leader_changes(since, until)
    longest = max(waits, default=0.0)
    return {"max_wait_s": round(max(0.0, longest - idle_p99), 2), "longest_wait_s": round(longest, 2),
            "p99_wait_s": round(percentile(waits, 0.99), 2), "pods": len(waits), "unbound": unbound,
            "create_failures": sum(since <= t < until for t in prober.failed),
            "leader_changes": changes, "lease_transitions": transitions, "seconds": round(until - since, 1)}


# -- the journeys --------------------------------------------------------------------------------------------------

def run(ways: list[str], idle_s: float, progress: Callable[[str], None]) -> dict[str, Any]:
    from tests.harness.real.controlplane import one_at_a_time, wait_until
    from tests.harness.real.helmtool import CHART, NAMESPACE, RELEASE, find_helm
    from tests.harness.real.kubeadm_chart import (
        agent_image_on,
        agents,
        chart_values,
        helm_in,
        lease_holder,
        next_agent_image_on,
        scheduler_config,
        settled_nodes,
        states,
        uninstall,
    )
    from tests.harness.real.kubeadm_cluster import kubeadm_cluster
    from tests.harness.real.kubeadm_node import MANIFESTS, releases_with_kubeadm

    helm, _ = find_helm()
    assert helm is not None
    result: dict[str, Any] = {"ways": {}}
    started = time.monotonic()
    with one_at_a_time(), tempfile.TemporaryDirectory(prefix="rollout-gap-") as tmp:
        binaries = releases_with_kubeadm()[0]
        with kubeadm_cluster(binaries, Path(tmp) / "ha", 3) as cluster:
            result["release"] = binaries.version
            progress(cluster.timings())
            names = [n.name for n in cluster.nodes]
            wait_until(lambda: settled_nodes(cluster), 300, "three Ready control-plane Nodes")
            manifests = {n.name: n.host(f"{MANIFESTS}/kube-scheduler.yaml") for n in cluster.nodes}
            written = {name: path.read_bytes() for name, path in manifests.items()}

            def settled() -> bool:
                return (all((scheduler_config(n) or ("", ["?"]))[1] == [] for n in cluster.nodes)
                        and lease_holder(cluster.first, "kube-scheduler") in names)
            wait_until(settled, 300, "every kube-scheduler running kubeadm's manifest, one leading")
            repository, tag = agent_image_on(cluster)
            new_tag = next_agent_image_on(cluster, repository, tag)  # built and imported before any window
            prober = Prober.start(lambda argv: cluster.first.inside(argv, pid_namespace=False))
            try:
                wait_until(lambda: len(prober.bound) >= 4, 120, "the prober's first pods bound")
                idle_from = time.monotonic()
                time.sleep(idle_s)
                idle_to = time.monotonic()
                idle, _ = prober.waits(idle_from, idle_to)
                idle_p99 = percentile(idle, 0.99)
                result["idle_p99_s"] = round(idle_p99, 3)
                result["idle"] = figures(prober, idle_from, idle_to, idle_p99)
                progress(f"idle: {result['idle']}")
                for way in ways:
                    values = Path(tmp) / f"{way}.json"
                    values.write_text(json.dumps(way_values(chart_values(repository, tag), way)))
                    journeys: dict[str, Any] = {}

                    since = time.monotonic()
                    proc = helm_in(cluster.first, helm, "install", RELEASE, str(CHART), f"--namespace={NAMESPACE}",
                                   "--create-namespace", f"--values={values}")
                    assert proc.returncode == 0, proc.stderr

                    def all_ready() -> bool:
                        now = states(cluster)
                        assert not [s for s in now.values() if s in ("Failed", "RolledBack")], now
                        return set(now.values()) == {"Ready"} and all(
                            len((scheduler_config(n) or ("", []))[1]) == 1 for n in cluster.nodes)
                    wait_until(all_ready, 900, f"every node Ready ({way})")
                    until = time.monotonic() + TAIL_S
                    time.sleep(TAIL_S)
                    journeys["install"] = figures(prober, since, until, idle_p99)
                    progress(f"{way} install: {journeys['install']}")

                    # config: the extender's weight changed by `helm upgrade`; the kubelet brings the ConfigMap's
                    # new files into each agent's mount (its sync period: up to a minute), each agent patches again
                    configs = {n.name: (scheduler_config(n) or ("", []))[1] for n in cluster.nodes}
                    changed = Path(tmp) / f"{way}-config.json"
                    changed.write_text(json.dumps(with_weight(way_values(chart_values(repository, tag), way), 2)))
                    since = time.monotonic()
                    proc = helm_in(cluster.first, helm, "upgrade", RELEASE, str(CHART), f"--namespace={NAMESPACE}",
                                   f"--values={changed}")
                    assert proc.returncode == 0, proc.stderr

                    def reconfigured(before: dict[str, list[str]] = configs) -> bool:
                        now = {n.name: (scheduler_config(n) or ("", []))[1] for n in cluster.nodes}
                        return all(len(now[n]) == 1 and now[n] != before[n] for n in now) and all_ready()
                    wait_until(reconfigured, 900, f"every scheduler on the new config ({way})")
                    until = time.monotonic() + TAIL_S
                    time.sleep(TAIL_S)
                    journeys["config"] = figures(prober, since, until, idle_p99)
                    progress(f"{way} config: {journeys['config']}")

                    # agent upgrade: `helm upgrade` to another image of the same code (the config as it is now):
                    # the DaemonSet's rolling update replaces every agent, and no scheduler should restart
                    upgraded = Path(tmp) / f"{way}-upgrade.json"
                    upgraded.write_text(json.dumps(with_weight(way_values(chart_values(repository, new_tag), way), 2)))
                    configs = {n.name: (scheduler_config(n) or ("", []))[1] for n in cluster.nodes}
                    since = time.monotonic()
                    proc = helm_in(cluster.first, helm, "upgrade", RELEASE, str(CHART), f"--namespace={NAMESPACE}",
                                   f"--values={upgraded}")
                    assert proc.returncode == 0, proc.stderr

                    def replaced(image: str = f"{repository}:{new_tag}") -> bool:
                        pods = agents(cluster.first)
                        return (len(pods) == len(names) and all(
                            not p["metadata"].get("deletionTimestamp")
                            and p["spec"]["containers"][0]["image"] == image
                            and any(c["type"] == "Ready" and c["status"] == "True"
                                    for c in (p.get("status") or {}).get("conditions") or [])
                            for p in pods) and all_ready())
                    wait_until(replaced, 900, f"every agent on the new image, Ready ({way})")
                    assert {n.name: (scheduler_config(n) or ("", []))[1] for n in cluster.nodes} == configs
                    until = time.monotonic() + TAIL_S
                    time.sleep(TAIL_S)
                    journeys["agent_upgrade"] = figures(prober, since, until, idle_p99)
                    progress(f"{way} agent upgrade: {journeys['agent_upgrade']}")

                    since = time.monotonic()
                    uninstall(cluster.first, helm)  # with the chart's pre-delete hook (off in chart_values)

                    def restored() -> bool:
                        return (not agents(cluster.first)
                                and all(manifests[n].read_bytes() == written[n] for n in written)
                                and settled())
                    wait_until(restored, 600, f"kubeadm's manifests back, agents gone ({way})")
                    until = time.monotonic() + TAIL_S
                    time.sleep(TAIL_S)
                    journeys["uninstall"] = figures(prober, since, until, idle_p99)
                    progress(f"{way} uninstall: {journeys['uninstall']}")
                    result["ways"][way] = {
                        "max_wait_s": max(j["max_wait_s"] for j in journeys.values()),
                        "leader_changes": sum(j["leader_changes"] for j in journeys.values()),
                        "journeys": journeys}
                result["probe_watch_restarts"] = len(prober.restarts)
            finally:
                prober.stop()
    result["bench_s"] = round(time.monotonic() - started, 1)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object (the figures) on stdout")
    parser.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated, of {', '.join(WAYS)}")
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of idle probing for the idle p99")
    parser.add_argument("--probe", metavar="KUBECONFIG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        probe(args.probe)
        return 0
    from tests.harness.real.helmtool import find_helm
    from tests.harness.real.kubeadm_cluster import cluster_missing

    why = cluster_missing()
    if why is None:
        helm, helm_why = find_helm()
        why = helm_why if helm is None else None
    if why is not None:
        print(f"rollout_gap: skipped: {why}", file=sys.stderr)
        return 1 if os.environ.get("CI") == "true" else 0
    ways = [w for w in args.ways.split(",") if w]
    unknown = [w for w in ways if w not in WAYS]
    if unknown:
        parser.error(f"unknown ways {unknown}; known: {list(WAYS)}")
    result = run(ways, args.idle, partial(print, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(result))
    else:
        for way, got in result["ways"].items():
            print(f"{way}: max wait beyond idle p99 {got['max_wait_s']} s, leader changes {got['leader_changes']}")
        print(f"idle p99 {result['idle_p99_s']} s; bench {result['bench_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
