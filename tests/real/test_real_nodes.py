"""The node story on real objects: three Nodes, their mirror pods and three agents on kube-apiserver.

tests/e2e/test_lifecycle.py and test_agent_upgrade.py tell this story against the emulator; here every object is
the real server's: Nodes registered by their kubelets (client certificates of `system:node:<name>`, so the Node
authorizer and NodeRestriction judge them), mirror pods created, deleted and given a status by those nodes as the
kubelet does, the manifests' namespace, ServiceAccount, RBAC, ConfigMap and DaemonSet applied with `kubectl apply
-k`, each agent a pod of that DaemonSet running with a TokenRequest token of its ServiceAccount, and the
gatekeeper with its own. Real watches with real resourceVersions, and a kube-apiserver restart after an etcd
compaction, which sends every resumed watch a 410.

The audit log of the API server records every request of the two ServiceAccounts: none may be refused, and every
verb of every rule the manifests grant must have been used (tests/real/test_real_rbac.py removes each rule in turn and
shows what then fails).
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.test_deploy_manifests import objects
from tests.harness.real.controlplane import (
    ROOT,
    ControlPlane,
    built_releases,
    control_plane,
    listening_port,
    missing_reason,
    wait_until,
)
from tests.harness.real.simnodes import DS, Agents, Timeline, audit_events, audit_flags, describe, unused_grants
from tests.real.test_real_install import apply_k

pytestmark = pytest.mark.real_cluster

NS = "scheduler-patcher"
NODES = ("cp-1", "cp-2", "cp-3")
GATE = "scheduler-patcher.io/extender-ready"
APPS = "apps"  # where the gated workload pod lives


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    """A control plane of its own, newest release, with an audit log of the ServiceAccounts' requests."""
    if (why := missing_reason()) is not None:
        pytest.skip(why)
    binaries = built_releases()[0]
    with control_plane(binaries, tmp_path / "cp", audit_flags(tmp_path / "cp" / "audit")) as cp:
        yield cp


def gatekeeper(cp: ControlPlane, tmp: Path, namespace: str = NS, gate: str = GATE,
               name: str = "gatekeeper", *flags: str) -> tuple[subprocess.Popen[bytes], Path]:
    """`scheduler-patcher gatekeeper` with a token of the gatekeeper's own ServiceAccount in `namespace` (its
    leader Lease there too), releasing `gate`, with `flags` added. It binds a port of its own choosing
    (`listening_port` reads it): a port picked here would be free for anyone until the child binds it (see
    `free_port`)."""
    kubeconfig = cp.token_kubeconfig(namespace, "scheduler-patcher-gatekeeper", tmp / f"{name}.kubeconfig")
    log = tmp / f"{name}.log"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "KUBECONFIG": str(kubeconfig),
           "POD_NAMESPACE": namespace, "POD_NAME": f"{name}-0"}
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "patcher", "gatekeeper", "--listen", "127.0.0.1:0",
                                 "--log-format", "json", "--resync-interval", "5s", "--gate-name", gate, *flags],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    return proc, log


HOLD = "example.com/hold"
#: Refuses every change of a pod labelled `HOLD` with 422 Invalid, what the gatekeeper also meets when a pod
#: changed under its release patch (the `test` op fails): it then reads the pod again (its `pods get`).
HOLD_POLICY = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
               "metadata": {"name": "hold"},
               "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [{
                   "apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}]},
                        "validations": [{"expression": f"!has(object.metadata.labels) || "
                                                       f"!('{HOLD}' in object.metadata.labels)",
                                         "reason": "Invalid", "message": "held"}]}}
HOLD_BINDING = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": "hold"}, "spec": {"policyName": "hold", "validationActions": ["Deny"]}}


def hold_policy(cp: ControlPlane) -> None:
    cp.ok("POST", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies", HOLD_POLICY)
    cp.ok("POST", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings", HOLD_BINDING)


def gated_pod(cp: ControlPlane, name: str, gate: str = GATE, held: bool = False) -> None:
    cp.ok("POST", f"/api/v1/namespaces/{APPS}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {HOLD: "yes"} if held else {}},
        "spec": {"schedulingGates": [{"name": gate}], "containers": [{"name": "c", "image": "busybox"}]}})


def release_hold(cp: ControlPlane, name: str) -> None:
    cp.ok("PATCH", f"/api/v1/namespaces/{APPS}/pods/{name}",
          [{"op": "remove", "path": "/metadata/labels/" + HOLD.replace("/", "~1")}], "application/json-patch+json")


def gated_pods(cp: ControlPlane) -> None:
    """`workload`, and `held`, whose release the admission policy refuses until its label is taken off."""
    cp.ensure_namespace(APPS)
    hold_policy(cp)
    gated_pod(cp, "workload")
    gated_pod(cp, "held", held=True)


def gates(cp: ControlPlane, pod: str = "workload") -> list[str]:
    out = cp.ok("GET", f"/api/v1/namespaces/{APPS}/pods/{pod}")
    return [g["name"] for g in out["spec"].get("schedulingGates") or []]


def reads_of_held(cp: ControlPlane) -> int:
    """The gatekeeper's GETs of the held pod after a refused release (the audit log)."""
    return sum(1 for e in audit_events(cp) if e["verb"] == "get" and e["stage"] == "ResponseComplete"
               and (e.get("objectRef") or {}).get("name") == "held"
               and e["user"]["username"].endswith(":scheduler-patcher-gatekeeper"))


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_the_node_story_on_the_real_server(plane: ControlPlane, tmp_path: Path) -> None:
    cp = plane
    apply_k(cp, "base")
    apply_k(cp, "gatekeeper")
    agents = Agents(cp, tmp_path, NS, cp.token_kubeconfig(NS, "scheduler-patcher", tmp_path / "agent.kubeconfig"))
    tl = Timeline(cp, list(NODES)).start()
    keeper: subprocess.Popen[bytes] | None = None
    try:
        for name in NODES:
            agents.add_node(name)
        for sim in agents.sims.values():
            agents.start_agent(sim)
        gated_pods(cp)
        keeper, keeper_log = gatekeeper(cp, tmp_path)
        keeper_port = listening_port(keeper, keeper_log)
        story(cp, agents, tl, keeper, keeper_log, keeper_port)
    finally:
        print(tl.text())
        for sim in agents.sims.values():  # the agents' own words, for a failure
            print(f"--- {sim.pod}", *sim.log.splitlines()[-12:], sep="\n")
        tl.stop()
        agents.kill_all()
        if keeper is not None and keeper.poll() is None:
            keeper.kill()
            keeper.wait(10)


def story(cp: ControlPlane, agents: Agents, tl: Timeline, keeper: subprocess.Popen[bytes], keeper_log: Path,
          keeper_port: int) -> None:
    """Install, the verdict, an etcd compaction and an API server restart, a config change, a refused config, a
    stop that keeps the patch, the uninstall; then the audit log."""
    sims = agents.sims
    tl.mark("install")
    wait_until(lambda: tl.all("Ready") and tl.one_config(), 90, "every node Ready on one config")
    assert tl.overlaps(0) == [], tl.text()
    first = tl.one_config()
    assert first
    ann = agents.annotations("cp-1")
    assert {"state", "config-hash", "source-hash"} <= set(ann), ann
    for sim in sims.values():
        assert b"--config=" in sim.manifest.read_bytes()
        assert sim.real.errors == [] and sim.kubelet.stray_files == []
    wait_until(lambda: agents.configmap_data("scheduler-patcher-status").get("ready") == "true", 30,
               "the verdict Ready in the status ConfigMap")
    wait_until(lambda: gates(cp) == [], 60, "the gatekeeper releasing the workload's gate")
    assert metric(keeper_port, "scheduler_patcher_gatekeeper_pods_released_total") == 1
    wait_until(lambda: reads_of_held(cp) > 0, 60, "the gatekeeper reading the held pod again after a 422")
    assert gates(cp, "held") == [GATE]
    release_hold(cp, "held")
    wait_until(lambda: gates(cp, "held") == [], 60, "the held pod released once the policy lets it")
    reasons = {(e["involvedObject"]["name"], e["reason"]) for e in agents.events()}
    for name in NODES:
        assert {(name, "SchedulerPatched"), (name, "SchedulerRestarted")} <= reasons, sorted(reasons)
    lease = cp.ok("GET", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/scheduler-patcher-rollout")
    assert not lease["spec"].get("holderIdentity"), lease  # every turn given back


    assert keeper.poll() is None

    tl.mark("etcd compaction")
    old_rv = cp.ok("GET", "/api/v1/nodes")["metadata"]["resourceVersion"]
    cp.ok("PATCH", "/api/v1/nodes/cp-1", {"metadata": {"labels": {"example.com/touched": "yes"}}},
          "application/merge-patch+json")  # one change after old_rv, compacted away in etcd below
    cp.compact()
    # The watch cache still holds the history: compaction alone sends no resumed watch a 410 ...
    assert [e["type"] for e in watch_from(cp, old_rv)][:1] == ["MODIFIED"]
    tl.mark("kube-apiserver restart")
    lists_before = mirror_pod_lists(cp)
    restart = (time.time(), 0.0)
    cp.restart_apiserver()
    restart = (restart[0], time.time())
    # ... a restarted server's cache starts at etcd's revision: resuming from before the compaction is a 410.
    first_event = watch_from(cp, old_rv)[0]
    assert first_event["type"] == "ERROR" and first_event["object"]["code"] == 410, first_event
    # Every agent's mirror-pod watch resumed, met the 410 and listed again.
    wait_until(lambda: len(mirror_pod_lists(cp)) >= len(lists_before) + 3, 60, "every agent listing again")

    since = tl.mark("ConfigMap update")
    restarts = {n: len(s.kubelet.restarts) for n, s in sims.items()}
    for sim in sims.values():
        sim.configmap(5)
    wait_until(lambda: tl.all("Ready") and tl.one_config() not in (None, first), 90, "the new config everywhere")
    assert tl.overlaps(since) == [], tl.text()
    assert all(len(s.kubelet.restarts) == restarts[n] + 1 for n, s in sims.items())  # one restart a node
    live = tl.one_config()

    since = tl.mark("rejected config")
    restarts = {n: len(s.kubelet.restarts) for n, s in sims.items()}
    for sim in sims.values():
        sim.configmap(1, verb="reject-me")
    wait_until(lambda: any(tl.last[n][0] == "RolledBack" for n in NODES), 90, "a rollback")
    rolled = [n for n in NODES if tl.last[n][0] == "RolledBack"]

    def skipped() -> set[str]:
        return {e["involvedObject"]["name"] for e in agents.events() if e["reason"] == "PatchSkipped"}

    wait_until(lambda: skipped() == set(NODES) - set(rolled), 60, "the other nodes skipping the refused config")
    assert len(rolled) == 1, tl.text()
    back = sims[rolled[0]].kubelet  # the kubelet may record the rollback's start after the agent says RolledBack
    wait_until(lambda: len(back.restarts) >= restarts[rolled[0]] + 2, 20, "the rollback's restart")
    for name, sim in sims.items():
        if name in rolled:
            assert len(sim.kubelet.restarts) == restarts[name] + 2  # the refused config, then the rollback
            assert sim.kubelet.restarts[-2].crashed and not sim.kubelet.restarts[-1].crashed
        else:
            assert len(sim.kubelet.restarts) == restarts[name]  # never wrote the refused config
            assert tl.last[name] == ("Ready", live[:12] if live else "")
    gate_keeper_ok = keeper.poll() is None
    assert gate_keeper_ok

    since = tl.mark("SIGTERM, DaemonSet present")
    stopped = next(n for n in NODES if n not in rolled)  # Ready: its successor must find it so
    sim = sims[stopped]
    manifest = sim.manifest.read_bytes()
    count = len(sim.kubelet.restarts)
    log = agents.stop_agent(sim, delete_pod=True)
    assert "keeping the patch: DaemonSet scheduler-patcher still selects this node" in log, log
    assert sim.manifest.read_bytes() == manifest and len(sim.kubelet.restarts) == count
    agents.start_agent(sim)  # its successor adopts the patch: no write, no restart
    wait_until(lambda: "a stop keeps the patch" in sim.log and tl.last[stopped][0] == "Ready", 60,
               "the successor knowing its DaemonSet")
    assert len(sim.kubelet.restarts) == count

    since = tl.mark("DaemonSet deleted")
    cp.ok("DELETE", f"/apis/apps/v1/namespaces/{NS}/daemonsets/{DS}")
    wait_until(lambda: all("a stop restores: DaemonSet scheduler-patcher is gone" in s.log for s in sims.values()),
               60, "every agent seeing its DaemonSet gone")
    for sim in sims.values():  # the garbage collector would delete the pods: SIGTERM to all at once
        assert sim.proc is not None
        sim.proc.send_signal(signal.SIGTERM)
    for sim in sims.values():
        assert sim.proc is not None
        assert sim.proc.wait(60) == 0, sim.log
    wait_until(lambda: tl.all("Restored"), 30, "every node Restored")
    for sim in sims.values():
        assert sim.manifest.read_bytes() == sim.original, sim.name
    restores = sorted(sim.kubelet.restarts[-1].at_ns for sim in sims.values())
    assert all(b - a > 200_000_000 for a, b in itertools.pairwise(restores)), restores  # one at a time
    assert {n for n in NODES if "SchedulerRestored" in {e["reason"] for e in agents.events()
                                                         if e["involvedObject"]["name"] == n}} == set(NODES)
    keeper.send_signal(signal.SIGTERM)
    assert keeper.wait(30) == 0, keeper_log.read_text()

    events = audit_events(cp)
    # Least privilege that is enough: no request refused, but in the moment a restarting kube-apiserver listens
    # before its RBAC caches synced (it then denies everyone; the retries heal it: see backoff.DENIED_QUICK_RETRIES).
    outside = [describe(e) for e in events if e.get("responseStatus", {}).get("code") == 403
               and not restart[0] <= received(e) <= restart[1]]
    assert outside == [], "\n".join(outside)
    for sim in sims.values():
        assert sim.real.errors == []  # nor one of the kubelet's requests
    # And nothing more than needed: every verb of every rule was used by some request of the story.
    unused = unused_grants(objects("base") + objects("gatekeeper"), events)
    assert unused == [], "\n".join(unused)


def received(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp()


def watch_from(cp: ControlPlane, rv: str) -> list[dict[str, Any]]:
    """The events of a watch on Nodes from `rv` (the stream ends after 1 s)."""
    req = urllib.request.Request(f"{cp.url}/api/v1/nodes?watch=1&resourceVersion={rv}&timeoutSeconds=1")
    with urllib.request.urlopen(req, context=cp.ssl_context(), timeout=30) as resp:
        return [json.loads(line) for line in resp.read().splitlines() if line.strip()]


def mirror_pod_lists(cp: ControlPlane) -> list[str]:
    """The agents' lists of their mirror pod, as the audit log recorded them."""
    return [describe(e) + e["requestReceivedTimestamp"] for e in audit_events(cp)
            if e["verb"] == "list" and (e.get("objectRef") or {}).get("namespace") == "kube-system"
            and e["user"]["username"] == f"system:serviceaccount:{NS}:scheduler-patcher"
            and e["stage"] == "ResponseComplete"]
