"""The uninstall's `restore-nodes` on the real kube-apiserver, under the restore Job's own ServiceAccount and RBAC
(manifests/uninstall, which the chart renders alike): the real authorizer lets it list the Nodes, read its
PodTemplate, create one pod bound to each control-plane node (admitted by Pod Security in the privileged namespace)
and watch them; the test plays the kubelets (a pod's status set Succeeded, as a kubelet reports it), and the
command ends as soon as the last one succeeded, each Node left `Restored`."""

from __future__ import annotations

import io
import secrets
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from patcher.commands.cli import build_parser
from patcher.commands.restorenodes import main
from tests.deploy.test_deploy_manifests import objects
from tests.harness.real.controlplane import ControlPlane, wait_until

pytestmark = pytest.mark.real_cluster

PREFIX = "scheduler-patcher.io"


def own_copy(ns: str, suffix: str) -> list[dict[str, Any]]:
    """manifests/uninstall/kubeadm in namespace `ns`, its cluster-wide RBAC named `<name>-<suffix>` (the control
    plane is shared with other tests); the Job left out: `restore-nodes` runs here in the test's process."""
    out = []
    for obj in objects("uninstall/kubeadm"):
        meta = obj["metadata"]
        if obj["kind"] == "Job":
            continue
        if obj["kind"] == "Namespace":
            meta["name"] = ns
        elif obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            meta["name"] = f"{meta['name']}-{suffix}"
        else:
            meta["namespace"] = ns
        if obj["kind"] == "ClusterRoleBinding":
            obj["roleRef"]["name"] = f"{obj['roleRef']['name']}-{suffix}"
        for subject in obj.get("subjects", []):
            subject["namespace"] = ns
        out.append(obj)
    return out


def test_restore_nodes_with_the_jobs_own_rbac_on_the_real_server(real_cluster: ControlPlane, tmp_path: Path) -> None:
    cp = real_cluster
    suffix = secrets.token_hex(3)
    ns, label = f"rn-{suffix}", f"restore-test-{suffix}"
    manifest = tmp_path / "uninstall.yaml"
    manifest.write_text(yaml.safe_dump_all(own_copy(ns, suffix)))
    proc = cp.kubectl("apply", "-f", str(manifest))
    assert proc.returncode == 0, proc.stderr
    cp.ensure_namespace(ns)  # its default ServiceAccount, which kube-controller-manager would make
    nodes = [f"cp-{suffix}-{i}" for i in (1, 2)]
    for name in nodes:
        cp.ok("POST", "/api/v1/nodes", {"metadata": {"name": name, "labels": {label: ""}, "annotations": {
            f"{PREFIX}/state": "Ready", f"{PREFIX}/config-hash": "a" * 64}}})
    kubeconfig = cp.token_kubeconfig(ns, "scheduler-patcher-restore", tmp_path / "restore.kubeconfig")
    args = build_parser(load=["restore-nodes"]).parse_args(
        ["restore-nodes", "--kubeconfig", str(kubeconfig), "--namespace", ns, "--node-selector", label,
         "--legacy-master-label", "false", "--timeout", "2m"])
    out, err, codes = io.StringIO(), io.StringIO(), []
    t = threading.Thread(target=lambda: codes.append(main(args, out=out, err=err)), daemon=True)
    t.start()

    def pods() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = cp.ok("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
        return items

    wait_until(lambda: len(pods()) == 2 or codes, timeout=60, what="the restore pods")
    assert not codes, err.getvalue()
    assert sorted(p["spec"]["nodeName"] for p in pods()) == nodes
    for pod in pods():  # the kubelet's report: `restore` exited 0
        cp.ok("PATCH", f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}/status",
              {"status": {"phase": "Succeeded"}}, "application/merge-patch+json")
    t.join(60)
    assert codes == [0], err.getvalue()
    assert out.getvalue().splitlines()[-1] == "every control-plane node is restored (2)"
    for name in nodes:
        annotations = cp.ok("GET", f"/api/v1/nodes/{name}")["metadata"]["annotations"]
        assert {k: v for k, v in annotations.items() if k.startswith(PREFIX)} == {f"{PREFIX}/state": "Restored"}
    for name in nodes:
        cp.request("DELETE", f"/api/v1/nodes/{name}")
    cp.kubectl("delete", "-f", str(manifest), "--wait=false")
