"""Whole lifecycle: three control-plane nodes, each with its own folders, simulated kubelet and a real
``scheduler-patcher run`` process, against one local Kubernetes API emulator.

install -> all Ready; ConfigMap update -> re-patched one node at a time; kubeadm upgrade on one node ->
re-patched; a config the scheduler rejects -> rolled back on the first node only; SIGTERM -> every manifest
byte-identical to its original (or to its upgraded version). Prints a timeline (``make e2e`` shows it).
The agents probe the extender before each write (a real HTTP server on 127.0.0.1); with the extender down
no node is written until it comes up, and then one node at a time.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, write_configmap
from tests.harness.emu.extservers import ExtenderServer, free_port
from tests.harness.emu.kubeemu import KubeEmulator, wait_until
from tests.harness.emu.kubeletsim import SimKubelet
from tests.harness.helpers import MANIFEST, P

ROOT = Path(__file__).resolve().parents[2]
EXTENDERS = "extenders:\n- urlPrefix: {url}\n  filterVerb: filter\n  weight: {w}\n"
# The extender answers (the probe passes), the simulated scheduler rejects the config ("reject-me").
REJECTED = "extenders:\n- urlPrefix: {url}\n  filterVerb: reject-me\n  weight: 1\n"
# Same scheduler version and flags on every node (so one rendered config hash), different file layouts.
ORIGINALS = {"cp-1": "kubeadm.yaml", "cp-2": "kubeadm.yaml", "cp-3": "kubeadm.yaml (CRLF)"}


@dataclass
class Sim:
    name: str
    root: Path
    src: Path
    original: bytes
    kubelet: SimKubelet
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST

    def configmap(self, text: str) -> None:
        write_configmap(self.src, {"extenders.yaml": text})


@dataclass
class Extender:
    """The extender's address, fixed before the agents start; ``up()`` starts answering there."""

    port: int = field(default_factory=free_port)
    server: ExtenderServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> ExtenderServer:
        self.server = ExtenderServer(port=self.port).__enter__()
        return self.server

    def down(self) -> None:
        if self.server is not None:
            self.server.__exit__(None, None, None)
            self.server = None


@dataclass
class Timeline:
    emu: KubeEmulator
    names: list[str]
    t0: float = field(default_factory=time.monotonic)
    rows: list[tuple[float, str, str, str]] = field(default_factory=list)
    last: dict[str, tuple[str, str]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def ann(self, node: str) -> dict[str, str]:
        return {k[len(P):]: v for k, v in self.emu.node_annotations(node).items() if k.startswith(P)}

    def poll(self) -> None:
        for n in self.names:
            a = self.ann(n)
            now = (a.get("state", "-"), a.get("config-hash", "")[:12])
            if self.last.get(n) != now:
                self.last[n] = now
                self.rows.append((time.monotonic() - self.t0, n, *now))

    def run(self) -> None:
        while not self.stop.wait(0.02):
            self.poll()

    def mark(self, what: str) -> None:
        self.rows.append((time.monotonic() - self.t0, "--", what, ""))

    def all(self, state: str, config_hash: str | None = None) -> bool:
        self.poll()
        return all(self.last.get(n, ("", ""))[0] == state and (config_hash is None or
                   self.ann(n).get("config-hash") == config_hash) for n in self.names)

    def overlaps(self, since: float) -> list[str]:
        """Moments when two nodes were WaitingForRestart at once (must never happen in coordinated mode)."""
        waiting: set[str] = set()
        bad = []
        for t, node, state, _ in self.rows:
            if node == "--" or t < since:
                continue
            (waiting.add if state == "WaitingForRestart" else waiting.discard)(node)
            if len(waiting) > 1:
                bad.append(f"{t:.2f}s {sorted(waiting)}")
        return bad

    def print(self) -> None:
        print("\n  time   node  state              config")
        for t, node, state, h in self.rows:
            print(f"{t:6.2f}s  {node:<5} {state:<18} {h}")


@pytest.fixture
def extender() -> Iterator[Extender]:
    ext = Extender()
    yield ext
    ext.down()


@pytest.fixture
def extender_up() -> bool:
    """Whether the extender answers from the start (a test parametrizes it to False)."""
    return True


@pytest.fixture
def cluster(tmp_path: Path, extender: Extender,
            extender_up: bool) -> Iterator[tuple[KubeEmulator, list[Sim], Timeline]]:
    if extender_up:
        extender.up()
    emu = KubeEmulator().start()
    kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")
    sims = []
    for name, fixture in ORIGINALS.items():
        emu.add_node(name, labels={"node-role.kubernetes.io/control-plane": ""})
        root = tmp_path / name
        (root / "etc/kubernetes/manifests").mkdir(parents=True)
        original = (FIXTURES / "manifests" / fixture.split()[0]).read_bytes()
        if "CRLF" in fixture:
            original = original.replace(b"\n", b"\r\n")
        (root / MANIFEST).write_bytes(original)
        src = tmp_path / f"{name}-src"
        src.mkdir()
        sim = Sim(name, root, src, original, SimKubelet(emu, name, root).start())
        sim.configmap(EXTENDERS.format(url=extender.url, w=1))
        sims.append(sim)
    timeline = Timeline(emu, list(ORIGINALS))
    watcher = threading.Thread(target=timeline.run, daemon=True)
    watcher.start()
    for sim in sims:
        sim.log = tmp_path / f"{sim.name}.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "NODE_NAME": sim.name, "KUBECONFIG": str(kubeconfig),
               "POD_NAMESPACE": "scheduler-patcher"}
        sim.proc = subprocess.Popen(
            [sys.executable, "-m", "patcher", "run", "--host-root", str(sim.root), "--source", str(sim.src),
             "--listen", "127.0.0.1:0", "--restart-timeout", "20s",
             # kubeletsim shows a refused scheduler ready for 0.3 s (no startup probe): well above that
             "--restart-settle", "2s", "--rollout-lease-duration", "10s",
             "--compat-csi-baremetal=true", "--log-format", "json"],
            env=env, stdout=sim.log.open("wb"), stderr=subprocess.STDOUT)
    yield emu, sims, timeline
    timeline.stop.set()
    for sim in sims:
        if sim.proc and sim.proc.poll() is None:
            sim.proc.kill()
        sim.kubelet.stop()
    emu.stop()


def test_whole_lifecycle(cluster: tuple[KubeEmulator, list[Sim], Timeline], extender: Extender) -> None:
    _, sims, tl = cluster
    by = {s.name: s for s in sims}

    tl.mark("install")
    assert wait_until(lambda: tl.all("Ready"), 40), tl.last
    first = tl.ann("cp-1")["config-hash"]
    assert tl.all("Ready", first)
    assert tl.overlaps(0) == []

    def published(name: str, key: str) -> str:
        cm = tl.emu.get("configmaps", name, "scheduler-patcher") or {}
        return str((cm.get("data") or {}).get(key, ""))

    assert wait_until(lambda: published("scheduler-patcher-status", "ready") == "true", 10)
    assert wait_until(lambda: published("extender-readiness", "nodes.yaml").count("restarted: true") == 3, 10)

    tl.mark("ConfigMap update")
    since = time.monotonic() - tl.t0
    for sim in sims:
        sim.configmap(EXTENDERS.format(url=extender.url, w=5))
    assert wait_until(lambda: tl.all("Ready") and tl.ann("cp-1")["config-hash"] != first
                      and len({tl.ann(n)["config-hash"] for n in by}) == 1, 40), tl.last
    assert tl.overlaps(since) == []

    tl.mark("kubeadm upgrade on cp-2")
    upgraded = by["cp-2"].original.replace(b"v1.31.2", b"v1.32.0")
    by["cp-2"].manifest.write_bytes(upgraded)
    assert wait_until(lambda: b"--config=" in by["cp-2"].manifest.read_bytes(), 5)
    assert wait_until(lambda: tl.all("Ready") and b"v1.32.0" in by["cp-2"].manifest.read_bytes(), 20), tl.last
    live = {n: tl.ann(n)["config-hash"] for n in by}  # cp-2 now renders for its new version
    assert live["cp-2"] != live["cp-1"] == live["cp-3"]
    assert len({tl.ann(n)["source-hash"] for n in by}) == 1  # but all run the same ConfigMap

    tl.mark("rejected config")
    restarts = {s.name: len(s.kubelet.restarts) for s in sims}
    for sim in sims:
        sim.configmap(REJECTED.format(url=extender.url))
    assert wait_until(lambda: sum(tl.last[n][0] == "RolledBack" for n in by) == 1, 40), tl.last
    rolled = [n for n in by if tl.last[n][0] == "RolledBack"]

    def skipped() -> list[str]:
        return sorted(e["involvedObject"]["name"] for e in tl.emu.events("default") if e["reason"] == "PatchSkipped")
    # The others had their turn once each said why it keeps its config: they decided, and did not roll back.
    assert wait_until(lambda: skipped() == sorted(n for n in by if n not in rolled), 40), skipped()
    assert [n for n in by if tl.last[n][0] == "RolledBack"] == rolled, tl.last
    back = by[rolled[0]].kubelet  # the kubelet may record the rollback's start after the agent says RolledBack
    assert wait_until(lambda: len(back.restarts) >= restarts[rolled[0]] + 2, 20), back.restarts
    for name, sim in by.items():
        if name in rolled:
            assert len(sim.kubelet.restarts) == restarts[name] + 2  # the bad one, then the rollback
        else:
            assert len(sim.kubelet.restarts) == restarts[name]  # never wrote the bad config
            assert tl.last[name] == ("Ready", live[name][:12])

    tl.mark("SIGTERM to all")
    for sim in sims:
        assert sim.proc is not None
        sim.proc.send_signal(signal.SIGTERM)
    for sim in sims:
        assert sim.proc is not None
        assert sim.proc.wait(30) == 0, sim.log.read_text() if sim.log else ""
    assert wait_until(lambda: tl.all("Restored"), 10), tl.last
    for name, sim in by.items():
        expected = upgraded if name == "cp-2" else sim.original
        assert sim.manifest.read_bytes() == expected, name
        assert sim.kubelet.stray_files == []
    # Uninstall takes turns too: each restore waited for the previous node's scheduler (rollout Lease).
    restores = sorted(sim.kubelet.restarts[-1].at_ns for sim in sims)
    assert all(b - a > 200_000_000 for a, b in itertools.pairwise(restores)), restores
    tl.print()


@pytest.mark.parametrize("extender_up", [False])
def test_no_node_is_written_until_the_extender_answers(cluster: tuple[KubeEmulator, list[Sim], Timeline],
                                                       extender: Extender) -> None:
    emu, sims, tl = cluster
    tl.mark("install, extender down")
    refused = f"extender {extender.url}/filter does not answer: connection refused"

    def held_back(n: str) -> bool:
        return tl.ann(n).get("state") == "Pending" and tl.ann(n).get("message", "").startswith(refused)

    assert wait_until(lambda: all(held_back(s.name) for s in sims), 40), {s.name: tl.ann(s.name) for s in sims}
    for sim in sims:
        assert sim.manifest.read_bytes() == sim.original, sim.name  # nothing written anywhere
    lease = emu.get("leases", "scheduler-patcher-rollout", "scheduler-patcher", "coordination.k8s.io")
    assert lease is None or not (lease.get("spec") or {}).get("holderIdentity")  # no turn taken
    def unreachable() -> set[str]:
        return {e["involvedObject"]["name"] for e in emu.events("default")
                if e["reason"] == "ExtenderUnreachable" and e["type"] == "Warning"}

    assert wait_until(lambda: unreachable() == {s.name for s in sims}, 10), unreachable()
    since = time.monotonic() - tl.t0

    tl.mark("extender up")
    server = extender.up()
    assert wait_until(lambda: tl.all("Ready"), 90), tl.last  # the agents' retries find it: no manual step
    assert tl.overlaps(since) == []  # one node at a time
    assert len({tl.ann(s.name)["config-hash"] for s in sims}) == 1
    assert all("message" not in tl.ann(s.name) for s in sims)
    assert len(server.bodies) >= 3  # each agent probed before its write
    for sim in sims:
        assert sim.proc is not None
        sim.proc.send_signal(signal.SIGTERM)
    for sim in sims:
        assert sim.proc is not None
        assert sim.proc.wait(30) == 0
    tl.print()
