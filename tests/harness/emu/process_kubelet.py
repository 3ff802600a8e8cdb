"""A kubelet stand-in that runs the static pod's real process: the real kube-scheduler, against the real API server.

tests/harness/emu/kubeletsim.py plays the scheduler too (a config with "reject-me" crashes it); here the release's own
kube-scheduler runs from the manifest's command line (tests/harness/real/mountns.py binds the node's files at their
paths) and decides for itself whether it starts. What the kubelet does around it is kept to what the agent observes:

* a manifest file whose content changed is a new pod: the old process is stopped, the mirror pod deleted and
  created again (new uid) with `kubernetes.io/config.hash`/`config.mirror`/`config.source`, an ownerReference
  to the Node, and a container `startedAt` in whole seconds;
* the mirror pod is written with the node's own credentials (`system:node:<name>`), so the Node authorizer and
  NodeRestriction judge it as they judge a kubelet;
* a process that exits is restarted with a doubling back-off (10 s, capped), its `restartCount` rising and the
  container waiting in CrashLoopBackOff in between, as the kubelet reports a scheduler that refuses its config.
"""

from __future__ import annotations

import hashlib
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.harness.real.controlplane import Binaries, ControlPlane, die_with_parent, issue, terminate
from tests.harness.real.mountns import command, pod_binds

MANIFEST = "etc/kubernetes/manifests/kube-scheduler.yaml"
BACKOFF = (1.0, 2.0, 4.0, 8.0, 10.0)  # seconds; the kubelet's is 10 s doubling to 5 min (shortened for tests)


def _stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(seconds)))


@dataclass
class Run:
    """One start of the static pod: its content hash, and the process (None while in back-off)."""

    digest: str
    pod: dict[str, Any]
    proc: subprocess.Popen[bytes] | None = None
    uid: str = ""
    restarts: int = 0
    started: float = 0.0
    next_try: float = 0.0


@dataclass
class ProcessKubelet:
    cp: ControlPlane
    node: str
    host_root: Path
    binaries: Binaries
    scratch: Path
    starts: list[tuple[float, str]] = field(default_factory=list)  #: (time, content hash) of each start
    errors: list[str] = field(default_factory=list)  #: what the API server refused (the test shows them)
    _run: Run | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _user: str = ""
    _last_uid: str = ""

    def start(self) -> ProcessKubelet:
        self._user = f"kubelet-{self.node}"
        issue(self.cp.pki, self._user, f"/O=system:nodes/CN=system:node:{self.node}", client=True)
        self._thread = threading.Thread(target=self._loop, name=f"kubelet-{self.node}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self._kill()

    @property
    def log(self) -> Path:
        return self.scratch / f"kube-scheduler-{self.node}.log"

    def tail(self, lines: int = 25) -> str:
        text = self.log.read_text(errors="replace") if self.log.is_file() else ""
        return "\n".join(line for line in text.splitlines() if "configmap_cafile" not in line)[-4000:]

    # -- the loop ---------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self._sync()
            except (OSError, AssertionError) as e:  # the kubelet tries again on its next pass
                self.errors[:] = [*self.errors[-20:], str(e)]

    def _sync(self) -> None:
        data = (self.host_root / MANIFEST).read_bytes()
        digest = hashlib.sha256(data).hexdigest()[:32]
        run = self._run
        if run is None or run.digest != digest:
            pod = yaml.safe_load(data)
            self._kill()
            self._run = run = Run(digest, pod)
            self._mirror(run, created=True)
        if run.proc is None and time.monotonic() >= run.next_try:
            self._spawn(run)
            self._mirror(run)
        elif run.proc is not None and run.proc.poll() is not None:
            run.proc = None
            run.restarts += 1
            run.next_try = time.monotonic() + BACKOFF[min(run.restarts - 1, len(BACKOFF) - 1)]
            self._mirror(run)

    def _spawn(self, run: Run) -> None:
        container = next(c for c in run.pod["spec"]["containers"] if c["name"] == "kube-scheduler")
        argv = [*container.get("command", []), *container.get("args", [])]
        assert argv and argv[0] == "kube-scheduler", argv
        binds = pod_binds(run.pod, container, self.host_root)
        with open(self.log, "ab") as log:
            run.proc = subprocess.Popen(
                command(binds, [str(self.binaries.path("kube-scheduler")), *argv[1:]], self.scratch / "shadow"),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        run.started = time.time()
        self.starts.append((run.started, run.digest))

    def _kill(self) -> None:
        if self._run is not None:
            terminate(self._run.proc)

    # -- the mirror pod -----------------------------------------------------------------------------------------

    def _as_node(self, method: str, path: str, body: Any = None,
                 content_type: str = "application/json") -> tuple[int, Any]:
        """A request with the kubelet's credentials (system:node:<name>), not the admin's."""
        return self.cp.request(method, path, body, content_type, user=self._user)

    def _mirror(self, run: Run, created: bool = False) -> None:
        meta = run.pod.get("metadata") or {}
        ns, name = meta.get("namespace", "kube-system"), f"{meta.get('name', 'kube-scheduler')}-{self.node}"
        path = f"/api/v1/namespaces/{ns}/pods"
        if created:
            # As the kubelet's mirror client deletes it: at once (grace period 0), for the uid it last saw. With
            # the default grace period the pod would stay "being deleted", since the kubelet that would confirm
            # its end is the one deleting it, and the new mirror pod could not be created (409).
            self._as_node("DELETE", f"{path}/{name}", {"gracePeriodSeconds": 0, **(
                {"preconditions": {"uid": run_uid}} if (run_uid := self._last_uid) else {})})
            node_uid = self.cp.ok("GET", f"/api/v1/nodes/{self.node}")["metadata"]["uid"]
            spec = run.pod["spec"]
            mirror = {"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": name, "namespace": ns, "labels": meta.get("labels") or {},
                "annotations": {**(meta.get("annotations") or {}), "kubernetes.io/config.hash": run.digest,
                                "kubernetes.io/config.mirror": run.digest, "kubernetes.io/config.source": "file",
                                "kubernetes.io/config.seen": _stamp(time.time())},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": node_uid,
                                     "controller": True}]},
                "spec": {**spec, "nodeName": self.node}}
            status, out = self._as_node("POST", path, mirror)
            assert status == 201, f"mirror pod {name}: {status} {out}"
            run.uid = self._last_uid = out["metadata"]["uid"]
        if run.proc is not None:
            state: dict[str, Any] = {"running": {"startedAt": _stamp(run.started)}}
        else:
            state = {"waiting": {"reason": "CrashLoopBackOff" if run.restarts else "ContainerCreating"}}
        running = "running" in state
        status_body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns,
                                                                        "uid": run.uid},
                       "status": {"phase": "Running" if running else "Pending",
                                  "conditions": [{"type": "Ready", "status": "True" if running else "False"}],
                                  "containerStatuses": [{
                                      "name": "kube-scheduler", "ready": running, "restartCount": run.restarts,
                                      "image": run.pod["spec"]["containers"][0].get("image", ""), "imageID": "",
                                      "started": running, "state": state}]}}
        code, out = self._as_node("PATCH", f"{path}/{name}/status", status_body, "application/merge-patch+json")
        assert code == 200, f"mirror pod status {name}: {code} {out}"
