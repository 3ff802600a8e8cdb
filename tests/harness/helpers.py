"""What many test files need and used to copy: the node's paths and texts, a node folder on tmp_path or on
pyfakefs, a snapshot of a file tree, a kubeadm node against the API emulator with an agent running in a thread,
a fake clock, and waits on what happened.

One place, so that a change of the harness (a new agent option, a different emulator set-up) is made once. The
fixtures that use these live in the test files (``node`` below is one pytest fixture a test module imports).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pyfakefs.fake_filesystem import FakeFilesystem

from patcher.adapters import fsio
from patcher.adapters.health import Metrics
from patcher.core import schedconfig
from patcher.core.lifecycle import LoopEvent
from patcher.core.settings import Api, Files, Rollout, Status
from patcher.services import process
from patcher.services.runner import ApiParts, Deferred, api_client, build_agent
from tests.conftest import FIXTURES, write_configmap
from tests.harness.emu.kubeemu import KubeEmulator, wait_until
from tests.harness.emu.kubeletsim import SimKubelet
from tests.harness.settings import build_settings

# ``node`` is a fixture and ``wait_until`` a re-export: named here so that a test module's import of them counts.
__all__ = ["EXTENDERS", "KUBEADM", "MANIFEST", "NODE", "SCHEDULER_CONFIG", "SCHEMAS", "Clock", "Node", "P",
           "Running", "cli_args", "cli_node", "fake_node", "kubeadm_node", "node", "node_folders", "reconciles",
           "settled", "snapshot", "wait_until"]

ROOT = Path(__file__).resolve().parents[2]
NODE = "cp-1"
#: The manifest's node path, relative to a host root.
MANIFEST = "etc/kubernetes/manifests/kube-scheduler.yaml"
KUBEADM = (FIXTURES / "manifests" / "kubeadm.yaml").read_bytes()
#: A valid source (one extender on 127.0.0.1:8889), as the ConfigMap carries it.
EXTENDERS = "extenders:\n- urlPrefix: http://127.0.0.1:8889\n  filterVerb: filter\n  weight: 1\n"
#: A valid source written as a whole KubeSchedulerConfiguration.
SCHEDULER_CONFIG = """apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
extenders:
- urlPrefix: http://127.0.0.1:8889
  filterVerb: filter
"""
P = "scheduler-patcher.io/"
#: The package data the config validator reads: a pyfakefs file system needs it mapped in.
SCHEMAS = Path(schedconfig.__file__).parent / "schemas"


class Clock:
    """A monotonic clock the test moves by hand (``clock.now += 5``)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def node_folders(base: Path, original: bytes = KUBEADM, source: str | None = EXTENDERS) -> tuple[Path, Path]:
    """A node without an API: ``base/node`` with the kubelet's manifest folder and ``original`` as the
    manifest, ``base/src`` as the mounted ConfigMap holding ``source`` as ``extenders.yaml`` (None: empty).
    Returns (host root, source folder)."""
    root = base / "node"
    (root / MANIFEST).parent.mkdir(parents=True)
    (root / MANIFEST).write_bytes(original)
    src = base / "src"
    src.mkdir()
    if source is not None:
        write_configmap(src, {"extenders.yaml": source})
    return root, src


def cli_node(base: Path) -> Path:
    """A copy of a kubeadm node below `base` for the CLI's tests: kubeadm's scheduler manifest below `node/`, the
    example scheduler configuration in `src/`. Each test gets its own, since the commands write to it."""
    (base / "node/etc/kubernetes/manifests").mkdir(parents=True)
    shutil.copy(FIXTURES / "manifests/kubeadm.yaml", base / "node" / MANIFEST)
    shutil.copytree(ROOT / "examples/scheduler-config", base / "src")
    return base


def cli_args(base: Path, *words: str) -> list[str]:
    """A command line of `words` on the node copy `cli_node(base)` made: its host root and source."""
    return [*words, "--host-root", str(base / "node"), "--source", str(base / "src")]


def fake_node(fs: FakeFilesystem, *, schemas: bool = True) -> None:
    """A node on pyfakefs, without a host root: the schemas (unless the test maps them in itself), the kubeadm
    manifest at its node path and the source ``/src/config.yaml`` (``Files(source=Path("/src"))``)."""
    if schemas:
        fs.add_real_directory(SCHEMAS, read_only=True)
    fs.create_file("/" + MANIFEST, contents=KUBEADM.decode())
    fs.create_file("/src/config.yaml", contents=SCHEDULER_CONFIG)


def snapshot(root: str = "/", *, skip: Callable[[str], bool] = lambda path: False) -> dict[str, bytes | None]:
    """Every folder (``path/``: None) and file (its bytes) below ``root``, but the paths ``skip`` says."""
    out: dict[str, bytes | None] = {}
    for folder, dirs, files in os.walk(root):
        for d in dirs:
            if not skip(path := os.path.join(folder, d) + "/"):
                out[path] = None
        for f in files:
            if not skip(path := os.path.join(folder, f)):
                out[path] = Path(path).read_bytes()
    return out


@dataclass
class Node:
    root: Path
    src: Path
    emu: KubeEmulator
    kubelet: SimKubelet
    kubeconfig: Path
    #: The agents started on this node: the node's teardown stops those a failed test left running, so that
    #: their threads (watches retrying a stopped emulator) cannot reach the tests that follow on the worker.
    agents: list[Running] = field(default_factory=list)

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST

    def annotations(self) -> dict[str, str]:
        return {k[len(P):]: v for k, v in self.emu.node_annotations(NODE).items() if k.startswith(P)}

    def state(self) -> str | None:
        return self.annotations().get("state")

    def set_source(self, text: str) -> None:
        write_configmap(self.src, {"extenders.yaml": text})


@contextlib.contextmanager
def kubeadm_node(tmp_path: Path, emulator: type[KubeEmulator] = KubeEmulator,
                 original: bytes = KUBEADM) -> Iterator[Node]:
    """A kubeadm node (manifest ``original``, ConfigMap mount, simulated kubelet) against a fresh API emulator."""
    root, src = node_folders(tmp_path, original)
    emu = emulator().start()
    emu.add_node(NODE)
    kubelet = SimKubelet(emu, NODE, root).start()
    n = Node(root, src, emu, kubelet, emu.write_kubeconfig(tmp_path / "kubeconfig"))
    try:
        yield n
    finally:
        for agent in n.agents:
            if not agent.stopped:  # the test failed before its own stop: show where every thread was
                faulthandler.dump_traceback(all_threads=True)
            agent.stop()
        kubelet.stop()
        emu.stop()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    with kubeadm_node(tmp_path) as n:
        yield n


class Running:
    """An agent in a thread, built by ``runner.build_agent`` as ``run`` builds it, with fast retries."""

    def __init__(self, node: Node, *, coordinated: bool = False, publish: bool = False, deferred: bool = False,
                 file_ops: fsio.FileOps = fsio.REAL, **overrides: object) -> None:
        files = Files(source=node.src, host_root=node.root)
        overrides.setdefault("check_extenders", False)  # the fixtures' extenders do not answer: a test opts in
        # kubeletsim's scheduler exits at its start or never: a test whose config it refuses on a manifest
        # without a startup probe (it then shows ready while it lives) opts in to a settle time
        overrides.setdefault("restart_settle", 0.0)
        self.config = build_settings(
            files=files, node_name=NODE, debounce=0.05,
            api=Api(kubeconfig=str(node.kubeconfig), timeout=(1.0, 2.0), backoff=(0.05, 0.5)),
            rollout=Rollout(mode="coordinated" if coordinated else "independent", retry=0.2),
            status=Status(publish=publish), **overrides)  # type: ignore[arg-type]
        settings = self.config.api
        assert settings is not None
        # Deferred: built in the connect thread, as `run` does it; else built here and attached from the start.
        self.wiring = build_agent(self.config, Deferred(lambda: api_client(settings)) if deferred
                                  else api_client(settings), file_ops=file_ops)
        self.agent, self.metrics, self.health = self.wiring.agent, self.wiring.metrics, self.wiring.health
        self.wiring.start()
        self.code: int | None = None
        self.stopped = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        node.agents.append(self)
        self.thread.start()

    @property
    def parts(self) -> ApiParts:
        assert self.wiring.parts is not None
        return self.wiring.parts

    def _run(self) -> None:
        self.code = process.run(self.agent)

    def stop(self) -> int | None:
        """Stop the agent and wait for it; again (the node's teardown after the test's own stop) does nothing."""
        if not self.stopped:
            self.stopped = True
            self.agent.request_stop()
            self.thread.join(30)  # a stop may use up to its grace period (25 s) on a loaded machine
            self.wiring.close()
        return self.code


def metric(metrics: Metrics, name: str, **labels: str) -> float | None:
    """The value of one sample of ``metrics``' ``/metrics`` text (None when there is no such sample)."""
    from prometheus_client.parser import text_string_to_metric_families

    return next((s.value for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples
                 if s.name == name and s.labels == labels), None)


def reconciles(agent: Running) -> float:
    return metric(agent.metrics, "scheduler_patcher_reconciles_total") or 0.0


def settled(agent: Running) -> None:
    """Make the agent reconcile twice more and wait for it: whatever it would still do, it has done by then."""
    def reached(target: float) -> Callable[[], bool]:
        return lambda: reconciles(agent) >= target

    for _ in range(2):
        done = reached(reconciles(agent) + 1)
        agent.agent.notify(LoopEvent.SOURCE)
        assert wait_until(done, 30)
