"""The simulated kubelet follows what the real one was seen doing (tests/real/test_real_kubelet.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from tests.conftest import FIXTURES
from tests.harness.emu.kubeemu import KubeEmulator
from tests.harness.emu.kubeletsim import SimKubelet
from tests.harness.helpers import MANIFEST

ROOT = Path(__file__).resolve().parents[2]

NODE = "cp-1"


def mirror(emu: KubeEmulator) -> tuple[str, str]:
    pod = emu.get("pods", f"kube-scheduler-{NODE}", "kube-system")
    assert pod is not None
    return pod["metadata"]["uid"], pod["metadata"]["annotations"]["kubernetes.io/config.hash"]


def test_a_byte_only_change_restarts_nothing_and_a_changed_pod_restarts(tmp_path: Path) -> None:
    original = (FIXTURES / "manifests" / "kubeadm.yaml").read_bytes()
    manifest = tmp_path / MANIFEST
    manifest.parent.mkdir(parents=True)
    manifest.write_bytes(original)
    with KubeEmulator() as emu:
        kubelet = SimKubelet(emu, NODE, tmp_path)
        kubelet.sync()
        first = mirror(emu)
        manifest.write_bytes((original.decode() + "# a comment\n").replace("\n", "\r\n").encode())
        kubelet.sync()
        assert mirror(emu) == first and len(kubelet.restarts) == 1
        manifest.write_bytes(original.replace(b"    - --leader-elect=true\n", b"    - --leader-elect=true\n"
                                                                              b"    - --v=1\n"))
        kubelet.sync()
        uid, config_hash = mirror(emu)
        assert uid != first[0] and config_hash != first[1] and len(kubelet.restarts) == 2
        assert len(config_hash) == 32  # the real kubelet's: the hex of an md5


class Recorder:
    """A PodSink that keeps every pod as published."""

    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []

    def set_pod(self, pod: dict[str, Any]) -> object:
        self.pods.append(copy.deepcopy(pod))
        return pod


def container(pod: dict[str, Any]) -> tuple[str, str, int, str]:
    """(phase, state, restartCount, lastState) with the waiting reason or the exit code in the state; a pod as
    created, before the kubelet's first status, is ``created``."""
    if not pod["status"].get("containerStatuses"):
        return pod["status"]["phase"], "created", 0, ""
    status = pod["status"]["containerStatuses"][0]
    (kind, detail), = status["state"].items()
    shown = f"{kind}:{detail.get('reason', '')}" if kind == "waiting" else kind
    shown += f":{detail['exitCode']}" if kind == "terminated" else ""
    last = next(iter(status.get("lastState") or {}), "")
    return pod["status"]["phase"], shown, status["restartCount"], last


def test_a_refused_config_goes_through_the_real_kubelets_crash_loop(tmp_path: Path) -> None:
    """What the real 1.37 kubelet published for a kube-scheduler that exits 1 on its config (seen through the
    real mirror pod, tests/real/test_real_kubelet.py): created, exited, restarted at once, exited, back-off 10 s,
    restarted, exited, back-off 20 s. kubeletsim published CrashLoopBackOff with restartCount 1 at once and then
    only raised the count, with no exit code and no lastState. The manifest is the one that run used, examples'
    kubeadm one, whose startup probe keeps each run unready."""
    original = (ROOT / "examples" / "manifests" / "kube-scheduler.yaml").read_text()
    assert "startupProbe" in original
    manifest = tmp_path / MANIFEST
    manifest.parent.mkdir(parents=True)
    (tmp_path / "etc/kubernetes/refused.yaml").write_text("reject-me\n")
    manifest.write_text(original.replace("    - --leader-elect=true\n", "    - --leader-elect=true\n"
                                                                      "    - --config=/etc/kubernetes/refused.yaml\n"))
    sink = Recorder()
    kubelet = SimKubelet(sink, NODE, tmp_path)
    kubelet.sync()
    for _ in range(6):
        kubelet._crash_again()
    assert [container(p) for p in sink.pods] == [
        ("Pending", "created", 0, ""),
        ("Pending", "waiting:ContainerCreating", 0, ""),
        ("Running", "terminated:1", 0, ""),
        ("Running", "running", 1, "terminated"),
        ("Running", "terminated:1", 1, "terminated"),
        ("Running", "waiting:CrashLoopBackOff", 1, "terminated"),
        ("Running", "running", 2, "terminated"),
        ("Running", "terminated:1", 2, "terminated"),
        ("Running", "waiting:CrashLoopBackOff", 2, "terminated"),
    ]
    messages = [p["status"]["containerStatuses"][0]["state"].get("waiting", {}).get("message")
                for p in sink.pods[1:]]
    assert [m.split(" restarting")[0] for m in messages if m] == ["back-off 10s", "back-off 20s"]
    assert kubelet.restarts[-1].crashed


def test_a_refused_scheduler_without_probes_shows_ready_while_it_lives(tmp_path: Path) -> None:
    """RKE2's manifest has no startup or readiness probe: the real kubelet showed the refused scheduler
    `ready: true` and the pod Ready for the second each run lives (tests/real/test_real_kubelet.py), its first run
    included. Only the running states are ready; with kubeadm's startup probe none is."""
    original = (FIXTURES / "manifests" / "args-rke2.yaml").read_text()
    assert "startupProbe" not in original and "readinessProbe" not in original and "uid:" in original
    manifest = tmp_path / MANIFEST
    manifest.parent.mkdir(parents=True)
    (tmp_path / "etc/kubernetes/refused.yaml").write_text("reject-me\n")
    manifest.write_text(original.replace("    - --kubeconfig=", "    - --config=/etc/kubernetes/refused.yaml\n"
                                                             "    - --kubeconfig=", 1))
    sink = Recorder()
    kubelet = SimKubelet(sink, NODE, tmp_path)
    kubelet.sync()
    for _ in range(4):
        kubelet._crash_again()

    def ready(pod: dict[str, Any]) -> bool:
        status = pod["status"]
        condition = next((c["status"] for c in status.get("conditions") or [] if c["type"] == "Ready"), None)
        return condition == "True" and bool(status.get("containerStatuses")) \
            and status["containerStatuses"][0]["ready"] is True
    assert [(*container(p), ready(p)) for p in sink.pods] == [
        ("Pending", "created", 0, "", False),
        ("Pending", "waiting:ContainerCreating", 0, "", False),
        ("Running", "running", 0, "", True),
        ("Running", "terminated:1", 0, "", False),
        ("Running", "running", 1, "terminated", True),
        ("Running", "terminated:1", 1, "terminated", False),
        ("Running", "waiting:CrashLoopBackOff", 1, "terminated", False),
    ]
    assert kubelet.restarts[-1].crashed


def test_a_new_mirror_pod_is_pending_before_it_runs(tmp_path: Path) -> None:
    manifest = tmp_path / MANIFEST
    manifest.parent.mkdir(parents=True)
    manifest.write_bytes((FIXTURES / "manifests" / "kubeadm.yaml").read_bytes())
    sink = Recorder()
    SimKubelet(sink, NODE, tmp_path).sync()
    assert [container(p) for p in sink.pods] == [("Pending", "created", 0, ""),
                                                ("Pending", "waiting:ContainerCreating", 0, ""),
                                                ("Running", "running", 0, "")]
    assert len({p["metadata"]["uid"] for p in sink.pods}) == 1


def test_an_edit_that_keeps_the_manifests_uid_restarts_nothing(tmp_path: Path) -> None:
    """What the real 1.37 kubelet did with an RKE2 manifest (its own metadata.uid) edited in place: an update, the
    old container left running; only a new UID is a new pod (the agent writes one, patcher.core.manifestedit)."""
    original = (FIXTURES / "manifests" / "args-rke2.yaml").read_text()
    manifest = tmp_path / MANIFEST
    manifest.parent.mkdir(parents=True)
    manifest.write_text(original)
    sink = Recorder()
    kubelet = SimKubelet(sink, NODE, tmp_path)
    kubelet.sync()
    started = len(sink.pods)
    manifest.write_text(original.replace("    - --profiling=false\n", "    - --profiling=false\n    - --v=2\n"))
    kubelet.sync()
    assert len(sink.pods) == started and len(kubelet.restarts) == 1
    manifest.write_text(original.replace("    - --profiling=false\n", "    - --profiling=false\n    - --v=2\n")
                        .replace("uid: 1f3d2c4e-0000-4000-8000-000000000001",
                                 "uid: 1f3d2c4e-0000-4000-8000-0000000000ff"))
    kubelet.sync()
    assert len(kubelet.restarts) == 2 and len(sink.pods) == started + 3  # created, container created, running
