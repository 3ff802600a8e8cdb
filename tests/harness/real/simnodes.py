"""Control-plane nodes on the real API server: a kubelet stand-in and a real agent process per node.

The harness of tests/real/test_real_nodes.py and tests/real/test_real_rbac.py. Each `NodeSim` is a node's host-root
folder (the kubeadm manifest), its kubelet (tests/harness/emu/kubeletsim.py deciding restarts,
tests/harness/real/node_client.py publishing the mirror pod as the node) and its `scheduler-patcher run` process,
started as a pod of the agents' real DaemonSet object (the pod created as the DaemonSet controller would, with the
ownerReference; there is no kube-controller-manager) and authenticated with a TokenRequest token of the ServiceAccount
the manifests create, so the manifests' RBAC is what authorizes it. The API server writes an audit log of every request
of the project's ServiceAccounts: which were refused (403), and which rule let each one through.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patcher.adapters.kube.client import ClientSettings, build_api_client
from patcher.adapters.kube.listwatch import ListWatcher
from patcher.adapters.kube.transport import NODES, Api
from tests.conftest import FIXTURES, write_configmap
from tests.harness.emu.kubeletsim import SimKubelet
from tests.harness.helpers import MANIFEST, P
from tests.harness.real.controlplane import ROOT, ControlPlane
from tests.harness.real.node_client import NodeClient

Obj = dict[str, Any]
DS = "scheduler-patcher"
AUDITED_GROUP = "system:serviceaccounts"
#: Metadata of every request made by a ServiceAccount (the agents', the gatekeeper's), nothing else.
AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  userGroups: ["{AUDITED_GROUP}"]
- level: None
"""
#: An extender on a closed port, ignorable: with the pre-flight off (--check-extenders=false) nothing calls it;
#: a `weight` change is a new config to roll out, `reject-me` a config the scheduler refuses (kubeletsim).
SOURCE = "extenders:\n- urlPrefix: http://127.0.0.1:9\n  filterVerb: {verb}\n  weight: {weight}\n  ignorable: true\n"


def audit_flags(folder: Path) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    policy = folder / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    return [f"--audit-policy-file={policy}", f"--audit-log-path={folder / 'audit.log'}", "--audit-log-format=json",
            "--audit-log-mode=blocking", "--audit-log-maxsize=0"]


def audit_events(cp: ControlPlane, contains: str = "") -> list[Obj]:
    """Every completed request the audit policy kept (watches: when they ended, or as they started); with
    `contains`, only the lines holding that text (decoding every line of a long log is most of a poll's time)."""
    path = cp.workdir / "audit" / "audit.log"
    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        if contains not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line being written
        if event.get("stage") in ("ResponseComplete", "ResponseStarted", "Panic"):
            out.append(event)
    return out


def describe(event: Obj) -> str:
    ref = event.get("objectRef") or {}
    resource = "/".join(x for x in (ref.get("resource"), ref.get("subresource")) if x)
    group = ref.get("apiGroup", "")
    where = f" in {ref['namespace']}" if ref.get("namespace") else ""
    name = f" {ref['name']}" if ref.get("name") else ""
    return f"{event['user']['username']}: {event['verb']} {group + '/' if group else ''}{resource}{name}{where}"


@dataclass
class NodeSim:
    name: str
    root: Path
    src: Path
    original: bytes
    real: NodeClient
    kubelet: SimKubelet
    proc: subprocess.Popen[bytes] | None = None
    logs: list[Path] = field(default_factory=list)
    pods: int = 0

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST

    @property
    def pod(self) -> str:
        return f"{DS}-{self.name}-{self.pods}"

    @property
    def log(self) -> str:
        return self.logs[-1].read_text(errors="replace") if self.logs else ""

    def configmap(self, weight: int, verb: str = "filter") -> None:
        """A ConfigMap update as the kubelet shows it to the agent's volume."""
        write_configmap(self.src, {"extenders.yaml": SOURCE.format(verb=verb, weight=weight)})


@dataclass
class Agents:
    """The nodes and their agents in one namespace of `cp`, each agent with `kubeconfig`'s credentials."""

    cp: ControlPlane
    tmp: Path
    namespace: str
    kubeconfig: Path
    sims: dict[str, NodeSim] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    #: Where the agents' `patcher` package is imported from (bench/verdict_scale.py runs an older release's).
    package_root: Path = ROOT

    def add_node(self, name: str, *, control_plane: bool = True) -> NodeSim:
        """Register the node as its kubelet does, label it as kubeadm does, and start its kubelet."""
        real = NodeClient(self.cp, name).register()
        if control_plane:
            real.mark_control_plane()
        root = self.tmp / name
        (root / "etc/kubernetes/manifests").mkdir(parents=True)
        original = (FIXTURES / "manifests" / "kubeadm.yaml").read_bytes()
        (root / MANIFEST).write_bytes(original)
        src = self.tmp / f"{name}-src"
        src.mkdir()
        kubelet = SimKubelet(real, name, root, full_spec=True)
        sim = NodeSim(name, root, src, original, real, kubelet)
        sim.configmap(1)
        kubelet.start()
        self.sims[name] = sim
        return sim

    def daemonset(self) -> Obj | None:
        status, out = self.cp.request("GET", f"/apis/apps/v1/namespaces/{self.namespace}/daemonsets/{DS}")
        return out if status == 200 else None

    def start_agent(self, sim: NodeSim) -> None:
        """A new pod of the DaemonSet on the node (as its controller would create it), and its agent process."""
        sim.pods += 1
        ds = self.daemonset()
        if ds is not None:
            template = ds["spec"]["template"]
            self.cp.ok("POST", f"/api/v1/namespaces/{self.namespace}/pods", {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": sim.pod, "labels": template["metadata"]["labels"], "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": DS, "uid": ds["metadata"]["uid"],
                     "controller": True, "blockOwnerDeletion": True}]},
                "spec": {**template["spec"], "nodeName": sim.name}})
        log = self.tmp / f"{sim.pod}.log"
        sim.logs.append(log)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PATCHER_")}
        env.update(PYTHONPATH=str(self.package_root), NODE_NAME=sim.name, KUBECONFIG=str(self.kubeconfig),
                   POD_NAMESPACE=self.namespace, POD_NAME=sim.pod)
        sim.proc = subprocess.Popen(
            [sys.executable, "-m", "patcher", "run", "--host-root", str(sim.root), "--source", str(sim.src),
             "--listen", "127.0.0.1:0", "--restart-timeout", "20s",
             # kubeletsim shows a refused scheduler ready for 0.3 s (no startup probe): well above that
             "--restart-settle", "2s", "--rollout-lease-duration", "10s",
             "--check-extenders=false", "--log-format", "json", *self.extra_args],
            env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=self.package_root)

    def stop_agent(self, sim: NodeSim, *, delete_pod: bool = False, timeout: float = 60) -> str:
        """SIGTERM, as the kubelet does for a deleted pod; the agent must exit 0. Returns its log."""
        assert sim.proc is not None
        if delete_pod:
            self.cp.ok("DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{sim.pod}",
                       {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
        sim.proc.send_signal(signal.SIGTERM)
        assert sim.proc.wait(timeout) == 0, sim.log
        return sim.log

    def annotations(self, node: str) -> dict[str, str]:
        out = self.cp.ok("GET", f"/api/v1/nodes/{node}")
        return {k[len(P):]: v for k, v in (out["metadata"].get("annotations") or {}).items() if k.startswith(P)}

    def events(self, namespace: str = "default") -> list[Obj]:
        items: list[Obj] = self.cp.ok("GET", f"/api/v1/namespaces/{namespace}/events")["items"]
        return items

    def configmap_data(self, name: str) -> dict[str, str]:
        status, out = self.cp.request("GET", f"/api/v1/namespaces/{self.namespace}/configmaps/{name}")
        return dict(out.get("data") or {}) if status == 200 else {}

    def kill_all(self) -> None:
        for sim in self.sims.values():
            if sim.proc is not None and sim.proc.poll() is None:
                sim.proc.kill()
                sim.proc.wait(10)
            sim.kubelet.stop()


@dataclass
class Timeline:
    """Every change of the nodes' state annotations, as a real watch on Nodes delivers them (one admin
    list-then-watch, which resumes and lists again across an API server restart), with the time it arrived."""

    cp: ControlPlane
    names: list[str]
    t0: float = field(default_factory=time.monotonic)
    rows: list[tuple[float, str, str, str]] = field(default_factory=list)
    last: dict[str, tuple[str, str]] = field(default_factory=dict)
    annotations: dict[str, dict[str, str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _api: Api | None = None
    _watcher: ListWatcher | None = None

    def start(self) -> Timeline:
        self._api = build_api_client(ClientSettings(kubeconfig=str(self.cp.kubeconfig)))
        self._watcher = ListWatcher(self._api, NODES, on_sync=self._see_all,
                                    on_event=lambda kind, node: self._see(node), name="timeline",
                                    watch_timeout_s=30)
        self._watcher.start()
        return self

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
        if self._api is not None:
            self._api.close()

    def _see_all(self, nodes: list[Obj]) -> None:
        for node in nodes:
            self._see(node)

    def _see(self, node: Obj) -> None:
        name = node["metadata"]["name"]
        if name not in self.names:
            return
        ann = {k[len(P):]: v for k, v in (node["metadata"].get("annotations") or {}).items() if k.startswith(P)}
        now = (ann.get("state", "-"), ann.get("config-hash", "")[:12])
        with self._lock:
            self.annotations[name] = ann
            if self.last.get(name) != now:
                self.last[name] = now
                self.rows.append((time.monotonic() - self.t0, name, *now))

    def mark(self, what: str) -> float:
        with self._lock:
            t = time.monotonic() - self.t0
            self.rows.append((t, "--", what, ""))
        return t

    def all(self, state: str) -> bool:
        with self._lock:
            return all(self.last.get(n, ("", ""))[0] == state for n in self.names)

    def one_config(self) -> str | None:
        """The config hash every node runs, when they all run the same one."""
        with self._lock:
            hashes = {self.annotations.get(n, {}).get("config-hash") for n in self.names}
        return hashes.pop() if len(hashes) == 1 else None

    def overlaps(self, since: float) -> list[str]:
        """Moments when two nodes were WaitingForRestart at once (never, with the coordinated rollout)."""
        waiting: set[str] = set()
        bad = []
        with self._lock:
            rows = list(self.rows)
        for t, node, state, _ in rows:
            if node == "--" or t < since:
                continue
            (waiting.add if state == "WaitingForRestart" else waiting.discard)(node)
            if len(waiting) > 1:
                bad.append(f"{t:.2f}s {sorted(waiting)}")
        return bad

    def states_since(self, node: str, since: float) -> list[str]:
        with self._lock:
            return [s for t, n, s, _ in self.rows if n == node and t >= since]

    def text(self) -> str:
        with self._lock:
            return "\n".join(f"{t:6.2f}s  {n:<5} {s:<18} {h}" for t, n, s, h in self.rows)


# -- which rule let each request through ----------------------------------------------------------------------

#: One grant: (Role or ClusterRole, its namespace or "", its name, the rule's index, one verb of the rule).
Grant = tuple[str, str, str, int, str]


def grants(objs: list[Obj]) -> dict[Grant, tuple[Obj, set[str]]]:
    """Every verb of every rule of the Roles/ClusterRoles in `objs`, with the rule and the users bound to it."""
    users: dict[tuple[str, str, str], set[str]] = {}
    for b in objs:
        if b["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            ref = b["roleRef"]
            ns = b["metadata"].get("namespace", "") if ref["kind"] == "Role" else ""
            users.setdefault((ref["kind"], ns, ref["name"]), set()).update(
                f"system:serviceaccount:{s['namespace']}:{s['name']}" for s in b["subjects"])
    out: dict[Grant, tuple[Obj, set[str]]] = {}
    for role in objs:
        if role["kind"] in ("Role", "ClusterRole"):
            key = (role["kind"], role["metadata"].get("namespace", ""), role["metadata"]["name"])
            for i, rule in enumerate(role["rules"]):
                for verb in rule["verbs"]:
                    out[(*key, i, verb)] = (rule, users.get(key, set()))
    return out


def allows(grant: Grant, rule: Obj, users: set[str], event: Obj) -> bool:
    """Whether `rule` of `grant` authorizes the audited request `event` (RBAC's own matching, for the forms
    the manifests use: no wildcards, no nonResourceURLs)."""
    ref = event.get("objectRef") or {}
    resource = "/".join(x for x in (ref.get("resource"), ref.get("subresource")) if x)
    return (event["user"]["username"] in users and event["verb"] == grant[4]
            and (grant[0] == "ClusterRole" or ref.get("namespace") == grant[1])
            and ref.get("apiGroup", "") in rule["apiGroups"] and resource in rule["resources"]
            and (not rule.get("resourceNames") or ref.get("name") in rule["resourceNames"]))


def unused_grants(objs: list[Obj], events: list[Obj]) -> list[str]:
    """The verbs of rules that no allowed request in `events` needed: least privilege would drop them."""
    allowed = [e for e in events if (e.get("annotations") or {}).get("authorization.k8s.io/decision") == "allow"]
    return sorted(f"{kind} {ns + '/' if ns else ''}{name} rule {i} {rule['resources']}: {verb}"
                  for (kind, ns, name, i, verb), (rule, users) in grants(objs).items()
                  if not any(allows((kind, ns, name, i, verb), rule, users, e) for e in allowed))
