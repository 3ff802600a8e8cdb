"""A simulated kubelet for one node: it follows the kubelet's static-pod file rules.

* every non-dot file in the manifest folder is a pod (a stray backup would be run as a second pod: the test
  fails on it);
* a static pod is restarted only when the pod its file decodes to changes: a comment, CRLF line ends or
  another layout of the same pod restart nothing (seen on the real kubelet, tests/real/test_real_kubelet.py);
* ``kubernetes.io/config.hash`` is the static pod's UID, as the kubelet makes it: the manifest's
  ``metadata.uid`` when it sets one (RKE2 writes a hash of the pod there), else a hash of the decoded pod, the
  node and the file's path. On a change the mirror pod ``<name>-<node>`` is replaced: the static pod's
  annotations plus the hash, a new uid, and a container ``startedAt`` in whole seconds, like the API's
  ``metav1.Time``. Replaced means deleted, then created (watchers see DELETED, then ADDED);
* a change that keeps the manifest's own ``metadata.uid`` restarts nothing: the real 1.37 kubelet logs it as
  an update and the old container keeps running (tests/real/test_real_kubelet.py), so an edit that does not change
  the UID never reaches the scheduler;
* the mirror pod carries the static pod's labels (``component: kube-scheduler``: what selects the schedulers);
* each new mirror pod is first published Pending, its container waiting in ``ContainerCreating``, then with
  the container's state (as the real kubelet's pod status goes);
* a scheduler config that contains ``reject-me`` makes the scheduler exit at start, and the container goes
  through what the real kubelet showed for a kube-scheduler refusing its config (tests/real/test_real_kubelet.py):
  terminated (exit 1, ``Error``) with restartCount 0, then restarted at once (running, restartCount 1,
  ``lastState.terminated``), terminated again, waiting ``CrashLoopBackOff`` ("back-off 10s restarting failed
  container=..."), running again with restartCount 2, and so on with the back-off doubling. One step per
  0.3 s here, where the real kubelet's back-off takes 10 s, 20 s, 40 s... While it runs, a container with
  neither a startup nor a readiness probe (RKE2's manifest has none) is ready and the pod Ready, as the real
  kubelet showed for the second a refused scheduler lives, its first run included (published before its exit);
  kubeadm's startup probe keeps it unready;

Given a ``Containers`` (tests/harness/real/scheduler_process.py), the scheduler container is the release's own
kube-scheduler process instead: it decides for itself whether it starts, and one that exits is shown terminated,
then waiting in ``CrashLoopBackOff`` until its back-off (``BACKOFF``, shortened) has passed, then running again
with its restartCount one higher.

Where the mirror pod goes is a ``PodSink``: the API emulator (``KubeEmulator.set_pod``), or the real API server
through tests/harness/real/node_client.py (``NodeClient``: the node's own credentials, the mirror pod deleted and
created again on a new hash, its status through the status subresource). ``full_spec`` sends the static pod's own spec,
as the kubelet does, instead of a one-container stand-in (the real server validates it and admits it as a mirror pod).
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from tests.harness.emu.kubeemu import KubeEmulator, make_mirror_pod


def static_pod_annotations(own: dict[str, str], uid: str) -> dict[str, str]:
    """A static pod's annotations as the kubelet sets them on its mirror pod: the manifest's own, and the pod's
    hash (its UID) as ``config.hash`` and ``config.mirror``, with ``config.source: file``."""
    return {**own, "kubernetes.io/config.hash": uid, "kubernetes.io/config.mirror": uid,
            "kubernetes.io/config.source": "file"}


class PodSink(Protocol):
    """Where a kubelet publishes its mirror pods: create, or replace, the pod as given."""

    def set_pod(self, pod: dict[str, Any]) -> object: ...


class Containers(Protocol):
    """Runs a static pod's scheduler container as a real process (tests/harness/real/scheduler_process.py)."""

    def start(self, pod: dict[str, Any], container: dict[str, Any], host_root: Path) -> None: ...

    def exit_code(self) -> int | None: ...  # None while it runs

    def stop(self) -> None: ...


#: Seconds between the restarts of a real scheduler process that exited: the kubelet's back-off (10 s doubling to
#: 5 min) shortened, so a test sees the process come back.
BACKOFF = (1.0, 2.0, 4.0, 8.0, 10.0)


def _stamp(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns // 1_000_000_000))


def _stamp_ns(ns: int) -> str:
    """``config.seen``: the kubelet writes it to the nanosecond (Go's RFC3339Nano)."""
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(ns // 1_000_000_000))}.{ns % 1_000_000_000:09d}Z"


SEEN = "kubernetes.io/config.seen"
#: The pod conditions the real kubelet (1.37) reports, in its order; only Ready and ContainersReady follow the
#: container's readiness here.
CONDITIONS = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")


def _conditions(now_ns: int, *, ready: bool, since: list[dict[str, Any]] | None = None,
                sandbox: bool = True) -> list[dict[str, Any]]:
    """The pod's conditions, each with the time it last changed (kept from ``since`` where it did not);
    ``sandbox``: the pod's sandbox is up (PodReadyToStartContainers)."""
    before = {c["type"]: c for c in since or []}
    out = []
    for kind in CONDITIONS:
        up = ready if kind in ("Ready", "ContainersReady") else sandbox or kind != "PodReadyToStartContainers"
        status = "True" if up else "False"
        old = before.get(kind)
        kept = old.get("lastTransitionTime") if old is not None and old.get("status") == status else None
        out.append({"type": kind, "status": status, "lastTransitionTime": kept or _stamp(now_ns)})
    return out


def _decoded(data: bytes) -> Any:
    try:
        return YAML(typ="safe").load(data.decode())
    except (UnicodeDecodeError, YAMLError):
        return None


def _pod_digest(data: bytes) -> str:
    """What the kubelet compares: the decoded pod (bytes only where the file does not decode)."""
    decoded = _decoded(data)
    if decoded is None:
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha256(json.dumps(decoded, sort_keys=True, default=str).encode()).hexdigest()


def _scheduler_pod(data: bytes) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]] | None:
    """The metadata, scheduler container and spec of a static-pod file, or None for a file that is no such pod.

    A writer that is not atomic (a test's ``write_bytes``, an operator's editor) shows the kubelet an empty or
    half-written file for a moment; the kubelet logs it and reads the file again when it changes.
    """
    manifest = _decoded(data)
    spec = manifest.get("spec") if isinstance(manifest, dict) else None
    containers = spec.get("containers") if isinstance(spec, dict) else None
    if not isinstance(spec, dict) or not isinstance(containers, list):
        return None
    container = next((c for c in containers if isinstance(c, dict) and c.get("name") == "kube-scheduler"), None)
    if container is None:
        return None
    meta = manifest.get("metadata")
    return (meta if isinstance(meta, dict) else {}), container, spec


@dataclass
class Restart:
    at_ns: int
    file: str
    content_hash: str
    crashed: bool


@dataclass
class _Process:
    """The static pod whose container runs as a real process: its mirror pod as last published, what to start it
    from again, and when."""

    pod: dict[str, Any]
    manifest: dict[str, Any]
    container: dict[str, Any]
    next_try: float = 0.0


@dataclass
class SimKubelet:
    emu: PodSink
    node: str
    host_root: Path  # the node's file system
    manifest_dir: str = "/etc/kubernetes/manifests"
    interval: float = 0.05
    #: Seconds from a probed container's start to its startup probe passing (kubeadm's waits 10 s).
    probe_delay: float = 0.2
    full_spec: bool = False
    process: Containers | None = None  #: runs the real scheduler, instead of the "reject-me" rule deciding
    restarts: list[Restart] = field(default_factory=list)
    stray_files: list[str] = field(default_factory=list)
    _seen: dict[str, str] = field(default_factory=dict)
    _uids: dict[str, str] = field(default_factory=dict)  # file -> the UID of the static pod running from it
    _crashing: dict[str, tuple[dict[str, Any], int, bool]] = field(default_factory=dict)  # pod, steps, probed
    _probing: dict[str, tuple[dict[str, Any], float]] = field(default_factory=dict)  # pod, next probe (monotonic)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _running: _Process | None = None

    def start(self) -> SimKubelet:
        self.sync()
        self._thread = threading.Thread(target=self._loop, name=f"kubelet-{self.node}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(2)
        if self.process is not None:
            self.process.stop()

    def _loop(self) -> None:
        last_crash = time.monotonic()
        while not self._stop.wait(self.interval):
            try:
                self.sync()
                self._probe()
                self._watch_process()
                if time.monotonic() - last_crash > 0.3:
                    last_crash = time.monotonic()
                    self._crash_again()
            except OSError:
                pass  # the API server is down: the kubelet retries on its next pass

    def sync(self) -> None:
        folder = self.host_root / self.manifest_dir.lstrip("/")
        for path in sorted(folder.iterdir()):
            if path.name.startswith(".") or not path.is_file():
                continue
            data = path.read_bytes()
            digest = _pod_digest(data)
            if self._seen.get(path.name) == digest:
                continue
            if path.name != "kube-scheduler.yaml":
                self.stray_files.append(path.name)
            self._start_pod(path.name, data, digest)
            self._seen[path.name] = digest  # only once the API took the mirror pod: otherwise retry

    def _start_pod(self, name: str, data: bytes, digest: str) -> None:
        pod_spec = _scheduler_pod(data)
        if pod_spec is None:
            return  # like the kubelet: a file it cannot decode is skipped until its content changes again
        meta, container, spec = pod_spec
        if meta.get("uid") and self._uids.get(name) == str(meta["uid"]):
            return  # the same static pod, updated in place: nothing restarts
        uid = meta.get("uid") or hashlib.md5(f"{digest}host:{self.node}file:{name}".encode(),
                                                usedforsecurity=False).hexdigest()
        annotations = {**static_pod_annotations(meta.get("annotations") or {}, str(uid)),
                       SEEN: _stamp_ns(time.time_ns())}
        now = time.time_ns()
        crashed = self._rejects(container) if self.process is None else False
        pod = make_mirror_pod(node_name=self.node, static_name=meta.get("name", "kube-scheduler"),
                              namespace=meta.get("namespace", "kube-system"), annotations=annotations,
                              waiting_reason="ContainerCreating", ready=False)
        pod["metadata"]["uid"] = str(uuid.uuid4())
        pod["metadata"]["labels"] = dict(meta.get("labels") or {})  # the kubelet copies the static pod's labels
        if self.full_spec:
            pod["spec"] = {**spec, "nodeName": self.node}
        namespace, mirror_name = pod["metadata"].get("namespace", "kube-system"), pod["metadata"]["name"]
        if isinstance(self.emu, KubeEmulator) and self.emu.get("pods", mirror_name, namespace) is not None:
            self.emu.delete("pods", mirror_name, namespace)  # the real kubelet deletes it, then creates anew
        status = pod["status"]["containerStatuses"][0]
        status["started"] = False
        creating = copy.deepcopy(pod)
        pod["status"] = {"phase": "Pending"}  # created: the API server keeps no status a create sends
        self.emu.set_pod(copy.deepcopy(pod))
        pod["status"] = creating["status"]
        pod["status"]["conditions"] = _conditions(now, ready=False, sandbox=False)
        self.emu.set_pod(copy.deepcopy(pod))  # Pending: the container being created
        if self.process is not None:
            self.process.start({"metadata": meta, "spec": spec}, container, self.host_root)
            now = time.time_ns()
        status = pod["status"]["containerStatuses"][0]
        status["containerID"] = f"containerd://{uuid.uuid4().hex}{uuid.uuid4().hex}"
        probed = any(container.get(k) for k in ("startupProbe", "readinessProbe"))
        if crashed and probed:  # its exit is the first state published: it never got past the startup probe
            status["state"] = {"terminated": self._exited(now)}
            status["lastState"] = {}
            pod["status"]["conditions"] = _conditions(now, ready=False, since=pod["status"]["conditions"])
        elif probed and self.process is None:  # running; started and ready once its probes pass (`_probe`)
            status["state"] = {"running": {"startedAt": _stamp(now)}}
            pod["status"]["conditions"] = _conditions(now, ready=False, since=pod["status"]["conditions"])
        else:  # with no probe, even the refused scheduler shows running and ready for the moment it lives
            status["state"] = {"running": {"startedAt": _stamp(now)}}
            status["ready"] = status["started"] = True
            pod["status"]["conditions"] = _conditions(now, ready=True, since=pod["status"]["conditions"])
        pod["status"]["phase"] = "Running"
        self.emu.set_pod(pod)
        self._uids[name] = str(uid)  # once the API took the mirror pod: a retry starts it again
        self.restarts.append(Restart(now, name, hashlib.sha256(data).hexdigest(), crashed))
        self._probing.pop(name, None)
        if self.process is not None:
            self._running = _Process(pod, {"metadata": meta, "spec": spec}, container)
        elif crashed:  # the crash loop's next step: restarted (after the exit shown), or exits (after the run shown)
            self._crashing[name] = (pod, 0 if probed else -1, probed)
        else:
            self._crashing.pop(name, None)
            if probed:
                self._probing[name] = (pod, time.monotonic() + self.probe_delay)

    def _probe(self) -> None:
        """The probes of a container that runs: its startup probe passes (``started``), then its readiness probe
        (``ready``, the pod Ready): two updates, as the real kubelet sends them (kubeadm's startup probe waits
        10 s, its readiness probe asks every second; here ``probe_delay``)."""
        for name, (pod, due) in list(self._probing.items()):
            if time.monotonic() < due:
                continue
            status = pod["status"]["containerStatuses"][0]
            if not status["started"]:
                status["started"] = True
                self._probing[name] = (pod, time.monotonic() + self.probe_delay / 4)
            else:
                status["ready"] = True
                pod["status"]["conditions"] = _conditions(time.time_ns(), ready=True, since=pod["status"]["conditions"])
                del self._probing[name]
            self.emu.set_pod(copy.deepcopy(pod))

    def _watch_process(self) -> None:
        """A real scheduler that exited: terminated and waiting in back-off, then started again once it passed."""
        run = self._running
        if run is None or self.process is None or (code := self.process.exit_code()) is None:
            return
        status = run.pod["status"]["containerStatuses"][0]
        now = time.time_ns()
        if "running" in status["state"]:  # it exited since the last pass
            back_off = BACKOFF[min(status["restartCount"], len(BACKOFF) - 1)]
            status["lastState"] = {"terminated": {**self._exited(now), "exitCode": code}}
            status["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": (
                f"back-off {back_off:g}s restarting failed container={status['name']} "
                f"pod={run.pod['metadata']['name']}_{run.pod['metadata'].get('namespace', 'kube-system')}")}}
            status["ready"] = status["started"] = False
            run.next_try = time.monotonic() + back_off
        elif time.monotonic() >= run.next_try:
            self.process.start(run.manifest, run.container, self.host_root)
            status["restartCount"] += 1
            status["state"] = {"running": {"startedAt": _stamp(now)}}
            status["ready"] = status["started"] = True
        else:
            return
        run.pod["status"]["conditions"] = _conditions(now, ready=status["ready"], since=run.pod["status"]["conditions"])
        self.emu.set_pod(run.pod)

    @staticmethod
    def _exited(now_ns: int) -> dict[str, Any]:
        return {"exitCode": 1, "reason": "Error", "startedAt": _stamp(now_ns), "finishedAt": _stamp(now_ns)}

    def _crash_again(self) -> None:
        """One step of each crash loop: restarted (running) -> exited -> back-off -> restarted..."""
        for name, (pod, steps, probed) in list(self._crashing.items()):
            status = pod["status"]["containerStatuses"][0]
            now = time.time_ns()
            step = steps % 3 if steps >= 0 else 1
            ready = step == 0 and not probed  # running with nothing to hold its readiness back
            status["ready"] = status["started"] = ready
            pod["status"]["conditions"] = _conditions(now, ready=ready, since=pod["status"]["conditions"])
            if step == 0:  # the kubelet starts the container again
                status["restartCount"] += 1
                if "terminated" in status["state"]:
                    status["lastState"] = {"terminated": status["state"]["terminated"]}
                status["state"] = {"running": {"startedAt": _stamp(now)}}
            elif step == 1:  # kube-scheduler exits at once
                status["state"] = {"terminated": self._exited(now)}
            else:
                status["lastState"] = {"terminated": status["state"]["terminated"]}
                back_off = 10 * 2 ** (status["restartCount"] - 1)
                status["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": (
                    f"back-off {min(back_off, 300)}s restarting failed container={status['name']} "
                    f"pod={pod['metadata']['name']}_{pod['metadata'].get('namespace', 'kube-system')}")}}
            self._crashing[name] = (pod, steps + 1, probed)
            self.emu.set_pod(pod)

    def _rejects(self, container: dict[str, Any]) -> bool:
        for item in [*(container.get("command") or []), *(container.get("args") or [])]:
            if isinstance(item, str) and item.startswith("--config="):
                config = self.host_root / item.split("=", 1)[1].lstrip("/")
                try:
                    return "reject-me" in config.read_text()
                except OSError:
                    return True  # a scheduler whose --config file is missing exits at once
        return False
