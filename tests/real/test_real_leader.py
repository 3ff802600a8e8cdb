"""The leader-aware order's view on the real kube-apiserver, with the real kube-scheduler's leader election.

A real kube-scheduler (``--leader-elect``) takes ``kube-system/kube-scheduler`` as ``<hostname>_<uuid>``; the view
(``adapters/kube/schedleader``), run with a ServiceAccount that holds only the manifests' RBAC, maps that holder to
the Node whose ``kubernetes.io/hostname`` is this machine's, and sees the Lease released when the scheduler stops
(``ReleaseOnCancel``). The same RBAC without ``list`` on that Lease: the server refuses it, and the view stays
unknown, so the agent goes on as it did before the order (the decision: tests/unit/test_lifecycle_order.py).
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from patcher.adapters.kube.client import ClientSettings, build_api_client
from patcher.adapters.kube.schedleader import SchedulerLeader
from patcher.core.lifecycle import Peer
from tests.harness.real.controlplane import ControlPlane, die_with_parent, free_port, terminate, wait_until
from tests.real.test_real_rbac import BASE, RBAC_KINDS, case_objects

pytestmark = pytest.mark.real_cluster

#: The rule of the mirror-pod Role in kube-system that grants list/watch on kube-scheduler's Lease.
KUBE_SYSTEM_ROLE = next(o for o in BASE if o["kind"] == "Role"
                        and o["metadata"]["name"] == "scheduler-patcher-mirror-pod")
LEASE_RULE = next(i for i, r in enumerate(KUBE_SYSTEM_ROLE["rules"]) if r["resources"] == ["leases"])


def service_account(cp: ControlPlane, tmp: Path, number: int, *, drop: str | None = None) -> Path:
    """The manifests' Namespace, ServiceAccount and RBAC in namespace ``lead-<number>`` (the kube-system Role
    without the Lease's ``drop`` verb), and a token kubeconfig of that ServiceAccount."""
    grant = ("Role", "kube-system", "scheduler-patcher-mirror-pod", LEASE_RULE, drop) if drop else None
    objs = [o for o in case_objects(number, grant, prefix="lead")
            if o["kind"] in ("Namespace", "ServiceAccount", *RBAC_KINDS)]
    (tmp / f"rbac-{number}.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
    proc = cp.kubectl("apply", "--server-side", "-f", str(tmp / f"rbac-{number}.json"))
    assert proc.returncode == 0, proc.stderr
    return cp.token_kubeconfig(f"lead-{number}", "scheduler-patcher", tmp / f"lead-{number}.kubeconfig")


@pytest.fixture
def scheduler(real_cluster: ControlPlane, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    cp, kubeconfig = real_cluster, str(real_cluster.kubeconfig)
    # An earlier test's scheduler may have left its Lease held until it expires: the holder seen is then ours.
    cp.request("DELETE", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kube-scheduler")
    with open(tmp_path / "kube-scheduler.log", "ab") as log:
        proc = subprocess.Popen(
            [str(cp.binaries.path("kube-scheduler")), f"--kubeconfig={kubeconfig}",
             f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
             "--leader-elect=true", "--bind-address=127.0.0.1", f"--secure-port={free_port()}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
    try:
        yield proc
    finally:
        terminate(proc)


def test_the_view_reads_the_real_schedulers_lease_with_only_the_projects_rbac(
        real_cluster: ControlPlane, scheduler: subprocess.Popen[bytes], tmp_path: Path) -> None:
    cp, host = real_cluster, socket.gethostname().lower()
    for name, hostname in (("lead-leader", host), ("lead-other", "lead-other")):
        cp.kubectl("delete", "node", name, "--ignore-not-found")
        cp.ok("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
            "node-role.kubernetes.io/control-plane": "", "kubernetes.io/hostname": hostname}}})
    granted = build_api_client(ClientSettings(kubeconfig=str(service_account(cp, tmp_path, 0))))
    refused = build_api_client(ClientSettings(kubeconfig=str(service_account(cp, tmp_path, 1, drop="list"))))
    view = SchedulerLeader(granted, "lead-leader", "scheduler-patcher.io", on_change=lambda: None)
    blind = SchedulerLeader(refused, "lead-leader", "scheduler-patcher.io", on_change=lambda: None, retry=(0.2, 1.0))
    view.start()
    blind.start()
    try:
        try:
            wait_until(lambda: view.view().leads, 90, "the real scheduler's lead, seen by the view")
        except AssertionError as e:
            log = (tmp_path / "kube-scheduler.log").read_text(errors="replace")[-3000:]
            raise AssertionError(f"{e}; view {view.view()}\n--- kube-scheduler:\n{log}") from e
        s = view.view()
        assert s.known and s.leader == "lead-leader"
        assert Peer("lead-other") in s.peers  # no agent there, no scheduler pod (no kubelet here)
        holder = cp.ok("GET", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kube-scheduler")
        assert holder["spec"]["holderIdentity"].startswith(f"{socket.gethostname()}_")  # <hostname>_<uuid>
        scheduler.terminate()  # a clean stop releases the Lease (ReleaseOnCancel): nobody leads
        scheduler.wait(30)
        wait_until(lambda: view.view().leader == "", 30, "the released Lease")
        assert view.view().known and not blind.view().known  # without list on the Lease: never known
    finally:
        view.stop()
        blind.stop()
        for name in ("lead-leader", "lead-other"):
            cp.kubectl("delete", "node", name, "--ignore-not-found")
