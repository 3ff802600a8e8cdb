"""One real node for tests: the upstream kubelet of `make real-k8s`, containerd and runc, and a folder.

tests/harness/emu/kubeletsim.py plays the kubelet everywhere else; here the program the agent writes for reads the
files. A `RealNode` is:

* a private mount and PID namespace (`unshare`), whose init is the project's pause binary (it reaps the shims'
  orphans). Inside it the node paths the manifests name, /etc/kubernetes, /var/lib/scheduler-patcher and
  /var/lib/rancher, are bind mounts of folders below the test root, so a manifest written by the agent with
  `--host-root /` reads on this machine exactly as on a node, and hostPath volumes resolve below the test root.
  The host keeps only the empty mount points (made when missing, removed at stop when they were);
* containerd (Debian's, see `runtime_missing`) with its root, state, socket and runc root below the test root,
  a pod network of the CNI loopback plugin only (`pod_network`: the Node is Ready with it; the static pods use
  hostNetwork; a node with a network namespace of its own, as kubeadm_node.py's, gives its pods an address),
  its sandbox image the pause binary, and the release's kube-scheduler as `registry.k8s.io/kube-scheduler:v<X>`:
  both are image archives written here and imported, never pulled (no registry is reachable);
* the release's kubelet with a client certificate of `system:node:<name>` signed by the control plane's CA
  (the Node authorizer and NodeRestriction then treat it as the node it is), cgroupfs on the host's cgroup v1
  (`failCgroupV1: false`: from 1.35 the kubelet refuses v1 without it), its static pod folder the node path.

Stopping kills the namespace's init: the kernel then kills every process in it (kubelet, containerd, shims and
containers), and the mounts go with the namespace.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from tests.harness.real.controlplane import (
    Binaries,
    ControlPlane,
    die_with_parent,
    free_port,
    issue,
    kubeconfig_text,
    wait_until,
)
from tools.realk8s.build import cache_root

#: Node paths bound to folders below the test root inside the node's mount namespace.
NODE_PATHS = ("/etc/kubernetes", "/var/lib/scheduler-patcher", "/var/lib/rancher")
KUBEADM_MANIFESTS = "/etc/kubernetes/manifests"
RKE2_MANIFESTS = "/var/lib/rancher/rke2/agent/pod-manifests"
PAUSE_IMAGE = "localhost/scheduler-patcher/pause:realk8s"
RUNTIME_PROGRAMS = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "unshare", "nsenter")
CNI_BIN = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
START_DEADLINE = 60.0


def pause_binary() -> Path:
    """Built by `make real-k8s` (tools/realk8s/pause) beside etcd."""
    return cache_root() / "pause" / "pause"


def runtime_missing() -> str | None:
    """One line on what the real node lacks here, or None. `make real-k8s` installs the runtime where it can."""
    missing = [p for p in RUNTIME_PROGRAMS if shutil.which(p) is None]
    if missing:
        return f"no {', '.join(missing)} on PATH: `make real-k8s` installs containerd and runc (Debian, as root)"
    if not (CNI_BIN / "loopback").is_file():
        return f"no {CNI_BIN / 'loopback'}: `make real-k8s` installs Debian's containernetworking-plugins"
    if not pause_binary().is_file():
        return f"no {pause_binary()}: `make real-k8s` builds it"
    if os.geteuid() != 0:
        return "the real node needs root (mount namespaces, containers)"
    return None


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def image_archive(path: Path, names: tuple[str, ...], files: dict[str, Path], entrypoint: list[str]) -> Path:
    """A `docker save` archive of one uncompressed layer holding `files` (image path -> host file, mode 0755):
    what `ctr images import` reads. The binaries are static (CGO_ENABLED=0), so the layer needs nothing else."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        made: set[str] = set()
        for image_path, host in sorted(files.items()):
            parts = image_path.strip("/").split("/")
            for i in range(1, len(parts)):
                folder = "/".join(parts[:i])
                if folder not in made:
                    made.add(folder)
                    info = tarfile.TarInfo(folder)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
            info = tarfile.TarInfo("/".join(parts))
            info.size, info.mode = host.stat().st_size, 0o755
            with host.open("rb") as f:
                tar.addfile(info, f)
        for folder in ("tmp",):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777
            tar.addfile(info)
    layer_bytes = layer.getvalue()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer_bytes)]},
    }).encode()
    with tarfile.open(path, "w") as tar:
        for member, data in (("layer.tar", layer_bytes), ("config.json", config),
                             ("manifest.json", json.dumps([{"Config": "config.json", "RepoTags": list(names),
                                                            "Layers": ["layer.tar"]}]).encode())):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def scheduler_images(version: str) -> tuple[str, str]:
    """The names kubeadm and RKE2 write for the release's scheduler: the kubelet finds them present
    (IfNotPresent) and pulls nothing."""
    return (f"registry.k8s.io/kube-scheduler:v{version}",
            f"index.docker.io/rancher/hardened-kubernetes:v{version}-rke2r1-build20240614")


def inline_kubeconfig(cp: ControlPlane, crt: Path, key: Path) -> str:
    """A kubeconfig holding its certificate and key, so one file is all a container's hostPath needs."""
    return kubeconfig_text(cp.url, cp.pki / "ca.crt", {
        "client-certificate-data": base64.b64encode(crt.read_bytes()).decode(),
        "client-key-data": base64.b64encode(key.read_bytes()).decode()})


class NamespacedNode:
    """What the real nodes share (this module's `RealNode`, kubeadm_node.py's `KubeadmNode`): a host of its own,
    whose init is the pause binary in namespaces `unshare` makes, with `NODE_PATHS` bound to folders below the test
    root; containerd in it, its root, state and runc root below the test root; and the stop that takes it all.

    A subclass is a dataclass with a `root` field; this holds the processes and mount points it made."""

    root: Path
    #: Node paths bound to folders below the test root inside the node's mount namespace.
    NODE_PATHS: ClassVar[tuple[str, ...]]
    #: The node's own namespaces (`unshare` and `nsenter` flags); the mount namespace is always one.
    NAMESPACES: ClassVar[tuple[str, ...]] = ("--mount", "--pid")
    SOCKETS_PREFIX: ClassVar[str] = "rn-"
    #: containerd's registry hosts folder (the CRI plugin's `registry.config_path`, one `<host:port>/hosts.toml` per
    #: registry, read at each pull: it may be filled after the start); None: none, images are imported only.
    registry_config: Path | None = None

    def __post_init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.init_pid = 0
        self.made_mount_points: list[Path] = []
        #: Unix sockets live here (the kubelet's pod-resources one, containerd's): below a pytest-xdist basetemp
        #: their paths pass the 107 bytes a socket address holds, and the kubelet exits on "bind: invalid argument".
        self.sockets = Path(tempfile.mkdtemp(prefix=self.SOCKETS_PREFIX))

    # -- paths ------------------------------------------------------------------------------------------------

    @property
    def host_root(self) -> Path:
        """The node's file system as the agent's `--host-root` sees it (the node paths below it)."""
        return self.root / "node"

    def host(self, node_path: str) -> Path:
        """Where a node path lives on this machine (below the test root)."""
        return self.host_root / node_path.lstrip("/")

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def socket(self) -> Path:
        return self.sockets / "containerd.sock"

    def log(self, name: str, lines: int = 40) -> str:
        path = self.run / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else ""

    # -- start ------------------------------------------------------------------------------------------------

    def _namespace(self, setup: Sequence[str], deadline: float) -> None:
        """Starts the node's init: `setup` run in its namespaces, then the node paths bound, then pause."""
        binds = []
        for node_path in self.NODE_PATHS:
            point = Path(node_path)
            if not point.exists():
                point.mkdir(parents=True)
                self.made_mount_points.append(point)
            binds.append(f"mount --bind {self.host(node_path)} {node_path}")
        script = " && ".join([*setup, *binds, f"exec {pause_binary()}"])
        self.procs.append(subprocess.Popen(
            ["unshare", *self.NAMESPACES, "--propagation", "private", "--kill-child=SIGKILL", "--mount-proc",
             "sh", "-c", script], preexec_fn=die_with_parent, stdin=subprocess.DEVNULL,
            stdout=(self.run / "namespace.log").open("wb"), stderr=subprocess.STDOUT))
        holder = self.procs[0]

        def init() -> int:
            if holder.poll() is not None:
                raise RuntimeError(f"unshare exited {holder.returncode}: {self.log('namespace')}")
            children = Path(f"/proc/{holder.pid}/task/{holder.pid}/children").read_text().split()
            if not children:
                return 0
            pid = int(children[0])
            exe = os.readlink(f"/proc/{pid}/exe") if Path(f"/proc/{pid}/exe").exists() else ""
            return pid if exe == str(pause_binary()) else 0

        self.init_pid = wait_until(init, deadline, lambda: f"the node namespace's init\n{self.log('namespace')}")

    def inside(self, argv: list[str], *, pid_namespace: bool = True) -> list[str]:
        """`argv` run in the node's namespaces (with its PID namespace: everything that must die with it)."""
        flags = [f for f in self.NAMESPACES if pid_namespace or f != "--pid"]
        return ["nsenter", f"--target={self.init_pid}", *flags, "--", *argv]

    def environment(self) -> dict[str, str] | None:
        """The environment of what `spawn` starts when its caller names none; None: this process's."""
        return None

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None, *,
              pid_namespace: bool = True) -> subprocess.Popen[bytes]:
        with (self.run / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(self.inside(argv, pid_namespace=pid_namespace), stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.environment() if env is None else env, preexec_fn=die_with_parent)
        self.procs.append(proc)
        return proc

    def _alive(self, proc: subprocess.Popen[bytes], name: str) -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log(name)}")
        return True

    def _containerd(self, sandbox_image: str) -> None:
        """Starts containerd in the node, `sandbox_image` its pods' sandbox, and waits for its socket."""
        run = self.run
        (run / "containerd.toml").write_text(f"""version = 2
root = "{run / 'containerd-root'}"
state = "{run / 'containerd-state'}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.sockets / 'containerd.sock.ttrpc'}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{run / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  enable_selinux = false
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{run / 'runc'}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{run / 'cni-conf'}"
""" + ("" if self.registry_config is None else f"""  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{self.registry_config}"
"""))
        # Without a network config the runtime reports NetworkReady=false and the kubelet keeps the Node NotReady,
        # so its registration taint node.kubernetes.io/not-ready stays (a DaemonSet does not tolerate it: it would
        # select no such node).
        (run / "cni-conf").mkdir(exist_ok=True)
        (run / "cni-conf" / "10-pods.conflist").write_text(json.dumps(self.pod_network()))
        proc = self.spawn("containerd", ["containerd", f"--config={run / 'containerd.toml'}"])
        wait_until(lambda: self._alive(proc, "containerd") and self.socket.exists(), START_DEADLINE,
                   "containerd's socket")

    def pod_network(self) -> dict[str, Any]:
        """The node's pod network (a CNI conflist): loopback only, for a node on this machine's own network, which
        nothing here may change. The Node is Ready with it, the static pods use hostNetwork; a pod without
        hostNetwork never starts (containerd's CRI wants an address on the pod's `eth0`: "failed to find network
        info for sandbox")."""
        return {"cniVersion": "0.4.0", "name": "node-loopback", "plugins": [{"type": "loopback"}]}

    def ctr(self, *args: str) -> str:
        """containerd's own client on the node's socket, in the CRI plugin's namespace."""
        proc = subprocess.run(["ctr", f"--address={self.socket}", "--namespace=k8s.io", *args],
                              capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, f"ctr {' '.join(args)}: {proc.stderr}"
        return proc.stdout

    # -- stop -------------------------------------------------------------------------------------------------

    def stop(self) -> None:
        if self.procs:
            holder = self.procs[0]
            if self.init_pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.init_pid, signal.SIGKILL)  # PID 1 of the node's namespace: takes all of it
            for proc in self.procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(timeout=30)
            assert holder.returncode is not None
        self.procs.clear()
        for point in self.made_mount_points:
            with contextlib.suppress(OSError):  # not empty: something else put files there
                point.rmdir()
        self.made_mount_points.clear()
        shutil.rmtree(self.sockets, ignore_errors=True)


@dataclass
class RealNode(NamespacedNode):
    """One node: kubelet + containerd of `binaries`' release, registered with `cp`, files below `root`."""

    binaries: Binaries
    cp: ControlPlane
    root: Path
    name: str = "node-a"
    static_pod_path: str = KUBEADM_MANIFESTS
    started_in: float = 0.0
    NODE_PATHS: ClassVar[tuple[str, ...]] = NODE_PATHS

    # -- start ------------------------------------------------------------------------------------------------

    def start(self) -> RealNode:
        started = time.monotonic()
        self.run.mkdir(parents=True, exist_ok=True)
        for node_path in NODE_PATHS:
            self.host(node_path).mkdir(parents=True, exist_ok=True)
        self.host(self.static_pod_path).mkdir(parents=True, exist_ok=True)
        self._namespace((), 10)
        self._certificates()
        self._containerd(PAUSE_IMAGE)
        self._images()
        self._kubelet()
        wait_until(lambda: self._registered(), START_DEADLINE,
                   lambda: f"node {self.name} registered\n{self.log('kubelet')}")
        self.started_in = time.monotonic() - started
        return self

    def _certificates(self) -> None:
        pki = self.cp.pki
        issue(pki, f"{self.name}-client", f"/O=system:nodes/CN=system:node:{self.name}", client=True)
        issue(pki, f"{self.name}-serving", f"/CN=system:node:{self.name}", server_names=("127.0.0.1", self.name))
        crt, key = issue(pki, "kube-scheduler", "/CN=system:kube-scheduler", client=True)
        # kubeadm's scheduler.conf: what the manifest's hostPath volume mounts into the container
        text = inline_kubeconfig(self.cp, crt, key)
        self.host("/etc/kubernetes/scheduler.conf").write_text(text)
        rke2 = self.host("/var/lib/rancher/rke2/server/cred/scheduler.kubeconfig")  # RKE2's path for the same
        rke2.parent.mkdir(parents=True, exist_ok=True)
        rke2.write_text(text)
        (self.run / "kubelet.kubeconfig").write_text(inline_kubeconfig(self.cp, pki / f"{self.name}-client.crt",
                                                                       pki / f"{self.name}-client.key"))

    def _images(self) -> None:
        run = self.run
        schedulers = scheduler_images(self.binaries.version)
        for archive in (
            image_archive(run / "pause.tar", (PAUSE_IMAGE,), {"/pause": pause_binary()}, ["/pause"]),
            image_archive(run / "kube-scheduler.tar", schedulers,
                          {"/usr/local/bin/kube-scheduler": self.binaries.path("kube-scheduler")}, ["kube-scheduler"]),
        ):
            self.ctr("images", "import", str(archive))
        listed = self.ctr("images", "ls", "-q").split()
        wanted = {PAUSE_IMAGE, *(n.replace("index.docker.io/", "docker.io/") for n in schedulers)}
        assert wanted <= set(listed), listed  # containerd spells Docker Hub's names docker.io/...

    def kubelet_config(self) -> dict[str, Any]:
        run, pki = self.run, self.cp.pki
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "staticPodPath": self.static_pod_path,  # the file check and sync periods: the defaults (20 s, 1 min)
            "cgroupDriver": "cgroupfs", "failCgroupV1": False, "failSwapOn": False, "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [], "containerRuntimeEndpoint": f"unix://{self.socket}",
            "address": "127.0.0.1", "port": free_port(), "readOnlyPort": 0, "healthzPort": 0,
            "tlsCertFile": str(pki / f"{self.name}-serving.crt"),
            "tlsPrivateKeyFile": str(pki / f"{self.name}-serving.key"),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(pki / "ca.crt")}},
            "authorization": {"mode": "AlwaysAllow"},
            "podLogsDir": str(run / "pods"), "resolvConf": "", "evictionHard": {},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "localStorageCapacityIsolation": False, "shutdownGracePeriod": "0s",
        }

    def _kubelet(self) -> None:
        config = self.run / "kubelet.json"
        config.write_text(json.dumps(self.kubelet_config(), indent=1))
        self.spawn("kubelet", [str(self.binaries.path("kubelet")), f"--config={config}",
                               f"--kubeconfig={self.run / 'kubelet.kubeconfig'}", f"--hostname-override={self.name}",
                               f"--root-dir={self.sockets / 'kubelet'}", "--v=2"])

    def _registered(self) -> bool:
        self._alive(self.procs[-1], "kubelet")
        status, _ = self.cp.request("GET", f"/api/v1/nodes/{self.name}")
        return status == 200

    def write_manifest(self, node_path: str, data: bytes) -> Path:
        """Writes a static pod file whole (a dot file renamed into place: the kubelet ignores dot files), as
        an installer does; a plain write shows the kubelet an empty file first, which it logs as unparsable."""
        path = self.host(node_path)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        return path

    # -- what tests look at -----------------------------------------------------------------------------------

    def mirror_pod(self, static_name: str = "kube-scheduler", namespace: str = "kube-system") -> dict[str, Any] | None:
        status, pod = self.cp.request("GET", f"/api/v1/namespaces/{namespace}/pods/{static_name}-{self.name}")
        return pod if status == 200 else None

    def running(self, static_name: str = "kube-scheduler") -> tuple[str, str] | None:
        """(container ID, config hash) of the static pod's running container, from its mirror pod; None while
        it does not run. The container ID tells one start from the next: the hash need not change (a manifest
        with `metadata.uid`, as RKE2 writes, has that UID as its hash; a restart of the same pod keeps it)."""
        pod = self.mirror_pod(static_name)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return None
        statuses = pod.get("status", {}).get("containerStatuses") or []
        if not statuses or "running" not in statuses[0].get("state", {}) or not statuses[0].get("containerID"):
            return None
        return statuses[0]["containerID"], pod["metadata"]["annotations"]["kubernetes.io/config.hash"]
