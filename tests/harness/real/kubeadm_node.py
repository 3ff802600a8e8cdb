"""One control-plane node made by the real `kubeadm init`, for tests: what a kubeadm user's node runs, not a fixture.

tests/harness/real/kubelet_node.py runs the release's kubelet beside a control plane the harness starts itself, and a
scheduler manifest the test writes. Here kubeadm writes everything, as on a user's node: the certificates, the
kubeconfigs, the kubelet's configuration and the four static pods (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler), which the release's kubelet then runs on containerd. A `KubeadmNode` is:

* a host of its own: network, mount, PID and UTS namespaces (`unshare`), whose init is the project's pause binary.
  Its network is loopback and `eth0` holding its address (`ADDRESS` alone) with the default route on it (kubeadm
  advertises the address of the default route's interface): alone, one end of a veth pair whose other end is in
  the node too (the kernel here has no `dummy` device: "Unknown device type"); in a cluster, a veth pair's end whose
  other end is on the cluster's bridge (tests/harness/real/kubeadm_cluster.py). Nothing in it is reachable from the
  machine, and nothing of the machine's network changes. The node paths kubeadm, the kubelet and etcd write
  (`NODE_PATHS`) are bind mounts of folders below the test root (etcd's, a tmpfs: `_network` says why), so a
  manifest kubeadm wrote reads at `host(path)` on this machine, and the agent run with `--host-root` on that folder
  sees the node as its DaemonSet pod would;
* containerd (Debian's) with its root, state and socket below the test root, and the images `kubeadm config images
  list` names for the release built here from the release's binaries (`make real-k8s`): kube-apiserver,
  kube-controller-manager, kube-scheduler, etcd and pause, each one layer holding the static binary, imported with
  `ctr images import` under kubeadm's names. With `imagePullPolicy: Never` kubeadm's preflight pulls nothing (no
  registry is reachable here), and the kubelet finds every image of the manifests present;
* `kubeadm init` (or, a cluster's next node, `kubeadm join --control-plane`) with a configuration file
  (`init_config`, `join_config`): CoreDNS and kube-proxy disabled (no images of theirs
  exist here, and one node with host-network pods needs neither), the kubelet settings this machine needs
  (cgroupfs on the host's cgroup v1 with `failCgroupV1: false`, no QoS cgroups, no swap check), and only the
  preflight checks in `IGNORED_PREFLIGHT` ignored, each for the reason it names;
* the release's kubelet, started the way kubeadm's systemd drop-in starts it (`--config`, `--kubeconfig`,
  `--bootstrap-kubeconfig` and the flags of `/var/lib/kubelet/kubeadm-flags.env`) as soon as kubeadm's
  `kubelet-start` phase has written them: there is no systemd in the node, so kubeadm's own start of the service
  fails with a warning and its `wait-control-plane` phase waits for this one.

Stopping kills the namespace's init: the kernel then kills every process in it (kubelet, containerd, shims and
containers), and the network and mounts go with the namespaces.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tests.harness.real.controlplane import Binaries, built_releases, wait_until
from tests.harness.real.kubelet_node import NamespacedNode, image_archive, pause_binary, runtime_missing

#: Node paths bound to folders below the test root inside the node's mount namespace: kubeadm's (its PKI,
#: kubeconfigs and manifests; the kubelet's configuration and state; etcd's data) and the agent's state folder.
NODE_PATHS = ("/etc/kubernetes", "/var/lib/kubelet", "/var/lib/etcd", "/var/lib/scheduler-patcher", "/var/log")
MANIFESTS = "/etc/kubernetes/manifests"
#: The node's address, inside its own network namespace only (a documentation range: it routes nowhere).
ADDRESS = "192.0.2.10"
#: What the node needs beyond the real node's runtime (tests/harness/real/kubelet_node.py).
PROGRAMS = ("ip", "hostname", "sysctl", "curl")
BINARIES = ("kubeadm", "kube-controller-manager", "kube-apiserver", "kube-scheduler", "kubelet", "etcd")
#: kubeadm's preflight checks this sandbox cannot pass, and why. Every other check runs and must pass.
IGNORED_PREFLIGHT = {
    # The system verification fails on this machine's cgroup v1 (hybrid) hierarchy: from 1.35 kubeadm refuses v1
    # unless this check is skipped and the kubelet has `failCgroupV1: false` (both are needed, says its message).
    # Everything else it verifies (the kernel's namespaces, cgroup controllers, overlayfs) passes here.
    "SystemVerification",
}
INIT_DEADLINE = 600.0  # kubeadm waits up to 4 min for the kubelet and 4 more for the control plane


def releases_with_kubeadm() -> list[Binaries]:
    """The built releases that have every binary a kubeadm node runs, newest first."""
    return [b for b in built_releases() if all(b.path(n).is_file() for n in BINARIES)]


def kubeadm_missing() -> str | None:
    """One line on what the kubeadm node lacks here, or None when it can start."""
    why = runtime_missing()
    if why is not None:
        return why
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        return f"no {', '.join(missing)} on PATH (Debian: iproute2, hostname, procps, curl)"
    if not releases_with_kubeadm():
        releases = built_releases()
        where = releases[0].folder if releases else "the real-k8s cache"
        return f"no kubeadm and kube-controller-manager in {where}: `make real-k8s` builds them"
    return None


@dataclass(frozen=True)
class Bootstrap:
    """What ties the control-plane nodes of one cluster (tests/harness/real/kubeadm_cluster.py): the API endpoint in
    front of them all, the bootstrap token the others join with, the key `kubeadm init --upload-certs` encrypts the
    shared certificates with (both fixed in the configuration, so nothing is read back from kubeadm's output), and,
    for a join, the hash of the cluster CA's public key (`caCertHashes`: the joining node trusts that CA only)."""

    endpoint: str  # host:port
    token: str
    certificate_key: str
    ca_hash: str = ""


def registration(name: str, socket: Path) -> dict[str, Any]:
    return {"name": name, "criSocket": f"unix://{socket}", "imagePullPolicy": "Never",
            "ignorePreflightErrors": sorted(IGNORED_PREFLIGHT)}


def init_config(binaries: Binaries, name: str, socket: Path, address: str = ADDRESS,
                bootstrap: Bootstrap | None = None) -> str:
    """kubeadm's configuration: InitConfiguration, ClusterConfiguration and the KubeletConfiguration it writes.
    With `bootstrap`, the first node of several: the shared endpoint, the token and the certificate key. The
    KubeletConfiguration is stored in the cluster (ConfigMap kubelet-config) and each joining node writes it as its
    own: it names no path of one node (the pods' logs go to the default /var/log/pods, a node path)."""
    init: dict[str, Any] = {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "InitConfiguration",
                            "localAPIEndpoint": {"advertiseAddress": address, "bindPort": 6443},
                            "nodeRegistration": registration(name, socket)}
    cluster: dict[str, Any] = {}
    if bootstrap is not None:
        init["bootstrapTokens"] = [{"token": bootstrap.token, "ttl": "2h", "usages": ["signing", "authentication"],
                                    "groups": ["system:bootstrappers:kubeadm:default-node-token"]}]
        init["certificateKey"] = bootstrap.certificate_key
        cluster["controlPlaneEndpoint"] = bootstrap.endpoint
    documents: list[dict[str, Any]] = [
        init,
        {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration", **cluster,
         "kubernetesVersion": f"v{binaries.version}", "clusterName": "kubeadm-node",
         # kube-controller-manager's FlexVolume folder: kubeadm mounts it as a hostPath DirectoryOrCreate, by default
         # /usr/libexec/kubernetes/kubelet-plugins/volume/exec, which the kubelet would create on this machine.
         "controllerManager": {"extraArgs": [{"name": "flex-volume-plugin-dir",
                                              "value": "/etc/kubernetes/flexvolume"}]},
         "dns": {"disabled": True}, "proxy": {"disabled": True}},
        {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
         "cgroupDriver": "cgroupfs", "failCgroupV1": False, "failSwapOn": False, "cgroupsPerQOS": False,
         "enforceNodeAllocatable": ["none"], "resolvConf": "",
         "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
         "localStorageCapacityIsolation": False, "shutdownGracePeriod": "0s"},
    ]
    return "---\n".join(json.dumps(d, indent=1) + "\n" for d in documents)


def join_config(name: str, socket: Path, address: str, bootstrap: Bootstrap) -> str:
    """`kubeadm join --control-plane`'s JoinConfiguration: discovery through the shared endpoint with the bootstrap
    token, pinned to the CA; the shared certificates fetched with the certificate key; this node's own API server
    address. The cluster's configuration (and the kubelet's) comes from the cluster, as kubeadm stored it at init."""
    return json.dumps({
        "apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "JoinConfiguration",
        "discovery": {"bootstrapToken": {"apiServerEndpoint": bootstrap.endpoint, "token": bootstrap.token,
                                         "caCertHashes": [bootstrap.ca_hash]}},
        "controlPlane": {"localAPIEndpoint": {"advertiseAddress": address, "bindPort": 6443},
                         "certificateKey": bootstrap.certificate_key},
        "nodeRegistration": registration(name, socket)}, indent=1) + "\n"


def image_contents(binaries: Binaries, image: str) -> tuple[dict[str, Path], list[str]]:
    """The files and entrypoint of one of kubeadm's images, from the release's binaries. kubeadm's manifests call
    each component by its name (`command: [kube-apiserver, ...]`), found on the image's PATH."""
    component = image.rsplit("/", 1)[1].split(":", 1)[0]
    if component == "pause":
        return {"/pause": pause_binary()}, ["/pause"]
    if component in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd"):
        return {f"/usr/local/bin/{component}": binaries.path(component)}, [component]
    raise ValueError(f"kubeadm lists an image this node cannot build: {image}")


@dataclass
class KubeadmNode(NamespacedNode):
    """One node of `binaries`' release made by `kubeadm init`, its files below `root`."""

    binaries: Binaries
    root: Path
    name: str = "kubeadm-a"
    address: str = ADDRESS
    #: Plugs the node's `eth0` into a shared network (the cluster's switch) once its namespaces exist; None: `eth0`
    #: is one end of a veth pair whose other end is in the node too (a network of its own).
    attach: Callable[[KubeadmNode], None] | None = None
    #: None: a node of its own. Else the cluster's: `join` False is its first node (`kubeadm init --upload-certs`),
    #: True one more (`kubeadm join --control-plane`, `bootstrap.ca_hash` set).
    bootstrap: Bootstrap | None = None
    join: bool = False
    images: list[str] = field(default_factory=list)
    registry_config: Path | None = None  # NamespacedNode.registry_config
    #: Pods without hostNetwork get an address (`pod_network`); False: loopback only, as `RealNode`'s.
    pod_addresses: bool = False
    #: seconds: the node's runtime up and the images imported; `kubeadm init` from its start to its exit
    runtime_in: float = 0.0
    init_in: float = 0.0
    NODE_PATHS: ClassVar[tuple[str, ...]] = NODE_PATHS
    NAMESPACES: ClassVar[tuple[str, ...]] = ("--mount", "--pid", "--net", "--uts")
    SOCKETS_PREFIX: ClassVar[str] = "kn-"

    # -- start ------------------------------------------------------------------------------------------------

    def start(self) -> KubeadmNode:
        started = time.monotonic()
        self.run.mkdir(parents=True, exist_ok=True)
        for node_path in NODE_PATHS:
            self.host(node_path).mkdir(parents=True, exist_ok=True)
        (self.run / "hosts").write_text(f"127.0.0.1 localhost\n{self.address} {self.name}\n")
        (self.run / "resolv.conf").write_text("")
        (self.run / "bin").mkdir(exist_ok=True)
        # kubeadm stops, reloads and starts the kubelet through systemctl when it finds one; in the node that would
        # reach this machine's systemd. This one answers that there is none (kubeadm then warns and goes on).
        stub = self.run / "bin" / "systemctl"
        stub.write_text("#!/bin/sh\necho 'systemctl: no systemd in this node (the harness runs the kubelet)' >&2\n"
                        "exit 1\n")
        stub.chmod(0o755)
        for program in ("kubelet", "kubeadm", "kubectl"):
            link = self.run / "bin" / program
            if not link.is_symlink():
                link.symlink_to(self.binaries.path(program))
        config = self.run / "kubeadm.yaml"
        config.write_text(init_config(self.binaries, self.name, self.socket, self.address, self.bootstrap))
        self._network()
        self._containerd(self._list_images(config))
        self._import_images()
        self.runtime_in = time.monotonic() - started
        command = ["init", f"--config={config}"]
        if self.bootstrap is not None and self.join:
            config = self.run / "kubeadm-join.yaml"
            config.write_text(join_config(self.name, self.socket, self.address, self.bootstrap))
            command = ["join", f"--config={config}"]
        elif self.bootstrap is not None:
            command.append("--upload-certs")
        self._init(command)
        self.init_in = time.monotonic() - started - self.runtime_in
        return self

    def _network(self) -> None:
        """The node's init in its own network and UTS namespaces too: `eth0` holding its address with the default
        route on it, its host name, and /etc/hosts naming it."""
        self._namespace([
            "ip link set lo up", f"hostname {self.name}",
            # the kubelet and kubeadm's preflight want forwarding on; this network namespace's own setting
            "sysctl -qw net.ipv4.ip_forward=1",
            # the node's own name resolves without DNS (kubeadm's preflight looks it up; the machine's resolver
            # would take its 10 s timeout to say no)
            f"mount --bind {self.run / 'hosts'} /etc/hosts",
            f"mount --bind {self.run / 'resolv.conf'} /etc/resolv.conf",
            # etcd's data in memory, seen by this namespace only (bound to /var/lib/etcd with the node paths): on
            # this machine's one disk, beside the images a journey imports (~1 GB at once), the members' fdatasync
            # took up to 4.5 s (etcd expects under 1), their leader changed four times in a minute and the kubelets
            # restarted every API server at once (/livez failing). A kubeadm user gives etcd a disk of its own.
            f"mount -t tmpfs -o size=2g,mode=0700 etcd-data {self.host('/var/lib/etcd')}",
        ], 30)
        if self.attach is None:
            self.sh("ip link add eth0 type veth peer name eth0-peer && ip link set eth0-peer up")
        else:
            self.attach(self)
        self.sh(f"ip addr add {self.address}/24 dev eth0 && ip link set eth0 up && ip route add default dev eth0")

    def pod_network(self) -> dict[str, Any]:
        """With `pod_addresses`, a pod network in the node's own network namespace: each pod without hostNetwork
        gets a veth pair to the node (CNI `ptp`) and an address of the node's own /24 (`host-local`, its leases
        below the test root), with its default route through the node. Pods then run, as on any kubeadm node with
        a CNI (kubeadm's upgrade health check runs one: a Job of `pause -v`), and reach the node's own addresses;
        no pod reaches another node (no routes between the nodes' pod ranges, no masquerade: nothing here needs
        it). Off by default: a pod that starts costs its node a sandbox (runc, a veth pair), and the journeys
        whose prober creates four pods a second (bench/rollout_gap.py) measured their bounds without that load."""
        if not self.pod_addresses:
            return super().pod_network()
        return {"cniVersion": "0.4.0", "name": "node-pods", "plugins": [{
            "type": "ptp", "ipMasq": False,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": f"10.244.{self.address.rsplit('.', 1)[1]}.0/24"}]],
                     "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(self.run / "cni-ipam")}}]}

    def sh(self, script: str) -> None:
        """A shell command in the node's network and mount namespaces (not its PID one: it is done at once)."""
        proc = subprocess.run(self.inside(["sh", "-c", script], pid_namespace=False), capture_output=True,
                              text=True, timeout=60, check=False)
        assert proc.returncode == 0, f"{self.name}: {script}: {proc.stderr}"

    def environment(self) -> dict[str, str]:
        """PATH in the node: the release's kubelet, kubeadm and kubectl first (kubeadm's preflight runs
        `kubelet --version` from PATH), then this machine's."""
        return {**os.environ, "PATH": f"{self.run / 'bin'}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}

    def _list_images(self, config: Path) -> str:
        """Reads the images `kubeadm config images list` names into `images`; returns the sandbox (pause) one."""
        listed = subprocess.run([str(self.binaries.path("kubeadm")), "config", "images", "list",
                                 f"--config={config}"], capture_output=True, text=True, timeout=120, check=False)
        assert listed.returncode == 0, f"kubeadm config images list: {listed.stderr}"
        self.images = listed.stdout.split()
        return next(i for i in self.images if "/pause:" in i)

    def _import_images(self) -> None:
        """Every image of `images`, built from the release's binaries, imported under kubeadm's name."""
        run = self.run
        for image in self.images:
            files, entrypoint = image_contents(self.binaries, image)
            archive = image_archive(run / "images.tar", (image,), files, entrypoint)
            self.ctr("images", "import", str(archive))
            archive.unlink()
        present = set(self.ctr("images", "ls", "-q").split())
        assert set(self.images) <= present, (self.images, present)

    def _init(self, command: list[str]) -> None:
        """`kubeadm init` or `join` (its log is kubeadm-init either way), and the kubelet once kubeadm wrote its
        files."""
        kubeadm = self.spawn("kubeadm-init", [str(self.binaries.path("kubeadm")), *command, "--v=1"])
        flags_file = self.host("/var/lib/kubelet/kubeadm-flags.env")

        def kubelet_files() -> bool:
            self._alive(kubeadm, "kubeadm-init")
            # init writes the flags first, then config.yaml; join the other way round: both there and the flags'
            # one line whole
            return (self.host("/var/lib/kubelet/config.yaml").is_file() and flags_file.is_file()
                    and flags_file.read_text().endswith('"\n'))

        wait_until(kubelet_files, INIT_DEADLINE, lambda: f"kubeadm's kubelet files\n{self.log('kubeadm-init')}")
        self._kubelet(flags_file)
        deadline = time.monotonic() + INIT_DEADLINE
        while kubeadm.poll() is None:
            self._alive(self.procs[-1], "kubelet")
            assert time.monotonic() < deadline, f"kubeadm init still running\n{self.log('kubeadm-init')}"
            time.sleep(0.5)
        assert kubeadm.returncode == 0, (f"kubeadm {command[0]} exited {kubeadm.returncode}\n"
                                         f"{self.log('kubeadm-init', 60)}"
                                         f"\n--- kubelet ---\n{self.log('kubelet')}")

    def kubelet_argv(self, flags_file: Path) -> list[str]:
        """What kubeadm's systemd drop-in (10-kubeadm.conf) runs: its flags, then those of kubeadm-flags.env."""
        match = re.search(r'^KUBELET_KUBEADM_ARGS="(.*)"$', flags_file.read_text(), re.M)
        assert match, flags_file.read_text()
        return [str(self.binaries.path("kubelet")), "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
                "--kubeconfig=/etc/kubernetes/kubelet.conf", "--config=/var/lib/kubelet/config.yaml",
                *shlex.split(match.group(1)), "--v=2"]

    def _kubelet(self, flags_file: Path) -> None:
        self.spawn("kubelet", self.kubelet_argv(flags_file))

    # -- what tests look at -----------------------------------------------------------------------------------

    def kubectl(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """The release's kubectl in the node (the API server is reachable there only), as kubeadm's admin."""
        return subprocess.run(self.inside([str(self.binaries.path("kubectl")),
                                           "--kubeconfig=/etc/kubernetes/admin.conf", *args]),
                              capture_output=True, text=True, timeout=timeout, check=False)

    def get(self, path: str) -> dict[str, Any] | None:
        """An API object as JSON, or None when the server says it is not there."""
        proc = self.kubectl("get", "--raw", path)
        if proc.returncode != 0:
            if "NotFound" in proc.stderr or "not found" in proc.stderr:
                return None
            raise AssertionError(f"GET {path}: {proc.stderr}")
        found: dict[str, Any] = json.loads(proc.stdout)
        return found

    def running(self, static_name: str = "kube-scheduler") -> tuple[str, dict[str, Any]] | None:
        """(container ID, mirror pod) of the static pod's running, ready container; None while it is not."""
        pod = self.get(f"/api/v1/namespaces/kube-system/pods/{static_name}-{self.name}")
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return None
        statuses = pod.get("status", {}).get("containerStatuses") or []
        if not statuses or "running" not in statuses[0].get("state", {}) or not statuses[0].get("ready"):
            return None
        return statuses[0]["containerID"], pod

    def scheduler_configz(self) -> dict[str, Any] | None:
        """The running kube-scheduler's /configz (kubeadm's manifest: its secure port 10259 on loopback, its
        authorization delegated to the API server) as kubeadm's admin: the configuration the scheduler loaded. None
        while nothing answers there. Asked with curl in the node: the scheduler listens in the node's network."""
        pem = self.run / "admin.pem"
        if not pem.is_file():
            admin = self.host("/etc/kubernetes/admin.conf").read_text()
            parts = [re.search(rf"^\s*{key}: (\S+)$", admin, re.M) for key in ("client-certificate-data",
                                                                              "client-key-data")]
            pem.write_bytes(b"".join(base64.b64decode(m.group(1)) for m in parts if m))
            pem.chmod(0o600)
        # -k: the scheduler serves a certificate it made itself at its start, signed by no CA kubeadm made
        proc = subprocess.run(self.inside(["curl", "-sSk", "--fail", "--max-time", "10", "--cert", str(pem),
                                           "https://127.0.0.1:10259/configz"]),
                              capture_output=True, text=True, timeout=60, check=False)
        if proc.returncode != 0:
            return None
        found: dict[str, Any] = json.loads(proc.stdout)
        return found


    def scheduler_extenders(self) -> list[str] | None:
        """The extender URLs of the configuration the running scheduler loaded (its /configz); None while it
        answers none. 1.36 and later serve the versioned config (`extenders`, `urlPrefix`), 1.34 and 1.35 the
        internal Go struct (`Extenders`, `URLPrefix`): keys are compared case-folded."""
        configz = self.scheduler_configz()
        if configz is None:
            return None
        config = {str(k).casefold(): v for k, v in configz["componentconfig"].items()}
        urls = [str({str(k).casefold(): v for k, v in e.items()}["urlprefix"]) for e in config.get("extenders") or []]
        return urls or None

@contextmanager
def kubeadm_node(binaries: Binaries, root: Path, name: str = "kubeadm-a", registry_config: Path | None = None,
                 pod_addresses: bool = False) -> Iterator[KubeadmNode]:
    """A node `kubeadm init` made, stopped on exit (whatever the body raised)."""
    node = KubeadmNode(binaries, root, name, registry_config=registry_config, pod_addresses=pod_addresses)
    try:
        yield node.start()
    finally:
        node.stop()
