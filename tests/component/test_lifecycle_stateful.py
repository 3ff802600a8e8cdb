"""Hypothesis *stateful* test of the agent's lifecycle on real files.

Random sequences of: config changes, a ConfigMap typo and its fix, a config the scheduler rejects (crash
loop), an external manifest rewrite (kubeadm upgrade), kubelet syncs and further crashes, the API going down
and up, the agent crashing (kill -9) and restarting, and SIGTERM at any step. The agent is driven step by step
(no loop thread, no sleeps); the kubelet is a small fake that starts a mirror pod for every new manifest content.
After every step:

* the manifest parses and is the current original or that original plus exactly our patch;
* ``Ready`` only when the pod proves it (the kubelet runs the current manifest and it does not crash);
* health equals state;
* a config that rolled back is never written again;
* after SIGTERM the original comes back byte for byte.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from ruamel.yaml import YAML

from patcher.core import manifestedit
from patcher.core.lifecycle import LoopEvent
from patcher.core.settings import Files
from patcher.core.status import NodeState
from patcher.core.timefmt import rfc3339
from patcher.services.agent import Agent
from tests.conftest import write_configmap
from tests.harness.emu.kubeemu import make_mirror_pod
from tests.harness.helpers import KUBEADM, MANIFEST, node_folders
from tests.harness.settings import build_settings

GOOD = "extenders:\n- urlPrefix: http://127.0.0.1:8889\n  filterVerb: filter\n  weight: {w}\n"
SOURCES = {
    "good-1": GOOD.format(w=1),
    "good-2": GOOD.format(w=2),
    "typo": GOOD.format(w=1).replace("http://127.0.0.1:8889", "not a url"),
    "rejected": GOOD.format(w=1).replace("127.0.0.1:8889", "reject-me.example:8889"),
}


class FakeKubelet:
    """Starts a mirror pod for every new content of the manifest; a config with ``reject-me`` crash-loops."""

    def __init__(self, root: Path, wall_ns: Callable[[], int] = time.time_ns) -> None:
        """``wall_ns``: the node's clock, read for a container's ``startedAt``."""
        self.root, self.wall_ns = root, wall_ns
        self.pod: dict[str, Any] | None = None
        self.digest = ""
        self.crashing = False
        self.api_up = True
        self.pod_name, self.fresh = "kube-scheduler-cp-1", True  # a PodSource: one mirror pod, always followed

    def sync(self) -> None:
        data = (self.root / MANIFEST).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest == self.digest:
            return
        doc = YAML(typ="safe").load(data.decode())
        container = next(c for c in doc["spec"]["containers"] if c.get("name") == "kube-scheduler")
        self.crashing = self._rejects(container)
        annotations = {**(doc["metadata"].get("annotations") or {}), "kubernetes.io/config.hash": digest[:32]}
        # A container starts after its kubelet read the manifest, so never before that file's mtime (the agent's
        # write stamp). Not time.gmtime(): it reads time(2), the kernel's coarse clock, which still names the
        # second before for up to a tick after a boundary that the write's time_ns had passed.
        started_ns = max(self.wall_ns(), (self.root / MANIFEST).stat().st_mtime_ns)
        self.pod = make_mirror_pod(node_name="cp-1", annotations=annotations, started_at=rfc3339(started_ns, 0),
                                   waiting_reason="CrashLoopBackOff" if self.crashing else None,
                                   restart_count=1 if self.crashing else 0, ready=not self.crashing)
        self.pod["metadata"]["uid"] = digest
        self.digest = digest

    def crash_again(self) -> None:
        if self.pod is not None and self.crashing:
            self.pod["status"]["containerStatuses"][0]["restartCount"] += 1

    def _rejects(self, container: dict[str, Any]) -> bool:
        for item in [*(container.get("command") or []), *(container.get("args") or [])]:
            if isinstance(item, str) and item.startswith("--config="):
                try:
                    return "reject-me" in (self.root / item.split("=", 1)[1].lstrip("/")).read_text()
                except OSError:
                    return True
        return False

    def latest(self) -> dict[str, Any] | None:  # the PodSource the agent reads
        return self.pod if self.api_up else None


class Lifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="lifecycle-"))
        self.root, self.src = node_folders(self.tmp, source=SOURCES["good-1"])
        self.original = KUBEADM
        self.kubelet = FakeKubelet(self.root)
        self.kubelet.sync()
        self.version = 31
        self.written_bad: set[str] = set()  # configs recorded as rolled back
        self.agent = self._start()

    def teardown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- driving the agent like its loop does, one step at a time ----------------------------------------

    def _start(self) -> Agent:
        files = Files(source=self.src, host_root=self.root)
        config = build_settings(check_extenders=False, files=files, node_name="cp-1", restart_timeout=3600.0)
        agent = Agent(config, pods=self.kubelet)
        agent.start()
        self._drain(agent)
        return agent

    def _drain(self, agent: Agent | None = None) -> None:
        agent = agent or self.agent
        while not agent.events.empty():
            if agent.events.get_nowait() in ("manifest", "source"):
                agent.reconcile("manifest changed")
        agent.notify(LoopEvent.POD)  # what a mirror pod update does
        assert agent.turn() is LoopEvent.POD
        self.written_bad |= set(agent.node.record.bad_hashes)

    @property
    def manifest_bytes(self) -> bytes:
        return (self.root / MANIFEST).read_bytes()

    # -- rules -------------------------------------------------------------------------------------------

    @rule(source=st.sampled_from(sorted(SOURCES)))
    def change_source(self, source: str) -> None:
        write_configmap(self.src, {"extenders.yaml": SOURCES[source]})
        self.agent.reconcile("source changed")
        self._drain()

    @rule()
    def external_rewrite(self) -> None:
        """kubeadm upgrade: a fresh manifest without our items, written by rename."""
        self.version += 1
        self.original = KUBEADM.replace(b"v1.31.2", f"v1.{self.version}.0".encode())
        tmp = self.root / "etc/kubernetes/manifests/.kubeadm.tmp"
        tmp.write_bytes(self.original)
        tmp.replace(self.root / MANIFEST)
        self.agent.reconcile("manifest changed")
        self._drain()

    @rule()
    def kubelet_sync(self) -> None:
        self.kubelet.sync()
        self._drain()

    @rule()
    def scheduler_crashes_again(self) -> None:
        self.kubelet.crash_again()
        self._drain()

    @rule()
    def a_rejected_config_crash_loops(self) -> None:
        """The whole story in one rule, so short sequences reach the rollback and what follows it."""
        write_configmap(self.src, {"extenders.yaml": SOURCES["rejected"]})
        self.agent.reconcile("source changed")
        self.kubelet.sync()
        for _ in range(3):
            self.kubelet.crash_again()
            self._drain()
        self.kubelet.sync()
        self._drain()

    @rule()
    def resync(self) -> None:
        self.agent.reconcile("resync")
        self._drain()

    @rule(up=st.booleans())
    def api(self, up: bool) -> None:
        self.kubelet.api_up = up
        self._drain()

    @rule()
    def agent_killed_and_restarted(self) -> None:
        self.agent = self._start()  # kill -9: no shutdown, the record and the manifest stay as they are

    @rule()
    def sigterm(self) -> None:
        assert self.agent.shutdown() == 0
        assert self.manifest_bytes == self.original  # byte for byte
        assert self.agent.node.phase == NodeState.RESTORED and self.agent.health.state == NodeState.RESTORED
        self.kubelet.sync()
        self.agent = self._start()  # the DaemonSet starts a new pod

    # -- invariants --------------------------------------------------------------------------------------

    @invariant()
    def manifest_is_the_original_or_the_original_plus_exactly_our_patch(self) -> None:
        text = self.manifest_bytes.decode()
        manifestedit.parse_manifest(text, MANIFEST)
        restored = manifestedit.restore(text, MANIFEST, prefix="scheduler-patcher.io", container_name=None)
        assert restored.encode() == self.original

    @invariant()
    def ready_only_when_the_pod_proves_it(self) -> None:
        if self.agent.node.phase == NodeState.READY:
            assert self.kubelet.digest == hashlib.sha256(self.manifest_bytes).hexdigest()
            assert not self.kubelet.crashing

    @invariant()
    def health_equals_state(self) -> None:
        phase = self.agent.node.phase
        if phase is not None:
            assert self.agent.health.state == phase.value
        self.agent.health.beat()
        assert self.agent.health.ready() == (phase == NodeState.READY)

    @invariant()
    def a_config_that_rolled_back_is_never_written_again(self) -> None:
        marker = manifestedit.inspect(manifestedit.parse_manifest(self.manifest_bytes.decode(), MANIFEST), MANIFEST,
                                      prefix="scheduler-patcher.io", container_name=None).marker
        if marker is not None:
            assert not any(h.startswith(marker.hash) for h in self.written_bad)


TestLifecycle = Lifecycle.TestCase
TestLifecycle.settings = settings(max_examples=25, stateful_step_count=20, deadline=None,
                                  suppress_health_check=[HealthCheck.too_slow])


def test_the_fake_kubelet_starts_no_container_before_the_manifest_it_runs(tmp_path: Path) -> None:
    """The agent's tests prove Ready with this kubelet after one pod turn. Its clock a second behind the write (as
    time(2) is for a tick past a second boundary): the container it starts still proves the restart."""
    root, src = node_folders(tmp_path, source=SOURCES["good-1"])
    kubelet = FakeKubelet(root, wall_ns=lambda: time.time_ns() - 1_000_000_000)
    kubelet.sync()
    agent = Agent(build_settings(check_extenders=False, files=Files(source=src, host_root=root), node_name="cp-1",
                                 restart_timeout=3600.0, restart_settle=0.0), pods=kubelet)
    agent.start()
    assert agent.node.wait is not None
    kubelet.sync()
    agent.notify(LoopEvent.POD)  # what a mirror pod update does
    assert agent.turn() is LoopEvent.POD
    assert agent.node.phase == NodeState.READY
