"""Several control-plane nodes made by the real kubeadm, for tests: the cluster of three a kubeadm user runs, stacked
etcd, the API endpoint behind a load balancer, one kube-scheduler and one kube-controller-manager per node electing
their leaders through real Leases.

Each node is a `KubeadmNode` (tests/harness/real/kubeadm_node.py): a host of its own (namespaces, containerd, the
release's kubelet, kubeadm's images built here). What this adds is their shared network and the way they meet:

* a *switch*: a network namespace of its own (`unshare --net`, its holder the project's pause binary) holding a
  bridge `br0` with `ENDPOINT_ADDRESS`. Each node's `eth0` is one end of a veth pair made in the switch, moved into
  the node (`ip link set ... netns <pid>`) and renamed there, the other end on the bridge. The addresses are in
  192.0.2.0/24 (a documentation range: it routes nowhere); nothing of the machine's network changes, and nothing on
  the switch is reachable from the machine;
* haproxy (Debian's) in the switch namespace on `ENDPOINT_ADDRESS:6443`, TCP to every node's API server on 6443 with
  TCP health checks: kubeadm's `controlPlaneEndpoint`. `maxconn` is low: haproxy sizes its file descriptors from it,
  and the open-files limit here is 20000 and cannot be raised;
* the first node runs `kubeadm init --upload-certs` with a fixed bootstrap token and certificate key in its
  configuration; each next one, in turn, `kubeadm join --control-plane` with a JoinConfiguration that pins the
  cluster's CA by the hash of its public key (computed from the first node's `ca.crt`, as `kubeadm token create
  --print-join-command` prints it) and fetches the shared certificates with that key. Joins go one at a time, as
  kubeadm's documentation asks: each adds an etcd member.

Stopping stops the nodes (each takes its processes and mounts with it), haproxy and the switch's holder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.harness.real.controlplane import Binaries, die_with_parent, wait_until
from tests.harness.real.kubeadm_node import Bootstrap, KubeadmNode, kubeadm_missing
from tests.harness.real.kubelet_node import pause_binary

#: The switch's own address on its bridge, where haproxy listens: the cluster's API endpoint.
ENDPOINT_ADDRESS = "192.0.2.2"
ENDPOINT = f"{ENDPOINT_ADDRESS}:6443"
#: Fixed secrets of a sandbox no one else reaches: kubeadm's format for both (a token `[a-z0-9]{6}.[a-z0-9]{16}`,
#: a certificate key of 32 bytes in hex).
TOKEN = "abcdef.0123456789abcdef"
CERTIFICATE_KEY = "6f1f0a2b3c4d5e6f708192a3b4c5d6e7f80912a3b4c5d6e7f8091a2b3c4d5e6f"
#: haproxy's maximum of connections: each takes two descriptors, and it refuses to start when its computed limit
#: passes the process's (20000 here).
MAXCONN = 2000
NAMES = "abc"


def cluster_missing() -> str | None:
    """One line on what the cluster lacks here beyond a kubeadm node's needs, or None when it can start."""
    why = kubeadm_missing()
    if why is not None:
        return why
    missing = [p for p in ("haproxy", "openssl", "ss") if shutil.which(p) is None]
    return f"no {', '.join(missing)} on PATH (Debian: haproxy, openssl, iproute2)" if missing else None


def node_address(index: int) -> str:
    return f"192.0.2.{11 + index}"


def haproxy_config(addresses: list[str]) -> str:
    servers = "\n".join(f"  server node{i} {a}:6443 check" for i, a in enumerate(addresses))
    return f"""global
  maxconn {MAXCONN}
defaults
  mode tcp
  timeout connect 5s
  timeout client 1h
  timeout server 1h
  timeout tunnel 1h
frontend kube-apiserver
  bind {ENDPOINT}
  default_backend control-plane
backend control-plane
  balance roundrobin
  default-server inter 1s fall 2 rise 1
{servers}
"""


def ca_cert_hash(ca: Path) -> str:
    """`sha256:<hex>` of the CA's SubjectPublicKeyInfo (DER): kubeadm's `caCertHashes` form."""
    proc = subprocess.run(["sh", "-c", f"openssl x509 -pubkey -noout -in {ca} | openssl pkey -pubin -outform der "
                                       "| sha256sum"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout, proc.stderr
    return "sha256:" + proc.stdout.split()[0]


@dataclass
class Switch:
    """The nodes' shared network: a bridge in a network namespace of its own, and haproxy in front of the nodes'
    API servers there."""

    root: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.procs[0].pid

    def start(self, addresses: list[str]) -> Switch:
        self.root.mkdir(parents=True, exist_ok=True)
        # unshare without --fork execs sh in the new namespace, and sh execs pause: the first process holds it
        self.procs.append(subprocess.Popen(
            ["unshare", "--net", "sh", "-c", "ip link set lo up && ip link add br0 type bridge && "
             f"ip addr add {ENDPOINT_ADDRESS}/24 dev br0 && ip link set br0 up && exec {pause_binary()}"],
            preexec_fn=die_with_parent, stdin=subprocess.DEVNULL,
            stdout=(self.root / "switch.log").open("wb"), stderr=subprocess.STDOUT))
        wait_until(lambda: self._alive() and f"{ENDPOINT_ADDRESS}/24" in self._run("ip", "-o", "addr", "show"), 30,
                   lambda: f"the switch's bridge\n{self.log('switch')}")
        (self.root / "haproxy.cfg").write_text(haproxy_config(addresses))
        self.procs.append(subprocess.Popen(
            ["nsenter", f"--net=/proc/{self.pid}/ns/net", "haproxy", "-db", "-f", str(self.root / "haproxy.cfg")],
            preexec_fn=die_with_parent, stdin=subprocess.DEVNULL,
            stdout=(self.root / "haproxy.log").open("wb"), stderr=subprocess.STDOUT))
        wait_until(lambda: self._alive() and f"{ENDPOINT} " in self._run("ss", "-Htln"), 30,
                   lambda: f"haproxy listening on {ENDPOINT}\n{self.log('haproxy')}")
        return self

    def _alive(self) -> bool:
        for proc, name in zip(self.procs, ("switch", "haproxy"), strict=False):
            if proc.poll() is not None:
                raise RuntimeError(f"the {name} exited {proc.returncode}:\n{self.log(name)}")
        return True

    def _run(self, *argv: str) -> str:
        """What `argv` prints in the switch's network namespace ("" when it fails: a check that waits)."""
        return subprocess.run(["nsenter", f"--net=/proc/{self.pid}/ns/net", *argv], capture_output=True,
                              text=True, timeout=30, check=False).stdout

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.is_file() else ""

    def ip(self, *args: str) -> str:
        proc = subprocess.run(["nsenter", f"--net=/proc/{self.pid}/ns/net", "ip", *args], capture_output=True,
                              text=True, timeout=30, check=False)
        assert proc.returncode == 0, f"ip {' '.join(args)} in the switch: {proc.stderr}"
        return proc.stdout

    def attach(self, node: KubeadmNode) -> None:
        """The node's `eth0`: a veth pair made here, one end moved into the node and renamed, the other on br0."""
        port, inner = f"sw-{node.name[-6:]}", f"in-{node.name[-6:]}"
        self.ip("link", "add", port, "type", "veth", "peer", "name", inner)
        self.ip("link", "set", inner, "netns", str(node.init_pid))
        self.ip("link", "set", port, "master", "br0", "up")
        node.sh(f"ip link set {inner} name eth0")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
        self.procs.clear()


@dataclass
class KubeadmCluster:
    """`size` control-plane nodes of `binaries`' release (1 or 3), their files below `root`."""

    binaries: Binaries
    root: Path
    size: int = 3
    nodes: list[KubeadmNode] = field(default_factory=list)
    switch: Switch | None = None
    pod_addresses: bool = False  # KubeadmNode.pod_addresses
    #: seconds: from the start to the last node's kubeadm exit; each node's runtime and kubeadm init/join
    started_in: float = 0.0

    def start(self) -> KubeadmCluster:
        assert 1 <= self.size <= len(NAMES)
        started = time.monotonic()
        addresses = [node_address(i) for i in range(self.size)]
        self.switch = Switch(self.root / "switch").start(addresses)
        bootstrap = Bootstrap(ENDPOINT, TOKEN, CERTIFICATE_KEY)
        for i, address in enumerate(addresses):
            node = KubeadmNode(self.binaries, self.root / NAMES[i], f"kubeadm-{NAMES[i]}", address=address,
                               attach=self.switch.attach, bootstrap=bootstrap, join=i > 0,
                               pod_addresses=self.pod_addresses)
            self.nodes.append(node)
            node.start()
            if i == 0:
                ca_hash = ca_cert_hash(node.host("/etc/kubernetes/pki/ca.crt"))
                bootstrap = Bootstrap(ENDPOINT, TOKEN, CERTIFICATE_KEY, ca_hash)
        self.started_in = time.monotonic() - started
        return self

    @property
    def first(self) -> KubeadmNode:
        return self.nodes[0]

    def timings(self) -> str:
        each = ", ".join(f"{n.name} {n.runtime_in:.1f} + {n.init_in:.1f} s" for n in self.nodes)
        return f"{self.size} nodes in {self.started_in:.1f} s (runtime and images + kubeadm, each: {each})"

    def rss(self) -> int:
        """Bytes: the resident memory of every process in a node's network namespace (its kubelet, containerd,
        shims and the host-network static pods' containers) and of the switch (haproxy)."""
        namespaces = {Path(f"/proc/{n.init_pid}/ns/net").readlink() for n in self.nodes}
        assert self.switch is not None
        namespaces.add(Path(f"/proc/{self.switch.pid}/ns/net").readlink())
        total = 0
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if (proc / "ns/net").readlink() not in namespaces:
                    continue
                status = (proc / "status").read_text()
            except OSError:  # gone meanwhile
                continue
            total += next((int(line.split()[1]) * 1024 for line in status.splitlines()
                           if line.startswith("VmRSS:")), 0)
        return total

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()
        if self.switch is not None:
            self.switch.stop()


@dataclass
class SchedulerTimeline:
    """Every kube-scheduler mirror pod's readiness, as the API server tells it (kubectl's watch in a node), stamped
    with this machine's monotonic clock: (time, node, ready, the pod's config hash; "" once deleted). From it, which
    schedulers were down for a new manifest at the same time: what the agents' rollout Lease keeps to one."""

    events: list[tuple[float, str, bool, str]] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def watch(cls, node: KubeadmNode) -> SchedulerTimeline:
        """Starts recording: kubectl's watch of kube-system's kube-scheduler pods, as kubeadm's admin, read in a
        thread."""
        timeline = cls(proc=subprocess.Popen(node.inside([
            str(node.binaries.path("kubectl")), "--kubeconfig=/etc/kubernetes/admin.conf", "get", "pods",
            "--namespace=kube-system", "--selector=component=kube-scheduler", "--watch", "--output-watch-events",
            "--output=json"], pid_namespace=False), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
        threading.Thread(target=timeline._read, daemon=True).start()
        return timeline

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        decoder, buffer = json.JSONDecoder(), ""
        fd = self.proc.stdout.fileno()
        for chunk in iter(lambda: os.read(fd, 65536), b""):
            buffer += chunk.decode()
            while True:
                buffer = buffer.lstrip()
                try:
                    event, end = decoder.raw_decode(buffer)
                except ValueError:
                    break
                buffer = buffer[end:]
                self.record(time.monotonic(), event)

    def record(self, stamp: float, event: dict[str, Any]) -> None:
        """One watch event (`{"type": ..., "object": pod}`) at `stamp`. An ERROR event (its object a Status: the
        watch ends after it) is no pod's state."""
        if event["type"] not in ("ADDED", "MODIFIED", "DELETED"):
            return
        pod = event["object"]
        gone = event["type"] == "DELETED" or bool(pod["metadata"].get("deletionTimestamp"))
        is_ready = not gone and any(c["type"] == "Ready" and c["status"] == "True"
                                    for c in pod.get("status", {}).get("conditions") or [])
        config = "" if gone else pod["metadata"]["annotations"]["kubernetes.io/config.hash"]
        self.events.append((stamp, pod["spec"]["nodeName"], is_ready, config))

    def replacements(self, since: float, until: float) -> list[tuple[float, str, frozenset[str]]]:
        """(time, node, the nodes whose scheduler is then down for a new manifest) after each event between `since`
        and `until`. A scheduler is down for a new manifest from the moment its mirror pod goes or shows another config
        hash than the one it last ran ready, until it is ready on the new one. A not-ready pod of the same hash (a
        crash, a leader election lost on a loaded machine, after which the kubelet restarts the container) is not
        a replacement: the agents' turns serialise their own writes only."""
        ran: dict[str, str] = {}
        down: dict[str, bool] = {}
        out: list[tuple[float, str, frozenset[str]]] = []
        for stamp, node, is_ready, config in list(self.events):
            if stamp > until:
                break
            if is_ready:
                ran[node], down[node] = config, False
            elif not config or (node in ran and config != ran[node]):
                down[node] = True
            if stamp >= since:
                out.append((stamp, node, frozenset(n for n, d in down.items() if d)))
        return out

    def down_for(self, since: float, until: float, at_least: int) -> float:
        """Seconds between `since` and `until` during which at least `at_least` schedulers were down for a new
        manifest (the count between two events is the one the first left)."""
        total, previous, count = 0.0, since, 0
        for stamp, _, after in [*self.replacements(0.0, until), (until, "", frozenset[str]())]:
            stamp = min(stamp, until)
            if stamp > previous and count >= at_least:
                total += stamp - previous
            previous, count = max(previous, stamp), len(after)
        return total

    def stop(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, "kubectl's watch ended: the timeline has a gap"
        self.proc.kill()
        self.proc.wait(timeout=30)


@contextmanager
def kubeadm_cluster(binaries: Binaries, root: Path, size: int = 3, *,
                    pod_addresses: bool = False) -> Iterator[KubeadmCluster]:
    """A cluster of `size` control-plane nodes, stopped on exit (whatever the body raised)."""
    cluster = KubeadmCluster(binaries, root, size, pod_addresses=pod_addresses)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
