"""The dead-kubelet stall, end to end: one control-plane node, its simulated kubelet, a kubelet health endpoint
the test answers for, a real ``scheduler-patcher run`` process and the API emulator.

The kubelet stops (no pod restarts, its healthz not healthy) right after the agent's write: past
``--restart-timeout`` the node stays WaitingForRestart and says why, nothing is rolled back, no config is marked
bad (on the node or in the Lease); the kubelet comes back and restarts the scheduler: Ready. Then, with the
kubelet down again, a ConfigMap change is not written at all until the kubelet is healthy again.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, write_configmap
from tests.harness.emu.kubeemu import KubeEmulator, wait_until
from tests.harness.emu.kubeletsim import SimKubelet
from tests.harness.helpers import MANIFEST, P

ROOT = Path(__file__).resolve().parents[2]
NODE = "cp-1"
EXTENDERS = "extenders:\n- urlPrefix: http://127.0.0.1:8889\n  filterVerb: filter\n  weight: {w}\n"
TIMEOUT = 8  # --restart-timeout: the kubelet comes back within the second one


@dataclass
class Healthz:
    """A kubelet's /healthz whose answer the test sets (200 healthy, 500 not)."""

    status: int = 200
    server: http.server.ThreadingHTTPServer | None = None
    hits: list[int] = field(default_factory=list)

    def start(self) -> str:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.hits.append(outer.status)
                body = b"ok" if outer.status == 200 else b"[-]syncloop failed"
                self.send_response(outer.status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}/healthz"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@dataclass
class Node:
    emu: KubeEmulator
    root: Path
    src: Path
    healthz: Healthz
    kubelet: SimKubelet
    log: Path
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start_agent(self) -> None:
        """A new agent process (the log appended to); a running one is killed first (SIGKILL: nothing restored)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=self.log.open("ab"), stderr=subprocess.STDOUT)

    def ann(self) -> dict[str, str]:
        return {k[len(P):]: v for k, v in self.emu.node_annotations(NODE).items() if k.startswith(P)}

    def manifest(self) -> bytes:
        return (self.root / MANIFEST).read_bytes()

    def record(self) -> dict[str, object]:
        data: dict[str, object] = json.loads((self.root / "var/lib/scheduler-patcher/state.json").read_text())
        return data

    def lease_annotations(self) -> dict[str, str]:
        lease = self.emu.get("leases", "scheduler-patcher-rollout", "scheduler-patcher", "coordination.k8s.io") or {}
        return dict((lease.get("metadata") or {}).get("annotations") or {})

    def kubelet_dies(self) -> None:
        self.healthz.status = 500
        self.kubelet.stop()

    def kubelet_comes_back(self) -> None:
        self.healthz.status = 200
        self.kubelet = SimKubelet(self.emu, NODE, self.root).start()  # a new kubelet process: it syncs every pod


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    emu = KubeEmulator().start()
    kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")
    emu.add_node(NODE, labels={"node-role.kubernetes.io/control-plane": ""})
    root = tmp_path / NODE
    (root / "etc/kubernetes/manifests").mkdir(parents=True)
    (root / MANIFEST).write_bytes((FIXTURES / "manifests" / "kubeadm.yaml").read_bytes())
    src = tmp_path / "src"
    src.mkdir()
    write_configmap(src, {"extenders.yaml": EXTENDERS.format(w=1)})
    healthz = Healthz()
    url = healthz.start()
    n = Node(emu, root, src, healthz, SimKubelet(emu, NODE, root).start(), tmp_path / "agent.log")
    n.env = {**os.environ, "PYTHONPATH": str(ROOT), "NODE_NAME": NODE, "KUBECONFIG": str(kubeconfig),
             "POD_NAMESPACE": "scheduler-patcher"}
    n.argv = [sys.executable, "-m", "patcher", "run", "--host-root", str(root), "--source", str(src),
              "--listen", "127.0.0.1:0", "--restart-timeout", f"{TIMEOUT}s", "--restart-settle", "1s",
              "--check-extenders=false", "--kubelet-healthz", url, "--rollout-lease-duration", "30s"]
    n.start_agent()
    yield n
    assert n.proc is not None
    if n.proc.poll() is None:
        n.proc.kill()
        n.proc.wait(10)
    n.kubelet.stop()
    healthz.stop()
    emu.stop()


def test_a_kubelet_outage_is_waited_out_and_never_marks_the_config_bad(node: Node) -> None:
    def says() -> str:
        return f"{node.ann()}\n{node.log.read_text(errors='replace')[-3000:]}"

    assert wait_until(lambda: node.ann().get("state") == "Ready", 30), says()
    first = node.ann()["config-hash"]

    # The kubelet stops restarting pods just as the agent writes: it is healthy at the plan, dead after.
    node.kubelet.stop()
    write_configmap(node.src, {"extenders.yaml": EXTENDERS.format(w=5)})
    assert wait_until(lambda: node.ann().get("state") == "WaitingForRestart", 20), says()
    node.healthz.status = 500
    second = node.ann()["config-hash"]
    assert second != first
    # Past the deadline: still waiting, saying why; no rollback, nothing marked bad.
    assert wait_until(lambda: "kubelet on this node not healthy" in node.ann().get("message", ""), 3 * TIMEOUT), \
        says()
    assert node.ann()["state"] == "WaitingForRestart" and second[:12].encode() in node.manifest()
    assert second not in node.record().get("bad_hashes", [])  # type: ignore[operator]
    assert not any(v for k, v in node.lease_annotations().items() if k.endswith("bad-source-hashes"))

    node.kubelet_comes_back()
    assert wait_until(lambda: node.ann().get("state") == "Ready", 3 * TIMEOUT), says()
    assert node.ann()["config-hash"] == second and not node.ann().get("message")
    assert "PatchRolledBack" not in {e["reason"] for e in node.emu.events("default")}
    assert "KubeletNotHealthy" in {e["reason"] for e in node.emu.events("default")}

    # Down before the next write: nothing is written while it lasts, the node stays Ready on its config.
    node.kubelet_dies()
    patched = node.manifest()
    write_configmap(node.src, {"extenders.yaml": EXTENDERS.format(w=9)})
    assert wait_until(lambda: "holding the write" in node.log.read_text(errors="replace"), 20), says()
    assert node.manifest() == patched and node.ann()["state"] == "Ready" and node.ann()["config-hash"] == second
    node.kubelet_comes_back()
    assert wait_until(lambda: node.ann().get("state") == "Ready" and node.ann()["config-hash"] not in (first, second),
                      30), says()


def test_an_agent_that_adopted_a_ready_node_holds_a_write_when_its_kubelet_dies_later(node: Node) -> None:
    """Journey d's shape: the agent restarted (a rolling update) onto a Ready node makes no write at its start; the
    kubelet dies after; then the turn's change comes. Its start armed the check: the write is held, not made."""
    def says() -> str:
        return f"{node.ann()}\n{node.log.read_text(errors='replace')[-3000:]}"

    assert wait_until(lambda: node.ann().get("state") == "Ready", 30), says()
    ready = node.ann()["config-hash"]
    node.start_agent()
    assert wait_until(lambda: node.log.read_text(errors="replace").count("kubelet health endpoint") >= 2, 30), says()
    node.kubelet_dies()
    patched = node.manifest()
    write_configmap(node.src, {"extenders.yaml": EXTENDERS.format(w=7)})
    assert wait_until(lambda: "holding the write" in node.log.read_text(errors="replace"), 20), says()
    assert node.manifest() == patched and node.ann()["state"] == "Ready" and node.ann()["config-hash"] == ready
    node.kubelet_comes_back()
    assert wait_until(lambda: node.ann().get("state") == "Ready" and node.ann()["config-hash"] != ready, 30), says()
