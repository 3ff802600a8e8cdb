"""The agent's own upgrade and uninstall with ``--restore-on-exit=auto``, end to end: three
control-plane nodes, each with its folders, a simulated kubelet (``tests.harness.emu.kubeletsim``, which counts the
scheduler's restarts) and real ``scheduler-patcher run`` processes, each started as a pod of the DaemonSet
``scheduler-patcher`` in the API emulator (downward API ``POD_NAME``/``POD_NAMESPACE``, an ownerReference).

* a rolling update of the agent (a new image in the DaemonSet's template, then node by node: the old pod marked
  for deletion, SIGTERM to its agent, the pod gone, the new one started; same config, as the real DaemonSet
  controller and kubelet do it on the kubeadm cluster of tests/real/test_real_kubeadm_cluster.py): no scheduler
  restarts, the manifest never back at the original;
* a pod deleted by hand: the same, on one node;
* the DaemonSet deleted (uninstall): every agent restores, one node at a time.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES, write_configmap
from tests.harness.emu.kubeemu import KubeEmulator, wait_until
from tests.harness.emu.kubeletsim import SimKubelet
from tests.harness.helpers import MANIFEST, P

ROOT = Path(__file__).resolve().parents[2]
NS, DS = "scheduler-patcher", "scheduler-patcher"
CP = "node-role.kubernetes.io/control-plane"
NODES = ("cp-1", "cp-2", "cp-3")
# An extender on a closed port, ignorable: with the pre-flight off (--check-extenders=false) nothing calls it.
SOURCE = {"extenders.yaml": "extenders:\n- urlPrefix: http://127.0.0.1:9\n  filterVerb: filter\n  weight: 1\n"
                            "  ignorable: true\n"}


@dataclass
class Sim:
    name: str
    root: Path
    src: Path
    original: bytes
    kubelet: SimKubelet
    generation: int = 0
    proc: subprocess.Popen[bytes] | None = None
    logs: list[Path] = field(default_factory=list)

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST

    @property
    def pod(self) -> str:
        return f"{DS}-{self.name}-{self.generation}"


@dataclass
class Cluster:
    emu: KubeEmulator
    sims: dict[str, Sim]
    tmp: Path
    kubeconfig: Path
    restore_on_exit: str = "auto"
    states: dict[str, list[str]] = field(default_factory=dict)  # every state each node's annotation showed
    stop: threading.Event = field(default_factory=threading.Event)
    tags: Iterator[int] = field(default_factory=lambda: itertools.count(2))  # the template's image tags after 1

    def state(self, node: str) -> str:
        return self.emu.node_annotations(node).get(P + "state", "")

    def follow(self) -> None:
        while not self.stop.wait(0.02):
            for n in NODES:
                seen = self.states.setdefault(n, [])
                s = self.state(n)
                if not seen or seen[-1] != s:
                    seen.append(s)

    def start_agent(self, sim: Sim) -> None:
        """A new pod of the DaemonSet on ``sim``'s node, and its agent process."""
        sim.generation += 1
        self.emu.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": sim.pod, "namespace": NS, "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": DS, "uid": "ds-uid", "controller": True}]},
            "spec": {"nodeName": sim.name}})
        log = self.tmp / f"{sim.pod}.log"
        sim.logs.append(log)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "NODE_NAME": sim.name, "KUBECONFIG": str(self.kubeconfig),
               "POD_NAMESPACE": NS, "POD_NAME": sim.pod}
        env.pop("PATCHER_RESTORE_ON_EXIT", None)
        mode = [] if self.restore_on_exit == "auto" else [f"--restore-on-exit={self.restore_on_exit}"]  # default
        sim.proc = subprocess.Popen(
            [sys.executable, "-m", "patcher", "run", "--host-root", str(sim.root), "--source", str(sim.src),
             "--listen", "127.0.0.1:0", "--restart-timeout", "20s",
             # kubeletsim shows a refused scheduler ready for 0.3 s (no startup probe): well above that
             "--restart-settle", "2s", "--rollout-lease-duration", "10s",
             "--check-extenders=false", "--log-format", "json", *mode],
            env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)

    def knows_its_daemonset(self, sim: Sim) -> bool:
        return "a stop keeps the patch" in sim.logs[-1].read_text()

    def settled(self, sim: Sim) -> bool:
        """The newest agent on ``sim``'s node is Ready, and with ``auto`` knows its DaemonSet (so a stop now
        decides on what the API said, as it does after a real pod's readiness probe passed)."""
        text = sim.logs[-1].read_text()
        if self.restore_on_exit == "auto":
            return "a stop keeps the patch" in text and self.state(sim.name) == "Ready"
        return "API connected" in text and self.state(sim.name) == "Ready" and b"--config=" in sim.manifest.read_bytes()

    def new_image(self) -> None:
        """`helm upgrade` to a new image tag, as the DaemonSet's watchers see it before any pod goes: the
        template's image changed and the generation bumped."""
        def change(ds: dict[str, Any]) -> None:
            ds["spec"]["template"]["spec"]["containers"][0]["image"] = f"scheduler-patcher:{next(self.tags)}"
            ds["metadata"]["generation"] = ds["metadata"].get("generation", 1) + 1
        self.emu.mutate("daemonsets", DS, change, NS, "apps")

    def rolling_update(self) -> dict[str, int]:
        """A new image in the template, then node by node (maxUnavailable 1): the old pod deleted and its agent
        stopped, the new one started; the scheduler restarts this caused, per node."""
        before = {n: len(s.kubelet.restarts) for n, s in self.sims.items()}
        self.new_image()
        for sim in self.sims.values():
            self.stop_agent(sim, delete_pod=True)
            self.start_agent(sim)
            assert wait_until(functools.partial(self.settled, sim), 60), sim.logs[-1].read_text()
        return {n: len(s.kubelet.restarts) - before[n] for n, s in self.sims.items()}

    def stop_agent(self, sim: Sim, *, delete_pod: bool = False) -> str:
        """SIGTERM, as the kubelet does for a deleted pod; returns the agent's log. A deleted pod is deleted as the
        real API server and kubelet do it: marked (deletionTimestamp) while its container stops, gone after."""
        assert sim.proc is not None
        if delete_pod:
            def mark(pod: dict[str, Any]) -> None:
                pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
                pod["metadata"]["deletionGracePeriodSeconds"] = 30
            self.emu.mutate("pods", sim.pod, mark, NS)
        sim.proc.send_signal(signal.SIGTERM)
        assert sim.proc.wait(30) == 0, sim.logs[-1].read_text()
        if delete_pod:
            self.emu.delete("pods", sim.pod, NS)
        return sim.logs[-1].read_text()


@contextlib.contextmanager
def three_nodes(tmp_path: Path, restore_on_exit: str = "auto") -> Iterator[Cluster]:
    """Three patched control-plane nodes, each running an agent as a pod of the DaemonSet (bench/agent_bench.py
    uses it too)."""
    emu = KubeEmulator().start()
    kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")
    emu.create({"apiVersion": "apps/v1", "kind": "DaemonSet",
                "metadata": {"name": DS, "namespace": NS, "generation": 1},
                "spec": {"template": {"spec": {"nodeSelector": {CP: ""}, "hostNetwork": True,
                                               "tolerations": [{"key": CP, "operator": "Exists"}],
                                               "containers": [{"name": "agent",
                                                               "image": "scheduler-patcher:1"}]}}}})
    sims = {}
    original = (FIXTURES / "manifests" / "kubeadm.yaml").read_bytes()
    for name in NODES:
        emu.add_node(name, labels={CP: ""})
        root = tmp_path / name
        (root / "etc/kubernetes/manifests").mkdir(parents=True)
        (root / MANIFEST).write_bytes(original)
        src = tmp_path / f"{name}-src"
        src.mkdir()
        write_configmap(src, SOURCE)
        sims[name] = Sim(name, root, src, original, SimKubelet(emu, name, root).start())
    c = Cluster(emu, sims, tmp_path, kubeconfig, restore_on_exit)
    follower = threading.Thread(target=c.follow, daemon=True)
    follower.start()
    try:
        for sim in sims.values():
            c.start_agent(sim)
        yield c
    finally:
        c.stop.set()
        follower.join(2)
        for sim in sims.values():
            if sim.proc and sim.proc.poll() is None:
                sim.proc.kill()
                sim.proc.wait(10)
            sim.kubelet.stop()
        emu.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with three_nodes(tmp_path) as c:
        yield c


def installed(c: Cluster) -> dict[str, int]:
    """Wait for every node Ready with every agent knowing its DaemonSet; the restarts so far, per node."""
    assert wait_until(lambda: all(c.state(n) == "Ready" for n in NODES), 60), {n: c.state(n) for n in NODES}
    assert wait_until(lambda: all(c.knows_its_daemonset(s) for s in c.sims.values()), 20)
    assert wait_until(lambda: all(c.states.get(n, [""])[-1] == "Ready" for n in NODES), 10)  # the follower too
    for sim in c.sims.values():
        assert b"--config=" in sim.manifest.read_bytes()
    return {n: len(s.kubelet.restarts) for n, s in c.sims.items()}


def only_ready_since(c: Cluster, node: str, index: int) -> bool:
    return set(c.states[node][index:]) == {"Ready"}


def test_a_rolling_update_of_the_agent_restarts_no_scheduler(cluster: Cluster) -> None:
    c = cluster
    before = installed(c)
    manifests = {n: s.manifest.read_bytes() for n, s in c.sims.items()}
    marks = {n: len(c.states[n]) - 1 for n in NODES}
    c.new_image()  # the template first, as `helm upgrade` changes it
    for sim in c.sims.values():  # maxUnavailable 1: one node after the other
        log = c.stop_agent(sim, delete_pod=True)
        assert "keeping the patch: DaemonSet scheduler-patcher still selects this node" in log
        assert sim.manifest.read_bytes() == manifests[sim.name]  # nothing written on the way out
        c.start_agent(sim)
        assert wait_until(functools.partial(c.knows_its_daemonset, sim), 30), sim.logs[-1].read_text()
        assert "adopting it without a write" not in sim.logs[-1].read_text()  # Ready on disk: nothing to wait for
    assert wait_until(lambda: all(c.state(n) == "Ready" for n in NODES), 10)
    after = {n: len(s.kubelet.restarts) for n, s in c.sims.items()}
    assert after == before  # 0 scheduler restarts: the manifest was never back at the original
    for n, sim in c.sims.items():
        assert sim.manifest.read_bytes() == manifests[n] and sim.kubelet.stray_files == []
        assert only_ready_since(c, n, marks[n]), c.states[n]  # the annotations stayed Ready throughout
    kept = [e for e in c.emu.events("default") if e["reason"] == "PatchKept"]
    assert sorted(e["involvedObject"]["name"] for e in kept) == list(NODES)


def test_a_pod_deleted_by_hand_restarts_no_scheduler(cluster: Cluster) -> None:
    c = cluster
    before = installed(c)
    sim = c.sims["cp-2"]
    patched = sim.manifest.read_bytes()
    mark = len(c.states["cp-2"]) - 1
    c.stop_agent(sim, delete_pod=True)
    c.start_agent(sim)
    assert wait_until(lambda: c.knows_its_daemonset(sim), 30)
    assert {n: len(s.kubelet.restarts) for n, s in c.sims.items()} == before
    assert sim.manifest.read_bytes() == patched and only_ready_since(c, "cp-2", mark)


def test_deleting_the_daemonset_restores_every_node_one_at_a_time(cluster: Cluster) -> None:
    c = cluster
    installed(c)
    c.emu.delete("daemonsets", DS, NS, "apps")
    assert wait_until(lambda: all("a stop restores: DaemonSet scheduler-patcher is gone" in s.logs[-1].read_text()
                                  for s in c.sims.values()), 20)
    for sim in c.sims.values():  # the garbage collector deletes the pods: SIGTERM to all at once
        assert sim.proc is not None
        sim.proc.send_signal(signal.SIGTERM)
    for sim in c.sims.values():
        assert sim.proc is not None
        assert sim.proc.wait(30) == 0, sim.logs[-1].read_text()
    assert wait_until(lambda: all(c.state(n) == "Restored" for n in NODES), 10), {n: c.state(n) for n in NODES}
    for sim in c.sims.values():
        assert sim.manifest.read_bytes() == sim.original and sim.kubelet.stray_files == []
    # One at a time: each restore waited for the previous node's scheduler (rollout Lease).
    restores = sorted(sim.kubelet.restarts[-1].at_ns for sim in c.sims.values())
    assert all(b - a > 200_000_000 for a, b in itertools.pairwise(restores)), restores
