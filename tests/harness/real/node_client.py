"""A kubelet's API side against the real kube-apiserver: Node registration and mirror pods, as the node.

tests/harness/emu/kubeletsim.py decides *when* a static pod restarts (the manifest file changed) and *how* it runs
(Running, or CrashLoopBackOff on a config the scheduler refuses); this is what the real kubelet then sends, with the
same credentials and through the same authorizers, so what the agent reads has the shape the real server gives it:

* the node authenticates with a client certificate `/O=system:nodes/CN=system:node:<name>`: the Node authorizer
  and the NodeRestriction admission plugin judge every request, as for a real kubelet;
* registration: the kubelet creates its own Node with the labels it may set itself (`kubernetes.io/hostname`,
  `kubernetes.io/os`, ...) and the taint `node.kubernetes.io/not-ready:NoSchedule` (seen on the real kubelet,
  tests/real/test_real_kubelet.py), then reports `Ready` through `nodes/<name>/status`; kube-controller-manager's node
  lifecycle controller takes the taint off once the node is Ready (`register` does both: until then a
  DaemonSet, and the agent's "does my DaemonSet still select this node", passes the node over).
  NodeRestriction forbids a kubelet the `node-role.kubernetes.io/*` labels: the installer adds them with its own
  credentials (`mark_control_plane`, what kubeadm does), and the control-plane taint with them;
* a mirror pod is created by the node with `kubernetes.io/config.mirror` (the static pod's hash), the
  static pod's own annotations (`config.hash`, `config.source: file`, `config.seen`), `spec.nodeName` and one
  controller ownerReference to the Node (its uid: NodeRestriction checks it). The server drops the status of a
  created pod (Pending, no container statuses), so the status follows through `pods/<name>/status`;
* a static pod whose hash changed gets a new mirror pod: the old one is deleted (grace period 0, uid
  precondition) and a new one created, as the kubelet's pod workers do; a status change alone is a patch.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tests.harness.real.controlplane import ControlPlane, issue

Obj = dict[str, Any]
MIRROR = "kubernetes.io/config.mirror"
CONTROL_PLANE = "node-role.kubernetes.io/control-plane"
NOT_READY = "node.kubernetes.io/not-ready"


class KubeletApiError(OSError):
    """An answer the kubelet did not expect; an OSError, so the simulated kubelet retries on its next pass,
    as the real one does (the test asserts on `NodeClient.errors` that none was a refusal)."""


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class NodeClient:
    """One node's kubelet identity on the real API server; `set_pod` is tests/harness/emu/kubeletsim.py's `PodSink`."""

    cp: ControlPlane
    name: str
    uid: str = ""
    errors: list[str] = field(default_factory=list)
    mirror_pods_created: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def user(self) -> str:
        return f"node-{self.name}"

    def _call(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
              ok: tuple[int, ...] = (200, 201)) -> Any:
        status, out = self.cp.request(method, path, body, content_type, user=self.user)
        if status not in ok:
            message = f"{method} {path} as system:node:{self.name}: {status} {out}"
            with self._lock:
                self.errors.append(message)
            raise KubeletApiError(message)
        return out

    def register(self) -> NodeClient:
        """The node's client certificate, its Node object and a Ready status, as kubelet registration does, and
        the not-ready taint off, as the node lifecycle controller does then."""
        self.create()
        self.report_ready()
        self.untaint_ready()
        return self

    def credentials(self) -> NodeClient:
        """The node's client certificate only, for a Node that exists already (its uid: the mirror pods' owner)."""
        issue(self.cp.pki, self.user, f"/O=system:nodes/CN=system:node:{self.name}", client=True)
        self.uid = self.cp.ok("GET", f"/api/v1/nodes/{self.name}")["metadata"]["uid"]
        return self

    def create(self) -> Obj:
        """The node's client certificate and the Node as the kubelet creates it (labels, the not-ready taint)."""
        issue(self.cp.pki, self.user, f"/O=system:nodes/CN=system:node:{self.name}", client=True)
        node: Obj = self._call("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": self.name, "labels": {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux",
                                          "kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                                          "beta.kubernetes.io/arch": "amd64"}},
            "spec": {"taints": [{"key": NOT_READY, "effect": "NoSchedule"}]}})
        self.uid = node["metadata"]["uid"]
        return node

    def report_ready(self) -> None:
        now = _now()
        self._call("PATCH", f"/api/v1/nodes/{self.name}/status", {"status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
                            "lastTransitionTime": now}],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                          {"type": "Hostname", "address": self.name}],
            "nodeInfo": {"kubeletVersion": f"v{self.cp.binaries.version}", "operatingSystem": "linux",
                         "architecture": "amd64", "containerRuntimeVersion": "containerd://2.0.0",
                         "kernelVersion": "6.1.0", "osImage": "Debian", "kubeProxyVersion": "",
                         "machineID": "", "systemUUID": "", "bootID": ""}}},
            "application/merge-patch+json")

    def untaint_ready(self) -> None:
        """What the node lifecycle controller does once the node is Ready: the not-ready taint comes off."""
        node = self.cp.ok("GET", f"/api/v1/nodes/{self.name}")
        taints = [t for t in node["spec"].get("taints") or [] if t["key"] != NOT_READY]
        self.cp.ok("PATCH", f"/api/v1/nodes/{self.name}", {"spec": {"taints": taints or None}},
                   "application/merge-patch+json")

    def mark_control_plane(self) -> None:
        """What kubeadm does after the kubelet registered: the control-plane label and taint, as admin."""
        self.cp.ok("PATCH", f"/api/v1/nodes/{self.name}", {
            "metadata": {"labels": {CONTROL_PLANE: ""}},
            "spec": {"taints": [{"key": CONTROL_PLANE, "effect": "NoSchedule"}]}}, "application/merge-patch+json")

    def set_pod(self, pod: Obj) -> Obj:
        """Publish a mirror pod as the kubelet does: a new hash deletes the old pod and creates the new one;
        then the status goes through the status subresource."""
        meta = pod["metadata"]
        ns, name = meta.get("namespace", "kube-system"), meta["name"]
        path = f"/api/v1/namespaces/{ns}/pods/{name}"
        annotations = {**meta.get("annotations", {}), "kubernetes.io/config.seen": _now()}
        # What the kubelet's pod informer holds: the pods bound to this node (the Node authorizer lets a node read
        # a pod only once it is bound to it, so a GET of a mirror pod not created yet is a 403, not a 404).
        bound = self._call("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{self.name}")["items"]
        current = next((p for p in bound if p["metadata"]["name"] == name and p["metadata"]["namespace"] == ns), None)
        running = (current["metadata"].get("annotations") or {}).get(MIRROR) if current is not None else None
        stale = current is not None and running != annotations[MIRROR]
        if current is not None and stale:
            self._call("DELETE", path, {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                                        "preconditions": {"uid": current["metadata"]["uid"]}}, ok=(200, 404))
        if current is None or stale:
            self._call("POST", f"/api/v1/namespaces/{ns}/pods", {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "labels": meta.get("labels") or {},
                             "annotations": annotations,
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.name,
                                                  "uid": self.uid, "controller": True}]},
                "spec": {**pod["spec"], "nodeName": self.name}})
            with self._lock:
                self.mirror_pods_created += 1
        status_body = dict(pod["status"])
        status_body.setdefault("hostIP", "127.0.0.1")
        status_body.setdefault("podIP", "127.0.0.1")
        for container in status_body.get("containerStatuses") or []:
            container.setdefault("image", next((c.get("image", "") for c in pod["spec"].get("containers", [])
                                                if c.get("name") == container["name"]), ""))
            container.setdefault("imageID", "")
        out: Obj = self._call("PATCH", f"{path}/status", {"status": status_body}, "application/merge-patch+json")
        return out
