"""The leader-aware order against the API emulator: the view (``adapters/kube/schedleader``) and three agents.

The view follows kube-scheduler's Lease, the control-plane Nodes and the scheduler pods by watches, and calls
back only when what it shows changes (not on each renewal of the Lease). Three agents (``runner.build_agent``,
each with its simulated kubelet) and a stand-in for kube-scheduler's leader election (``Election``: the Lease
moves to a Ready scheduler when the leader's pod is replaced, as a restarted leader loses it) roll a config out:
the leader's node restarts last, and the lead changes once per rollout.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from patcher.adapters.kube.client import ClientSettings, build_api_client
from patcher.adapters.kube.schedleader import SchedulerLeader, holder_host
from patcher.core.lifecycle import Peer, Schedulers
from patcher.core.settings import Api, Files, Rollout, Status
from patcher.services import process
from patcher.services.runner import api_client, build_agent
from tests.conftest import write_configmap
from tests.harness.emu.kubeemu import KubeEmulator, make_mirror_pod, wait_until
from tests.harness.emu.kubeletsim import SimKubelet
from tests.harness.helpers import EXTENDERS, P, node_folders
from tests.harness.settings import build_settings

CP = {"node-role.kubernetes.io/control-plane": ""}
NAMES = ("cp-1", "cp-2", "cp-3")


def lease(holder: str, renewed: str = "2026-01-01T00:00:00.000000Z") -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "kube-scheduler", "namespace": "kube-system"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renewed}}


def scheduler(node: str, ready: bool = True) -> dict[str, Any]:
    pod = make_mirror_pod(node_name=node, started_at="2026-01-01T00:00:00Z", ready=ready)
    pod["metadata"]["labels"] = {"component": "kube-scheduler", "tier": "control-plane"}
    return pod


@pytest.fixture
def emu() -> Iterator[KubeEmulator]:
    with KubeEmulator() as e:
        yield e


def test_holder_host_is_the_hostname_before_the_uuid() -> None:
    assert holder_host("CP-1.example_0b7e6f5c-2c7a-4a4e-9d3e-1f2f1f2f1f2f") == "cp-1.example"
    assert [holder_host(x) for x in ("", None, "no-uuid", 7)] == ["", "", "", ""]


def test_the_view_follows_the_lease_the_nodes_and_the_pods(emu: KubeEmulator, tmp_path: Path) -> None:
    emu.add_node("cp-1", labels=CP, annotations={P + "state": "Ready", P + "source-hash": "a" * 64})
    emu.add_node("node-b", labels={**CP, "kubernetes.io/hostname": "host-b"}, annotations={P + "state": "Pending"})
    emu.add_node("worker", labels={})
    for node in ("cp-1", "node-b"):
        emu.set_pod(scheduler(node))
    emu.create(lease(f"HOST-B_{uuid.uuid4()}"))
    changes: list[Schedulers] = []
    api = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / "kc"))))
    view = SchedulerLeader(api, "cp-1", "scheduler-patcher.io", on_change=lambda: changes.append(view.view()))
    assert view.view() == Schedulers()  # not listed yet: unknown, the order not applied
    view.start()
    try:
        peer = Peer("node-b", "Pending", "", True)
        assert wait_until(lambda: view.view() == Schedulers(True, "node-b", False, (peer,)), 10), view.view()
        seen = len(changes)
        emu.mutate("leases", "kube-scheduler",  # a renewal: nothing the view shows changes
                   lambda o: {**o, "spec": {**o["spec"], "renewTime": "2026-01-01T00:00:02.000000Z"}},
                   "kube-system", "coordination.k8s.io")
        emu.set_pod(scheduler("node-b", ready=False))
        assert wait_until(lambda: view.view().peers == (Peer("node-b", "Pending", "", False),), 10)
        emu.mutate("leases", "kube-scheduler", lambda o: {**o, "spec": {**o["spec"], "holderIdentity": "cp-1_x"}},
                   "kube-system", "coordination.k8s.io")
        assert wait_until(lambda: view.view().leads, 10) and view.view().leader == "cp-1"
        assert len(changes) == seen + 2  # the pod, the holder: the renewal said nothing
        emu.delete("leases", "kube-scheduler", "kube-system", "coordination.k8s.io")
        assert wait_until(lambda: view.view().leader == "" and view.view().known, 10)
    finally:
        view.stop()


def test_an_api_that_never_answered_leaves_the_view_unknown(emu: KubeEmulator, tmp_path: Path) -> None:
    api = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / "kc"))))
    emu.go_down("refuse")
    view = SchedulerLeader(api, "cp-1", "scheduler-patcher.io", on_change=lambda: None, retry=(0.05, 0.2))
    view.start()
    try:
        assert not wait_until(lambda: view.view().known, 1.0)
        emu.come_up()
        assert wait_until(lambda: view.view().known, 10)
    finally:
        view.stop()


class Election:
    """kube-scheduler's leader election, in small: the holder keeps the Lease while its scheduler's pod stays the
    same; when it is replaced (the kubelet restarted it), the lead goes to the first other Ready scheduler."""

    def __init__(self, emu: KubeEmulator, leader: str) -> None:
        self.emu, self.leader, self.changes = emu, leader, 0
        self.stop = threading.Event()
        emu.create(lease(self.identity(leader)))
        self.uid = self.pod_uid(leader)
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    @staticmethod
    def identity(node: str) -> str:
        return f"{node}_{uuid.uuid4()}"

    def pod_uid(self, node: str) -> str | None:
        pod = self.emu.get("pods", f"kube-scheduler-{node}", "kube-system")
        return None if pod is None else str(pod["metadata"].get("uid"))

    def ready(self, node: str) -> bool:
        pod = self.emu.get("pods", f"kube-scheduler-{node}", "kube-system") or {}
        return any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in pod.get("status", {}).get("conditions", []))

    def run(self) -> None:
        while not self.stop.wait(0.02):
            if self.pod_uid(self.leader) == self.uid:
                continue
            others = [n for n in NAMES if n != self.leader and self.ready(n)]
            if not others:
                continue
            self.leader, self.changes = others[0], self.changes + 1
            self.uid = self.pod_uid(self.leader)
            holder = self.identity(self.leader)
            self.emu.mutate("leases", "kube-scheduler",
                            lambda o, h=holder: {**o, "spec": {**o["spec"], "holderIdentity": h}},  # type: ignore[misc]
                            "kube-system", "coordination.k8s.io")


def test_three_agents_restart_the_leaders_node_last_with_one_leader_change_per_rollout(
        emu: KubeEmulator, tmp_path: Path) -> None:
    kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")
    kubelets: dict[str, SimKubelet] = {}
    sources: dict[str, Path] = {}
    for name in NAMES:
        emu.add_node(name, labels=CP)
        root, sources[name] = node_folders(tmp_path / name)
        kubelets[name] = SimKubelet(emu, name, root).start()
    assert wait_until(lambda: all(emu.get("pods", f"kube-scheduler-{n}", "kube-system") for n in NAMES), 10)
    election = Election(emu, "cp-1")  # the first by name: without the order it is often patched first
    agents = []
    try:
        for name in NAMES:
            root = tmp_path / name / "node"
            config = build_settings(
                files=Files(source=sources[name], host_root=root), node_name=name, debounce=0.05,
                check_extenders=False, restart_settle=0.0, leader_wait=120.0,
                api=Api(kubeconfig=str(kubeconfig), timeout=(1.0, 2.0), backoff=(0.05, 0.5)),
                rollout=Rollout(mode="coordinated", retry=0.2), status=Status(publish=False))
            wiring = build_agent(config, api_client(config.api))  # type: ignore[arg-type]
            wiring.start()
            thread = threading.Thread(target=process.run, args=(wiring.agent,), daemon=True)
            thread.start()
            agents.append((wiring, thread))

        def rolled_out(source: str | None) -> bool:
            ann = [emu.node_annotations(n) for n in NAMES]
            return all(a.get(P + "state") == "Ready" and a.get(P + "source-hash") != source for a in ann) and \
                len({a.get(P + "source-hash") for a in ann}) == 1

        def order(since: int) -> list[str]:
            return [n for _, n in sorted((r.at_ns, n) for n, k in kubelets.items() for r in k.restarts[since:])]

        assert wait_until(lambda: rolled_out(None), 60), {n: emu.node_annotations(n) for n in NAMES}
        assert order(1)[-1] == "cp-1" and sorted(order(1)) == sorted(NAMES), order(1)  # install: the leader last
        assert election.changes == 1
        leader, first = election.leader, emu.node_annotations("cp-1")[P + "source-hash"]
        for src in sources.values():
            write_configmap(src, {"extenders.yaml": EXTENDERS.replace("weight: 1", "weight: 5")})
        assert wait_until(lambda: rolled_out(first), 60), {n: emu.node_annotations(n) for n in NAMES}
        assert order(2)[-1] == leader and sorted(order(2)) == sorted(NAMES), (leader, order(2))
        assert election.changes == 2
    finally:
        election.stop.set()
        for wiring, thread in agents:
            wiring.agent.request_stop()
            thread.join(30)
            wiring.close()
        for k in kubelets.values():
            k.stop()
