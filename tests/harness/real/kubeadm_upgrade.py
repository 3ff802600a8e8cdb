"""`kubeadm upgrade apply` on a `KubeadmNode` (tests/harness/real/kubeadm_node.py), with what a test watches meanwhile.

A node `kubeadm init` made at release N is upgraded as kubeadm's documentation says: the next release's kubeadm
first (its images present on the node: they are built here from the release's binaries and imported, as for init),
`kubeadm upgrade apply`, then the kubelet of the new release restarted with the flags kubeadm wrote. What happens
meanwhile is recorded on one clock (this process's `time.time()`), as a `Timeline`:

* kubeadm's output, each line stamped when it is read (kubeadm's own `fmt.Printf` lines carry no time);
* every rename or write that lands on the kube-scheduler manifest (inotify on the manifest folder, in this
  process): the file's inode, the first digits of its sha256, and whether it carries the agent's `--config`;
* the output of the processes started here in the node (the agent, the extender), stamped as kubeadm's.

`upgrade_config` says which of kubeadm's upgrade checks this sandbox cannot pass, and why. On a cluster's other
control-plane nodes `upgrade_node` runs `kubeadm upgrade node` (the release comes from the cluster's kubeadm-config,
which `upgrade apply` updated), and `SchedulerWatch` records every node's kube-scheduler through the API server
restarts an upgrade makes.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers.inotify import InotifyObserver

from tests.harness.real.controlplane import ROOT, Binaries, die_with_parent, wait_until
from tests.harness.real.kubeadm_cluster import SchedulerTimeline
from tests.harness.real.kubeadm_node import (
    IGNORED_PREFLIGHT,
    MANIFESTS,
    KubeadmNode,
    image_contents,
    releases_with_kubeadm,
)
from tests.harness.real.kubelet_node import image_archive

#: kubeadm's upgrade checks this sandbox cannot pass, and why (init's, and one of the upgrade's own).
IGNORED_UPGRADE_PREFLIGHT = {
    *IGNORED_PREFLIGHT,
    # The cluster health check runs a Job of the pause image with `-v` (not on the host's network) and waits up to
    # 60 s for it to complete. The project's pause (tools/realk8s/pause) answers `-v` as upstream's does, and the
    # nodes give such a pod an address (`KubeadmNode.pod_network`), so the check passes where a node is
    # schedulable; kept a warning, not a failure: the check is kubeadm's, not the agent's.
    "CreateJob",
    # CoreDNS is disabled on this node (no image of it exists here); kubeadm's upgrade checks its Corefile and
    # version all the same, find none ("start version '' not supported") and fail both checks.
    "CoreDNSUnsupportedPlugins", "CoreDNSMigration",
}
#: kubeadm's wait for each upgraded static pod (`timeouts.upgradeManifests`, its default): a component that takes
#: this long has been rolled back.
UPGRADE_MANIFESTS_TIMEOUT = 300.0
UPGRADE_DEADLINE = 1200.0


def upgrade_releases(missing: str | None, what: str) -> tuple[Binaries, Binaries]:
    """(N, N+1): the two newest releases built with kubeadm, for `what`; `missing` (or fewer than two releases)
    skips with one line, a failure under CI=true."""
    built = releases_with_kubeadm()
    why = missing
    if why is None and len(built) < 2:
        why = "one release with kubeadm built: the upgrade needs two (`make real-k8s` builds them)"
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{what} cannot run under CI=true: {why}")
        pytest.skip(why)
    return built[1], built[0]


def upgrade_config(new: Binaries) -> str:
    """kubeadm's UpgradeConfiguration: the new release, no etcd upgrade (see `upgrade_apply`), no image pulled."""
    return json.dumps({
        "apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "UpgradeConfiguration",
        "apply": {"kubernetesVersion": f"v{new.version}", "etcdUpgrade": False, "imagePullPolicy": "Never",
                  "ignorePreflightErrors": sorted(IGNORED_UPGRADE_PREFLIGHT)},
    }, indent=1) + "\n"


# -- the record ---------------------------------------------------------------------------------------------------


@dataclass
class Timeline:
    """(time.time(), source, what) rows from several threads."""

    rows: list[tuple[float, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, source: str, what: str, at: float | None = None) -> None:
        with self.lock:
            self.rows.append((time.time() if at is None else at, source, what))

    def of(self, source: str, pattern: str = "") -> list[tuple[float, str]]:
        """(time, what) of `source`'s rows whose text matches `pattern` (a regex), in time order."""
        regex = re.compile(pattern)
        with self.lock:
            rows = sorted(self.rows)
        return [(t, w) for t, s, w in rows if s == source and regex.search(w)]

    def first(self, source: str, pattern: str) -> float:
        found = self.of(source, pattern)
        assert found, f"no {source} row matching {pattern!r}:\n{self.render()}"
        return found[0][0]

    def render(self, since: float = 0.0, keep: Callable[[str, str], bool] = lambda s, w: True) -> str:
        with self.lock:
            rows = sorted(r for r in self.rows if r[0] >= since and keep(r[1], r[2]))
        start = rows[0][0] if rows else since
        start = since or start
        return "\n".join(f"{t - start:8.2f} s  {s:<10} {w}" for t, s, w in rows)


class StampedProcess:
    """A process in the node whose output lines are stamped as they are read and written to `log`."""

    def __init__(self, node: KubeadmNode, source: str, argv: list[str], timeline: Timeline,
                 env: dict[str, str] | None = None) -> None:
        self.source, self.timeline = source, timeline
        self.log = node.run / f"{source}.log"
        self.lines: list[tuple[float, str]] = []
        self.proc = subprocess.Popen(node.inside(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=node.environment() if env is None else env,
                                     preexec_fn=die_with_parent)
        node.procs.append(self.proc)  # the node's stop takes it with the rest
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.log.open("a") as log:
            for raw in self.proc.stdout:
                now = time.time()
                line = raw.decode(errors="replace").rstrip("\n")
                log.write(f"{now:.3f} {line}\n")
                log.flush()
                self.lines.append((now, line))
                self.timeline.add(self.source, line, now)

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(30)
        return code

    def text(self, last: int = 0) -> str:
        return "\n".join(line for _, line in self.lines[-last:])

    def pid_inside(self) -> int:
        """The PID (in this machine's namespace) of the command `nsenter` started: nsenter forks into the node's
        PID namespace and waits for it, without passing signals on."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        assert children, f"{self.source}: nsenter has no child"
        return int(children[0])

    def terminate(self, timeout: float = 60) -> int:
        os.kill(self.pid_inside(), signal.SIGTERM)
        return self.wait(timeout)


class ManifestWatch(FileSystemEventHandler):
    """Every event on the kube-scheduler manifest in its folder, with the inode and content it then had (rows of
    `source`: one watch per node of a cluster)."""

    def __init__(self, node: KubeadmNode, timeline: Timeline, source: str = "manifest") -> None:
        self.path = node.host(f"{MANIFESTS}/kube-scheduler.yaml")
        self.timeline, self.source = timeline, source
        #: (time, inode, sha256, patched): one row per distinct inode seen, in order
        self.versions: list[tuple[float, int, str, bool]] = []
        #: the bytes of each of `versions`, in the same order (what a writer left, read as its rename landed)
        self.contents: list[bytes] = []
        self.observer = InotifyObserver()
        self.observer.schedule(self, str(self.path.parent), recursive=False)

    def start(self) -> ManifestWatch:
        self.observer.start()
        self.look("start")
        return self

    def stop(self) -> None:
        self.observer.stop()
        self.observer.join(10)

    def on_any_event(self, event: FileSystemEvent) -> None:
        names = {os.fsdecode(event.src_path), os.fsdecode(getattr(event, "dest_path", "") or "")}
        if str(self.path) in names and event.event_type in ("moved", "created", "closed", "deleted"):
            self.look(event.event_type)

    def look(self, why: str) -> None:
        now = time.time()
        try:
            with self.path.open("rb") as f:
                stat = os.fstat(f.fileno())
                data = f.read()
        except FileNotFoundError:
            self.timeline.add(self.source, f"{why}: no kube-scheduler.yaml", now)
            return
        digest = hashlib.sha256(data).hexdigest()[:12]
        patched = b"--config=" in data
        tag = re.search(rb"kube-scheduler:(v[\w.]+)", data)
        if not self.versions or self.versions[-1][1] != stat.st_ino:
            self.versions.append((now, stat.st_ino, digest, patched))
            self.contents.append(data)
            self.timeline.add(self.source, f"{why}: inode {stat.st_ino} sha256 {digest} "
                              f"{tag.group(1).decode() if tag else '?'} {'patched' if patched else 'unpatched'} "
                              f"mtime {stat.st_mtime_ns / 1e9:.3f}", now)


@dataclass
class SchedulerWatch(SchedulerTimeline):
    """A `SchedulerTimeline` that lasts through an upgrade: kubectl's watch goes through the cluster's endpoint to
    one API server, and kubeadm restarts each (the watch then ends; a loaded server ends one with an ERROR event
    too); it is started again at once, and its first list
    gives every scheduler's state as it is then. `gaps` holds (ended, listed again) of each restart (monotonic): an
    event inside one is not seen, only the state it left."""

    node: KubeadmNode | None = None
    gaps: list[tuple[float, float]] = field(default_factory=list)
    stopped: threading.Event = field(default_factory=threading.Event)
    guard: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread | None = None

    @classmethod
    def watch(cls, node: KubeadmNode) -> SchedulerWatch:
        timeline = cls(node=node)
        timeline.thread = threading.Thread(target=timeline._run, daemon=True)
        timeline.thread.start()
        return timeline

    def _run(self) -> None:
        assert self.node is not None
        ended: float | None = None
        while True:
            with self.guard:
                if self.stopped.is_set():
                    return
                self.proc = subprocess.Popen(self.node.inside([
                    str(self.node.binaries.path("kubectl")), "--kubeconfig=/etc/kubernetes/admin.conf", "get", "pods",
                    "--namespace=kube-system", "--selector=component=kube-scheduler", "--watch",
                    "--output-watch-events", "--output=json"], pid_namespace=False),
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                    preexec_fn=die_with_parent)
            seen = len(self.events)
            self._read()  # until the watch ends
            self.proc.wait()
            if ended is not None and len(self.events) > seen:
                self.gaps.append((ended, self.events[seen][0]))
            ended = time.monotonic()
            self.stopped.wait(0.5)

    def stop(self) -> None:
        with self.guard:
            self.stopped.set()
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
        if self.thread is not None:
            self.thread.join(30)


# -- the upgrade --------------------------------------------------------------------------------------------------


def use_tools(node: KubeadmNode, binaries: Binaries, *names: str) -> None:
    """The node's PATH names `names` of `binaries`' release from now on (an admin installing the package)."""
    for name in names:
        link = node.run / "bin" / name
        link.unlink(missing_ok=True)
        link.symlink_to(binaries.path(name))


def import_release_images(node: KubeadmNode, new: Binaries) -> list[str]:
    """The images the new release's kubeadm names, built from its binaries and imported into the node's containerd
    (before the upgrade, as `kubeadm config images pull` would)."""
    config = node.run / "kubeadm-images.yaml"  # the cluster's configuration at the new release: no CoreDNS, proxy
    config.write_text(json.dumps({"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration",
                                  "kubernetesVersion": f"v{new.version}", "dns": {"disabled": True},
                                  "proxy": {"disabled": True}}))
    listed = subprocess.run([str(new.path("kubeadm")), "config", "images", "list", f"--config={config}"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert listed.returncode == 0, f"kubeadm config images list: {listed.stderr}"
    images = listed.stdout.split()
    present = set(node.ctr("images", "ls", "-q").split())
    for image in images:
        if image in present:
            continue
        files, entrypoint = image_contents(new, image)
        archive = image_archive(node.run / "images.tar", (image,), files, entrypoint)
        node.ctr("images", "import", str(archive))
        archive.unlink()
    assert set(images) <= set(node.ctr("images", "ls", "-q").split())
    return images


def upgrade_apply(node: KubeadmNode, new: Binaries, timeline: Timeline, source: str = "kubeadm") -> StampedProcess:
    """`kubeadm upgrade apply v<new> -y` of the new release in the node, started; `wait` for its end.

    Without the etcd upgrade: the new release names another etcd tag (3.7.0-0 for 1.37), but the only etcd built
    here is one 3.6 binary, so that image would hold the same program under another name; the agent never touches
    etcd's manifest, and what the etcd upgrade adds (a copy of its data, etcd's restart) is an API server outage
    this journey has anyway, when kube-apiserver restarts."""
    config = node.run / "kubeadm-upgrade.yaml"
    config.write_text(upgrade_config(new))
    return StampedProcess(node, source, [str(new.path("kubeadm")), "upgrade", "apply", f"v{new.version}",
                                            f"--config={config}", "-y", "--v=1"], timeline)


def upgrade_node_config() -> str:
    """kubeadm's UpgradeConfiguration for `upgrade node`: no etcd upgrade and no pull (as `upgrade_config`), init's
    ignored checks (`upgrade node` runs neither the cluster health checks nor the CoreDNS ones)."""
    return json.dumps({
        "apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "UpgradeConfiguration",
        "node": {"etcdUpgrade": False, "imagePullPolicy": "Never",
                 "ignorePreflightErrors": sorted(IGNORED_PREFLIGHT)},
    }, indent=1) + "\n"


def upgrade_node(node: KubeadmNode, new: Binaries, timeline: Timeline, source: str = "kubeadm") -> StampedProcess:
    """`kubeadm upgrade node` of the new release on a control-plane node other than the one `upgrade apply` ran
    on, started; `wait` for its end. It upgrades that node's static pods to the release of the cluster's
    kubeadm-config (which `upgrade apply` set), by the same static-pod upgrade as `upgrade apply`: the backup, the
    rename, the wait for the mirror pod's hash to change."""
    config = node.run / "kubeadm-upgrade-node.yaml"
    config.write_text(upgrade_node_config())
    return StampedProcess(node, source, [str(new.path("kubeadm")), "upgrade", "node", f"--config={config}",
                                            "--v=1"], timeline)


def drain(node: KubeadmNode) -> None:
    """`kubectl drain` as kubeadm's upgrade documentation has it before `kubeadm upgrade`: the node cordoned, its
    pods but the DaemonSets' and the static pods evicted. On a one-node cluster `upgrade apply` then skips its
    `CreateJob` health check (no schedulable node)."""
    kubectl_ok(node, "drain", node.name, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=120s")


def uncordon(node: KubeadmNode) -> None:
    kubectl_ok(node, "uncordon", node.name)


def kubectl_ok(node: KubeadmNode, *args: str) -> None:
    proc = node.kubectl(*args, timeout=180)
    assert proc.returncode == 0, f"kubectl {args[0]}: {proc.stderr}"


def pid_in(node: KubeadmNode, program: str) -> int:
    """The PID of the one process in the node's PID namespace whose executable is `program` (a path) or named
    `program`. A child it has forked and not yet exec'd (the kubelet runs `mount`, `nsenter`, ... that way) shows the
    same executable for that instant: a match whose parent is a match is that child, not a second program."""
    own = os.readlink(f"/proc/{node.init_pid}/ns/pid")
    found: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                exe = os.readlink(entry / "exe")
                if (exe if "/" in program else os.path.basename(exe)) == program \
                        and os.readlink(entry / "ns" / "pid") == own:
                    found[int(entry.name)] = int((entry / "stat").read_text().rsplit(") ", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    roots = [pid for pid, parent in found.items() if parent not in found]
    assert len(roots) == 1, f"{program} in {node.name}: {found} (pid: parent)"
    return roots[0]


def restart_kubelet(node: KubeadmNode, old: Binaries, new: Binaries) -> None:
    """The kubelet upgrade of kubeadm's documentation: the old kubelet stopped, the new one started as kubeadm's
    systemd drop-in starts it (with the flags kubeadm wrote, which the upgrade may have rewritten). Its containers
    keep running meanwhile; the new kubelet takes them over."""
    pid = pid_in(node, str(old.path("kubelet")))
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 60, "the old kubelet's exit")
    argv = node.kubelet_argv(node.host("/var/lib/kubelet/kubeadm-flags.env"))
    node.spawn("kubelet", [str(new.path("kubelet")), *argv[1:]])


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True


#: Every file below a folder: (mode, mtime_ns, sha256), by relative path.
Snapshot = dict[str, tuple[int, int, str]]


def snapshot(folder: Path) -> Snapshot:
    """What `Snapshot` says, of `folder` now."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            stat = path.stat()
            out[str(path.relative_to(folder))] = (stat.st_mode, stat.st_mtime_ns,
                                                  hashlib.sha256(path.read_bytes()).hexdigest())
    return out


# -- the agent and its extender in the node ------------------------------------------------------------------------


def extender(node: KubeadmNode, timeline: Timeline, port: int) -> StampedProcess:
    """An extender on the node's loopback (the scheduler's network) that keeps every node a filter call names."""
    code = ("from tests.harness.emu.extservers import ExtenderServer\n"
            f"s = ExtenderServer(port={port})\ns.passthrough = True\n"
            "print('extender listening', flush=True)\ns.serve_forever()\n")
    proc = StampedProcess(node, "extender", [sys.executable, "-c", code], timeline,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    wait_until(lambda: proc.lines or proc.proc.poll() is not None, 60, "the extender's start")
    assert proc.proc.poll() is None, proc.text()
    return proc


def agent(node: KubeadmNode, source: Path, timeline: Timeline, *args: str) -> StampedProcess:
    """`scheduler-patcher run` as a process in the node, on its files (`--host-root /`: the node's own paths),
    with kubeadm's admin credentials."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PATCHER_")}
    env["PYTHONPATH"] = str(ROOT)
    return StampedProcess(node, "agent", [
        sys.executable, "-m", "patcher", "run", "--host-root", "/", "--source", str(source),
        "--kubeconfig", "/etc/kubernetes/admin.conf", "--node-name", node.name, "--namespace", "scheduler-patcher",
        "--listen", "127.0.0.1:9808", *args], timeline, env=env)


PREFIX = "scheduler-patcher.io/"


def answer(node: KubeadmNode, path: str) -> dict[str, Any] | None:
    """An API object, or None while the API server does not answer (it restarts during the upgrade, and again
    when the new kubelet restarts it: the kubelet's hash of every static pod changes between releases)."""
    try:
        return node.get(path)
    except AssertionError:
        return None


def node_annotations(node: KubeadmNode) -> dict[str, str]:
    got = answer(node, f"/api/v1/nodes/{node.name}")
    if got is None:
        return {}
    return {k[len(PREFIX):]: v for k, v in (got["metadata"].get("annotations") or {}).items() if k.startswith(PREFIX)}


def ready_on(node: KubeadmNode, version: str) -> dict[str, Any] | None:
    """The scheduler's mirror pod once it runs `version`'s image with the agent's --config and the agent says
    `Ready` for the manifest as it is now."""
    try:
        running = node.running()
    except AssertionError:  # the API server restarts
        return None
    if running is None:
        return None
    pod = running[1]
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "kube-scheduler")
    flags = [*container.get("command", []), *container.get("args", [])]
    if not container["image"].endswith(f":v{version}") or not any(f.startswith("--config=") for f in flags):
        return None
    state = node_annotations(node)
    manifest = node.host(f"{MANIFESTS}/kube-scheduler.yaml")
    mtime = manifest.stat().st_mtime_ns
    if state.get("state") != "Ready" or not state.get("manifest-mtime"):
        return None
    # the agent's annotation is its last write's mtime: the manifest now is the one it wrote
    seconds, _, frac = state["manifest-mtime"].rstrip("Z").partition(".")
    stamp = calendar.timegm(time.strptime(seconds, "%Y-%m-%dT%H:%M:%S")) * 10**9 + int(frac.ljust(9, "0"))
    return pod if stamp == mtime else None
