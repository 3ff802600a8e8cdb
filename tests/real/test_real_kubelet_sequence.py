"""What the real kubelet shows of kube-scheduler's restart: recorded on a `kubeadm init` node, kept as a fixture.

The agent judges the restart it caused from the mirror pod's watch events and the node's process table. Its
stand-ins (tests/harness/emu/kubeletsim.py, the simulated nodes of tests/harness/real/simnodes.py) make up both;
this test records what the newest release's kubelet really makes the API server send, and the scheduler process it
really starts, for the agent's patch, its restore, and writes that change nothing the kubelet decodes (a touch, the
same bytes by rename, the same pod with its keys in another order). It writes
tests/fixtures/kubelet/kube-scheduler-sequence.json when `RECORD_KUBELET_SEQUENCE=1`, and otherwise holds the run
against that fixture's shape (tests/harness/mirrorseq.py), which tests/component/test_kubeletsim_sequence.py holds
the stand-in to in every `make test`.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import psutil
import pytest
from ruamel.yaml import YAML

from patcher.core import manifestedit, restart
from tests.conftest import write_configmap
from tests.harness import mirrorseq
from tests.harness.real.controlplane import wait_until
from tests.harness.real.kubeadm_node import MANIFESTS, KubeadmNode, kubeadm_node, releases_with_kubeadm
from tests.real.test_real_kubeadm import CONFIG_DIR, EXTENDERS, patcher, require_kubeadm

pytestmark = pytest.mark.real_kubeadm

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "kubelet" / "kube-scheduler-sequence.json"
MARKER = manifestedit.marker_key("scheduler-patcher.io")
#: The kubelet reads the manifest folder on inotify and again every 20 s (`fileCheckFrequency`): a write that
#: restarts nothing has had its chance after this long.
NO_OP_WINDOW = 25.0
#: After the new scheduler runs and is ready: what the kubelet still sends (a late status, the old pod's end).
TAIL = 8.0


class Recorder:
    """The mirror pod's watch events (kubectl in the node, as kubeadm's admin) and the node's kube-scheduler
    processes (pid, start), each stamped on arrival with this machine's wall clock."""

    def __init__(self, node: KubeadmNode) -> None:
        self.node = node
        self.name = f"kube-scheduler-{node.name}"
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        self.processes: list[tuple[int, int, float]] = []  # (seen ns, pid, process start epoch s)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watch: subprocess.Popen[str] | None = None

    def start(self) -> Recorder:
        pod = self.node.get(f"/api/v1/namespaces/kube-system/pods/{self.name}")
        assert pod is not None
        self.events.append((time.time_ns(), "GET", pod))
        path = (f"/api/v1/namespaces/kube-system/pods?watch=1&fieldSelector=metadata.name%3D{self.name}"
                f"&resourceVersion={pod['metadata']['resourceVersion']}&timeoutSeconds=1500")
        self._watch = subprocess.Popen(self.node.inside([str(self.node.binaries.path("kubectl")),
                                                         "--kubeconfig=/etc/kubernetes/admin.conf", "get", "--raw",
                                                         path]),
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._threads = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._scan, daemon=True)]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.kill()
            self._watch.wait()
        for thread in self._threads:
            thread.join(5)

    def _read(self) -> None:
        assert self._watch is not None and self._watch.stdout is not None
        for line in self._watch.stdout:
            if line.strip():
                event = json.loads(line)
                self.events.append((time.time_ns(), event["type"], event["object"]))

    def schedulers(self) -> list[tuple[int, float]]:
        """(pid, start) of each kube-scheduler process of this node: below its init (the containerd shims are
        reparented to it)."""
        found = []
        for proc in psutil.process_iter(["name", "create_time"]):
            try:
                if proc.info["name"] == "kube-scheduler" and self.node.init_pid in {p.pid for p in proc.parents()}:
                    found.append((proc.pid, proc.info["create_time"]))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return sorted(found)

    def _scan(self) -> None:
        last: list[tuple[int, float]] | None = None
        while not self._stop.wait(0.1):
            now = self.schedulers()
            if now != last:
                seen = time.time_ns()
                self.processes.extend([(seen, pid, started) for pid, started in now] or [(seen, 0, 0.0)])
                last = now

    def window(self, since_ns: int, until_ns: int, written_ns: int) -> dict[str, Any]:
        """The events and process changes seen between two instants, times in seconds after `written_ns`; the
        pod as it was at `since_ns` first (type ``BEFORE``)."""
        before = [e for e in self.events if e[0] < since_ns and e[1] != "DELETED"]
        rows = [mirrorseq.compact("BEFORE", before[-1][2], (before[-1][0] - written_ns) / 1e9, MARKER)]
        rows += [mirrorseq.compact(kind, pod, (at - written_ns) / 1e9, MARKER)
                 for at, kind, pod in self.events if since_ns <= at < until_ns and kind != "GET"]
        procs = [{"t": round((at - written_ns) / 1e9, 3), "pid": pid,
                  "startedAfterWrite": round(started - written_ns / 1e9, 3) if pid else None}
                 for at, pid, started in self.processes if since_ns <= at < until_ns]
        return {"events": rows, "processes": procs}


def _marker_hash(manifest: Path) -> str | None:
    doc = YAML(typ="safe").load(manifest.read_text())
    return restart.marker_hash(doc, MARKER)


def _config_files(node: KubeadmNode) -> dict[str, str]:
    """The agent's config files on the node, by node path (what the patched manifest's `--config` names)."""
    folder = node.host(CONFIG_DIR)
    return {f"{CONFIG_DIR}/{p.name}": p.read_text() for p in sorted(folder.iterdir()) if p.is_file()} \
        if folder.is_dir() else {}


def _replace(path: Path, data: bytes) -> None:
    """Same folder, new inode, renamed over: how the agent writes (a dot name the kubelet skips)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _reordered(data: bytes) -> bytes:
    """The same pod with every mapping's keys in reverse order (the kubelet decodes it to the same pod)."""
    yaml = YAML()

    def flip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: flip(node[k]) for k in reversed(list(node))}
        if isinstance(node, list):
            return [flip(v) for v in node]
        return node

    out = io.StringIO()
    yaml.dump(flip(json.loads(json.dumps(YAML(typ="safe").load(data)))), out)
    return out.getvalue().encode()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[KubeadmNode]:
    """A node of the newest release that has kubeadm."""
    releases = releases_with_kubeadm()
    with kubeadm_node(require_kubeadm(releases[0].version if releases else "none"), tmp_path / "kubeadm") as made:
        yield made


@pytest.mark.timeout(1200)
def test_the_real_kubelets_restart_sequence(node: KubeadmNode, tmp_path: Path) -> None:
    """kubeadm's scheduler running; the agent's `apply` -> the old mirror pod deleted, a new one (new uid, new
    config.hash) created and its status following until the scheduler is started and ready, a new process; the
    agent's `restore` -> the same, back to kubeadm's hash; a touch, the same bytes renamed over the file, the same
    pod with its keys reordered -> no event and the same process. Every step's events go to the fixture (recording)
    or are held against its shape."""
    manifest = node.host(f"{MANIFESTS}/kube-scheduler.yaml")
    original = manifest.read_bytes()
    wait_until(node.running, 300, lambda: f"kubeadm's kube-scheduler ready\n{node.log('kubelet')}")
    source = tmp_path / "source"
    source.mkdir()
    write_configmap(source, {"extenders.yaml": EXTENDERS})
    recorder = Recorder(node).start()
    steps: dict[str, Any] = {}
    try:
        time.sleep(1.0)  # the watch is open (an event before it would be lost, not missed: the GET holds it)

        def restart_step(name: str, command: str) -> None:
            before_id = node.running()
            assert before_id is not None
            since = time.time_ns()
            done = patcher(command, node, source)
            assert done.returncode == 0, done.stdout + done.stderr
            written = manifest.stat().st_mtime_ns

            def replaced() -> bool:
                now = node.running()
                return now is not None and now[0] != before_id[0]

            wait_until(replaced, 300, lambda: f"a new kube-scheduler after {command}\n{node.log('kubelet')}")
            time.sleep(TAIL)
            steps[name] = {"write": command, "writtenNs": written, "expectedHash": _marker_hash(manifest),
                           "manifest": manifest.read_text(), "configFiles": _config_files(node),
                           **recorder.window(since, time.time_ns(), written)}

        def no_op_step(name: str, write: str, change: Any) -> None:
            since = time.time_ns()
            change()
            written = manifest.stat().st_mtime_ns
            time.sleep(NO_OP_WINDOW)
            steps[name] = {"write": write, "writtenNs": written, "expectedHash": None,
                           "manifest": manifest.read_text(),
                           **recorder.window(since, time.time_ns(), written)}

        restart_step("patch", "apply")
        restart_step("restore", "restore")
        assert manifest.read_bytes() == original
        no_op_step("touch", "utime", lambda: os.utime(manifest))
        no_op_step("same-bytes", "the same bytes renamed over the file", lambda: _replace(manifest, original))
        no_op_step("reordered", "the same pod, every mapping's keys reversed",
                   lambda: _replace(manifest, _reordered(original)))
        _replace(manifest, original)
    finally:
        recorder.stop()
    recorded = {"release": node.binaries.version, "mirrorPod": recorder.name, "marker": MARKER,
                "manifest": f"{MANIFESTS}/kube-scheduler.yaml", "steps": steps}
    print(json.dumps({k: mirrorseq.shape(v["events"]) for k, v in steps.items()}, indent=1))
    if os.environ.get("RECORD_KUBELET_SEQUENCE") == "1":
        FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        FIXTURE.write_text(json.dumps(recorded, indent=1) + "\n")
        return
    kept = json.loads(FIXTURE.read_text())
    for name, step in kept["steps"].items():
        assert _comparable(mirrorseq.shape(steps[name]["events"])) == _comparable(mirrorseq.shape(step["events"])), name
        assert _verdicts(steps[name]) == _verdicts(step), name  # and the agent's check reads both alike
        assert _new_processes(steps[name]) == _new_processes(step), name


#: The real kubelet shows a pod whose uid it ran before in one of two ways: the restore gives kubeadm's pod back
#: under its first hash, the uid of the pod the patch replaced, and the kubelet's first status of it is either the
#: new container being created or, from its status cache, the old container of that uid as it ended (both seen on
#: 1.37.2, the second in a CI run). The agent's restart check reads both as "not yet" (`_verdicts`).
CACHED_STATUS: Final = ("MODIFIED new Running terminated(Completed) started=False ready=False Ready=False",
                        "MODIFIED new Pending waiting(ContainerCreating) started=False ready=False Ready=False")


def _comparable(shape: list[str]) -> list[str]:
    return [CACHED_STATUS[1] if word == CACHED_STATUS[0] else word for word in shape]


def _verdicts(step: dict[str, Any]) -> list[str]:
    return mirrorseq.verdicts(step["events"], marker_key=MARKER, expected_hash=step["expectedHash"],
                              written_ns=step["writtenNs"])


def _new_processes(step: dict[str, Any]) -> int:
    """How many kube-scheduler processes started after the step's write."""
    return len({p["pid"] for p in step["processes"] if p["pid"] and p["startedAfterWrite"] > -1})
