"""API faults against the emulator: 500s, 409 on every Lease write, the API down at
start. The file side stays correct, the loop keeps beating, and the agent's thread stays nearly idle while it
waits (a busy retry loop would show as ~100 % of a core).

Waits are on what the agent or the emulator did (requests seen, annotations, probes), never a fixed delay.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.harness.childproc import Child
from tests.harness.emu.kubeemu_ext import KubeEmulatorExt
from tests.harness.helpers import KUBEADM, NODE, Node, Running, kubeadm_node, reconciles, wait_until

LEASE = "/apis/coordination.k8s.io/v1/namespaces/scheduler-patcher/leases"


@pytest.fixture
def xnode(tmp_path: Path) -> Iterator[Node]:
    with kubeadm_node(tmp_path, KubeEmulatorExt) as n:
        yield n


def faults(node: Node) -> KubeEmulatorExt:
    """The emulator of an ``xnode``, as the ``KubeEmulatorExt`` it is (``Node.emu`` is typed as the base)."""
    assert isinstance(node.emu, KubeEmulatorExt)
    return node.emu


def thread_cpu(thread: threading.Thread) -> float:
    """CPU seconds (user + system) one thread of this process has used."""
    tid = thread.native_id
    cpu: float = next(t.user_time + t.system_time for t in psutil.Process().threads() if t.id == tid)
    return cpu


def test_500s_on_every_annotation_write_do_not_touch_the_file_side(xnode: Node) -> None:
    faults(xnode).fail("PATCH", f"/api/v1/nodes/{NODE}", 500, times=10**6)
    agent = Running(xnode, grace_period=2.0)  # the final report cannot get through either
    assert wait_until(lambda: b"--config=" in xnode.manifest.read_bytes(), 30)
    assert wait_until(lambda: len(xnode.emu.requests("PATCH", f"/api/v1/nodes/{NODE}")) >= 3, 30)
    assert wait_until(lambda: agent.health.ready(), 30)  # the pod proves the restart: Ready on its own
    assert agent.thread.is_alive() and agent.health.alive()
    assert xnode.state() is None  # nothing got through
    assert agent.stop() == 0
    assert xnode.manifest.read_bytes() == KUBEADM


def test_409_on_every_lease_write_keeps_the_manifest_untouched_and_the_loop_idle(xnode: Node) -> None:
    faults(xnode).fail("POST", LEASE, 409, times=10**6)
    faults(xnode).fail("PUT", f"{LEASE}/scheduler-patcher-rollout", 409, times=10**6)
    agent = Running(xnode, coordinated=True, lease_retry=3.0)
    assert wait_until(lambda: len(xnode.emu.requests("POST", LEASE)) >= 1, 30)
    cpu0, t0, r0 = thread_cpu(agent.thread), time.monotonic(), reconciles(agent)
    assert wait_until(lambda: reconciles(agent) >= r0 + 2, 60)  # it keeps asking, on its retry timer
    used, span = thread_cpu(agent.thread) - cpu0, time.monotonic() - t0
    assert used / span < 0.05, (used, span)  # a busy retry loop would be ~1.0
    assert xnode.manifest.read_bytes() == KUBEADM  # no turn, no write
    assert agent.thread.is_alive() and agent.health.alive()
    assert agent.agent.node.phase is not None and agent.agent.node.phase.value == "Pending"
    assert agent.stop() == 0
    assert xnode.manifest.read_bytes() == KUBEADM


def test_api_down_at_start_patches_the_file_and_reports_once_it_is_back(xnode: Node) -> None:
    xnode.emu.go_down("refuse")
    child = Child("run", "--host-root", str(xnode.root), "--source", str(xnode.src), "--listen", "127.0.0.1:0",
                  "--rollout", "independent", "--check-extenders=false", "--hold-wait", "2s", "--restart-settle", "1s",
                  env={"NODE_NAME": NODE, "KUBECONFIG": str(xnode.kubeconfig)})
    try:
        assert wait_until(lambda: b"--config=" in xnode.manifest.read_bytes(), 60), child.output
        assert wait_until(lambda: child.get("/healthz") == 200, 30)  # the loop beats with no API
        assert child.get("/readyz") == 503  # not Ready: nothing proved the restart yet
        xnode.emu.come_up()
        assert wait_until(lambda: xnode.state() == "Ready", 60), child.output
        assert wait_until(lambda: child.get("/readyz") == 200, 30)
    finally:
        assert child.terminate() == 0, child.output
    assert xnode.manifest.read_bytes() == KUBEADM
