"""The chart on the kubeadm cluster (tests/harness/real/kubeadm_cluster.py): the agent's image on every node, the
chart's values this sandbox needs, the real helm in a node, and the reads that tell where a journey stands (the
Nodes settled, the agents, their states, each node's running kube-scheduler and its flags, the Lease holders).
Shared by tests/real/test_real_kubeadm_cluster.py and bench/rollout_gap.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.harness.helpers import P
from tests.harness.real.agent_image import agent_image
from tests.harness.real.helmtool import NAMESPACE
from tests.harness.real.kubeadm_cluster import ENDPOINT, ENDPOINT_ADDRESS, KubeadmCluster
from tests.harness.real.kubeadm_node import KubeadmNode

CONTROL_PLANE = "node-role.kubernetes.io/control-plane"


def ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def settled_nodes(cluster: KubeadmCluster) -> list[str] | None:
    """The Nodes' names once all are Ready with kubeadm's label and only its taint (the kubelet registers each with
    `not-ready`, which the node lifecycle controller takes off a moment after the Node turned Ready)."""
    nodes = cluster.first.get("/api/v1/nodes")
    assert nodes is not None
    kubeadms = [(CONTROL_PLANE, "NoSchedule")]
    names = sorted(n["metadata"]["name"] for n in nodes["items"]
                   if ready(n) and CONTROL_PLANE in n["metadata"]["labels"]
                   and [(t["key"], t["effect"]) for t in n["spec"].get("taints") or []] == kubeadms)
    return names if len(names) == cluster.size else None


def lease_holder(node: KubeadmNode, name: str) -> str | None:
    """The node whose component holds kube-system's Lease `name` (holderIdentity is `<node>_<uuid>`)."""
    lease = node.get(f"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{name}")
    holder = str((lease or {}).get("spec", {}).get("holderIdentity") or "")
    return holder.split("_", 1)[0] or None


SCHEDULER_CONFIG = "/etc/kubernetes/scheduler-patcher/"


def agent_image_on(cluster: KubeadmCluster) -> tuple[str, str]:
    """(repository, tag) of the agent's image as every node's runtime has it: built here from this checkout and
    imported into each node's containerd (no registry is reachable here). The chart then runs it with
    `pullPolicy: Never`; a registry's pull would take this one function's place."""
    image = agent_image()
    for node in cluster.nodes:
        node.ctr("images", "import", str(image.archive))
        assert image.name in node.ctr("images", "ls", "-q").split()
    repository, tag = image.name.rsplit(":", 1)
    return repository, tag


def chart_values(repository: str, tag: str) -> dict[str, Any]:
    """The chart's values for this cluster: the imported image, one extender (ignorable: nothing listens on it, the
    scheduler only calls it to place a pod), and two things this sandbox lacks. No kube-proxy routes the
    `kubernetes` Service's ClusterIP, which the kubelet puts in KUBERNETES_SERVICE_HOST: the agents (host network)
    get the API endpoint's address instead (the container's env wins over the kubelet's). The pod network is
    loopback only, so the hooks' Jobs (not host network) could reach no API server: both are off; the journey runs
    the pre-delete hook's command (`stop-agents`) itself in a node's network before `helm uninstall`, and the
    agents' own restore on exit is what the uninstall relies on here."""
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "extenders": [{"urlPrefix": "http://127.0.0.1:8889", "filterVerb": "filter", "weight": 1,
                       "ignorable": True}],
        "extraEnv": [{"name": "KUBERNETES_SERVICE_HOST", "value": ENDPOINT_ADDRESS},
                     {"name": "KUBERNETES_SERVICE_PORT", "value": ENDPOINT.rsplit(":", 1)[1]}],
        "restoreJob": {"enabled": False},
        "stopAgentsJob": {"enabled": False},
    }


def agents(node: KubeadmNode) -> list[dict[str, Any]]:
    pods = node.get(f"/api/v1/namespaces/{NAMESPACE}/pods")
    return list((pods or {}).get("items") or [])


def states(cluster: KubeadmCluster) -> dict[str, str]:
    nodes = cluster.first.get("/api/v1/nodes")
    assert nodes is not None
    return {n["metadata"]["name"]: (n["metadata"].get("annotations") or {}).get(f"{P}state", "")
            for n in nodes["items"]}


def scheduler_config(node: KubeadmNode) -> tuple[str, list[str]] | None:
    """(container ID, its --config flags) of the node's running, ready kube-scheduler; None while there is none."""
    running = node.running()
    if running is None:
        return None
    container = next(c for c in running[1]["spec"]["containers"] if c["name"] == "kube-scheduler")
    return running[0], [w for w in container.get("command", []) if w.startswith("--config=")]


def stop_agents_in(node: KubeadmNode) -> subprocess.CompletedProcess[str]:
    """`scheduler-patcher stop-agents` (the chart's pre-delete hook's command, off in `chart_values`) in the node's
    network, as kubeadm's admin: `helm uninstall` as it runs with its hook."""
    argv = [sys.executable, "-m", "patcher", "stop-agents", "--kubeconfig=/etc/kubernetes/admin.conf",
            f"--namespace={NAMESPACE}", "--timeout=4m"]
    return subprocess.run(node.inside(argv, pid_namespace=False), capture_output=True, text=True, timeout=300,
                          check=False, cwd=Path(__file__).resolve().parents[3])


def helm_in(node: KubeadmNode, helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The real helm (`helm`, its path) in the node's network (the API endpoint is reachable there only), as
    kubeadm's admin."""
    return subprocess.run(node.inside([helm, *args, "--kubeconfig=/etc/kubernetes/admin.conf"], pid_namespace=False),
                          capture_output=True, text=True, timeout=300, check=False)
