"""The real kubelet runs the static pod: the agent patches a manifest that the upstream kubelet reads.

Everywhere else tests/harness/emu/kubeletsim.py plays the kubelet. Here one real node
(tests/harness/real/kubelet_node.py: the release's kubelet on containerd and runc, registered with the release's
kube-apiserver) runs the release's kube-scheduler from the kubeadm manifest of examples/ and from an RKE2 one, and the
agent runs on that node as a process with the node's file system as its host root. What only the real kubelet can say:
that it accepts the manifest the agent writes, restarts the scheduler on each write and on the restore, and that the
mirror pod the agent watches carries what the agent expects. (The agent as the DaemonSet's pod, placed by the real
controllers, runs on the kubeadm nodes of tests/real/test_real_kubeadm_cluster.py and test_real_registry.py.)
"""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES, write_configmap
from tests.harness.emu.extservers import ExtenderServer
from tests.harness.helpers import P
from tests.harness.real.agent_image import agent_image, podman_missing
from tests.harness.real.controlplane import (
    Binaries,
    ControlPlane,
    built_releases,
    control_plane,
    free_port,
    missing_reason,
    wait_until,
)
from tests.harness.real.forms import patched_forms, renamed
from tests.harness.real.kubelet_node import (
    KUBEADM_MANIFESTS,
    RKE2_MANIFESTS,
    RealNode,
    runtime_missing,
    scheduler_images,
)
from tests.harness.real.node_client import NodeClient

pytestmark = pytest.mark.real_kubelet

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "manifests" / "kube-scheduler.yaml"
EXTENDERS = "extenders:\n- urlPrefix: {url}\n  filterVerb: filter\n  weight: {w}\n"
HASH = "kubernetes.io/config.hash"


def require_node() -> Binaries:
    """The newest built release, or one line on why not (a failure under CI=true, where nothing may skip)."""
    why = missing_reason() or runtime_missing()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the real node cannot start under CI=true: {why}")
        pytest.skip(why)
    return built_releases()[0]


def node_manifest(text: str, version: str, port: int) -> str:
    """A manifest as the release's installer writes it, on a port of its own (hostNetwork: two nodes on one
    machine would share 10259): the image tag of the release (the agent reads the version from it), and
    `--secure-port` with the probes on that port."""
    kubeadm, rke2 = scheduler_images(version)
    text = re.sub(r"registry\.k8s\.io/kube-scheduler:v[0-9.]+", kubeadm, text)
    text = re.sub(r"index\.docker\.io/rancher/hardened-kubernetes:\S+", rke2, text)
    text = text.replace("10259", str(port))
    # RKE2 probes its hostNetwork scheduler on localhost (its podtemplate sets `host`); without it the kubelet
    # probes the node's IP, where a scheduler bound to 127.0.0.1 does not answer, and kills it every ~75 s:
    # restarts the test would take for the kubelet's own.
    text = text.replace("      httpGet:\n        path: /livez",
                        "      httpGet:\n        host: localhost\n        path: /livez")
    if "--secure-port=" not in text:
        text = text.replace("    - --bind-address=127.0.0.1\n", f"    - --bind-address=127.0.0.1\n"
                                                                 f"    - --secure-port={port}\n")
    return text


@dataclass
class Scene:
    """A control plane, one real node on it, and the agent's ServiceAccount kubeconfig."""

    cp: ControlPlane
    node: RealNode
    tmp: Path
    port: int = field(default_factory=free_port)
    agent: subprocess.Popen[bytes] | None = None

    def install(self, manifest_dir: str, text: str) -> tuple[Path, bytes, tuple[str, str]]:
        """Writes the installer's manifest; returns its path, bytes and (container, hash) the kubelet runs."""
        data = node_manifest(text, self.node.binaries.version, self.port).encode()
        path = self.node.write_manifest(f"{manifest_dir}/kube-scheduler.yaml", data)
        running = wait_until(self.node.running, 120,
                             lambda: f"the original scheduler running\n{self.node.log('kubelet')}")
        return path, data, running

    def annotations(self) -> dict[str, str]:
        node = self.cp.ok("GET", f"/api/v1/nodes/{self.node.name}")
        return {k[len(P):]: v for k, v in (node["metadata"].get("annotations") or {}).items() if k.startswith(P)}

    def start_agent(self, source: Path, *flags: str) -> subprocess.Popen[bytes]:
        """`scheduler-patcher run` on the node: in its mount namespace with `--host-root /`, as on a node."""
        kubeconfig = self.cp.token_kubeconfig("scheduler-patcher", "scheduler-patcher", self.tmp / "agent.kubeconfig")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "NODE_NAME": self.node.name, "KUBECONFIG": str(kubeconfig),
               "POD_NAMESPACE": "scheduler-patcher"}
        self.agent = self.node.spawn("agent", [
            sys.executable, "-m", "patcher", "run", "--host-root", "/", "--source", str(source),
            "--listen", "127.0.0.1:0", "--restart-timeout", "120s", "--log-format", "json", *flags,
        ], env=env, pid_namespace=False)
        return self.agent

    def ready(self, config_hash: str | None = None) -> bool:
        assert self.agent is not None
        if self.agent.poll() is not None:
            raise AssertionError(f"the agent exited {self.agent.returncode}:\n{self.node.log('agent')}")
        ann = self.annotations()
        return ann.get("state") == "Ready" and (config_hash is None or ann.get("config-hash") != config_hash)

    def configz(self) -> dict[str, Any]:
        """The running scheduler's /configz, asked as the cluster admin (it delegates authn/authz to the API)."""
        ctx = ssl.create_default_context(cafile=str(self.cp.pki / "ca.crt"))
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the scheduler's serving cert is self-signed at its start
        ctx.load_cert_chain(str(self.cp.pki / "admin.crt"), str(self.cp.pki / "admin.key"))
        with urllib.request.urlopen(f"https://127.0.0.1:{self.port}/configz", context=ctx, timeout=5) as resp:
            out: dict[str, Any] = json.loads(resp.read())
            return out

    def stop_agent(self) -> None:
        if self.agent is not None and self.agent.poll() is None:
            self.agent.send_signal(signal.SIGTERM)
            self.agent.wait(60)


@pytest.fixture
def scene(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Scene]:
    """A control plane with the agent's RBAC and one node whose static pod folder is `request.param`
    (the kubeadm folder unless a test parametrizes it), of the newest built release."""
    with node_scene(require_node(), tmp_path, getattr(request, "param", KUBEADM_MANIFESTS)) as out:
        yield out


@contextmanager
def node_scene(binaries: Binaries, tmp_path: Path, static_pod_path: str = KUBEADM_MANIFESTS) -> Iterator[Scene]:
    """The control plane of `binaries`' release, the agent's RBAC as installed, one node of the same release."""
    with control_plane(binaries, tmp_path / "cp") as cp:
        proc = cp.kubectl("apply", "--server-side", "-k", str(ROOT / "manifests" / "base"))
        assert proc.returncode == 0, proc.stderr  # the agent's RBAC, exactly as installed
        node = RealNode(binaries, cp, tmp_path / "node", static_pod_path=static_pod_path)
        try:
            node.start()
            print(f"\nnode {node.name} (v{binaries.version}) registered {node.started_in:.1f} s after its start")
            yield Scene(cp, node, tmp_path)
        finally:
            node.stop()


def extenders_on(scene: Scene, server: ExtenderServer) -> list[dict[str, Any]]:
    """The extenders on the running scheduler's /configz, each with its keys case-folded: 1.36 and later serve
    the versioned config (`extenders`, `urlPrefix`), 1.34 and 1.35 the internal Go struct (`Extenders`,
    `URLPrefix`)."""
    def found() -> list[dict[str, Any]] | None:
        try:
            config = scene.configz()["componentconfig"]
        except OSError:
            return None
        folded = {str(k).casefold(): v for k, v in config.items()}
        out = [{str(k).casefold(): v for k, v in e.items()} for e in folded.get("extenders") or []]
        return out or None
    extenders: list[dict[str, Any]] = wait_until(found, 60, "the extender on /configz")
    assert [e["urlprefix"] for e in extenders] == [server.url]
    return extenders


def running_after(scene: Scene, manifest: Path, before: tuple[str, str],
                  config_hash: str | None = None) -> tuple[tuple[str, str], float]:
    """The (container, hash) the kubelet runs once it replaced the container `before` (with `config_hash`, once
    it runs a container under that hash), and seconds from the manifest's write (its mtime) to the first look that
    saw it running. `config_hash` matters after a rollback: until the kubelet reads the rolled-back file, it
    restarts the refused scheduler, whose container runs for a moment under the refused manifest's hash."""
    def replaced() -> tuple[str, str] | None:
        now = scene.node.running()
        if now is None or now[0] == before[0] or config_hash not in (None, now[1]):
            return None
        return now
    # Generous: the kubelet re-reads the folder every 20 s, and the old scheduler took up to 15 s to go.
    new: tuple[str, str] = wait_until(
        replaced, 240, lambda: f"the kubelet running the new manifest{f' under {config_hash}' if config_hash else ''}"
                               f" (it runs {scene.node.running()})\n{scene.node.log('kubelet')}")
    return new, time.time() - manifest.stat().st_mtime


@pytest.mark.timeout(900)
@pytest.mark.parametrize("scene", [RKE2_MANIFESTS], indirect=True, ids=["rke2"])
def test_agent_process_on_the_real_node(scene: Scene, tmp_path: Path) -> None:
    """On RKE2's manifest, the most demanding form (its flags under `args`, and a `metadata.uid` the kubelet keys
    the pod by, which the agent renews on every write; kubeadm's form is run the same way, on the manifests kubeadm
    itself writes, by tests/real/test_real_kubeadm.py): install -> patched, the kubelet restarts the scheduler (new
    hash), agent Ready, /configz shows the extender; a config change -> restarted again; a config the real scheduler
    refuses -> rolled back to the working one; SIGTERM -> the original bytes, and the kubelet runs the original
    manifest under its original hash again."""
    text = (FIXTURES / "manifests" / "args-rke2.yaml").read_text()
    manifest, original, started = scene.install(RKE2_MANIFESTS, text)
    source = tmp_path / "source"
    source.mkdir()
    with ExtenderServer() as server:
        write_configmap(source, {"extenders.yaml": EXTENDERS.format(url=server.url, w=1)})
        scene.start_agent(source, "--manifest-dir", RKE2_MANIFESTS)
        first, took = running_after(scene, manifest, started)
        print(f"\nrke2: manifest write -> new scheduler running {took:.1f} s (real kubelet)")
        # The kubelet's config.hash is the static pod's UID: derived from the decoded pod unless the manifest
        # sets metadata.uid, as RKE2's does; then it is the UID the agent wrote in place of the original.
        assert first[1] != started[1], (started, first)
        assert f"\n  uid: {first[1]}\n".encode() in manifest.read_bytes(), (first, manifest.read_text())
        wait_until(scene.ready, 120, lambda: f"the agent Ready\n{scene.node.log('agent')}")
        assert b"--config=" in manifest.read_bytes()
        assert extenders_on(scene, server)[0]["weight"] == 1

        configured = scene.annotations()["config-hash"]
        write_configmap(source, {"extenders.yaml": EXTENDERS.format(url=server.url, w=2)})
        second, took = running_after(scene, manifest, first)
        print(f"rke2: config change -> new scheduler running {took:.1f} s")
        wait_until(lambda: scene.ready(configured), 120, lambda: f"Ready on the new config\n{scene.node.log('agent')}")
        assert wait_until(lambda: extenders_on(scene, server)[0]["weight"] == 2, 60, "weight 2 on /configz")
        second = refused_and_rolled_back(scene, source, manifest, second, server)

        scene.stop_agent()
        assert scene.agent is not None and scene.agent.returncode == 0, scene.node.log("agent")
        assert manifest.read_bytes() == original
        # the kubelet runs the original manifest under its original hash
        _, took = running_after(scene, manifest, second, started[1])
        print(f"rke2: restore -> original scheduler running {took:.1f} s")


@pytest.mark.timeout(300)
def test_every_form_the_agent_writes_is_run_by_the_real_kubelet(scene: Scene, tmp_path: Path) -> None:
    """Each patched form as a static pod file: the kubelet decodes and admits it (its log names the pod in a
    `SyncLoop ADD` from the file source; a file it cannot decode or validate is logged as such and gets no
    pod), and for the hostNetwork forms creates the mirror pod with the `--config` and the config folder's
    volume the agent wrote. The images are the corpus' own, which no registry serves here: what is seen is the
    decoding and the mirror pod, not a running scheduler. And, one node start for both, the kubelet stand-in's
    Node beside the real kubelet's."""
    stand_in_node_as_the_real_one(scene)
    forms_run_by_the_kubelet(scene, tmp_path)


def stand_in_node_as_the_real_one(scene: Scene) -> None:
    """tests/harness/real/node_client.py (the kubelet's API side beside tests/harness/emu/kubeletsim.py) creates its
    Node with what the real kubelet's registration gives it: the labels a kubelet sets on itself and the not-ready
    taint, which stays here on the real node (no node lifecycle controller takes it off; the agent-pod test does
    that)."""
    real = scene.cp.ok("GET", f"/api/v1/nodes/{scene.node.name}")
    stand_in = NodeClient(scene.cp, "node-b").create()

    def taints(node: dict[str, Any]) -> list[tuple[str, str]]:
        return sorted((t["key"], t["effect"]) for t in node["spec"].get("taints") or [])
    assert taints(stand_in) == taints(real) == [("node.kubernetes.io/not-ready", "NoSchedule")]
    own = {k for k in real["metadata"]["labels"] if k.startswith(("kubernetes.io/", "beta.kubernetes.io/"))}
    assert set(stand_in["metadata"]["labels"]) == own
    scene.cp.ok("DELETE", "/api/v1/nodes/node-b")


def forms_run_by_the_kubelet(scene: Scene, tmp_path: Path) -> None:
    forms = patched_forms(tmp_path / "forms")
    for name, data in forms.items():
        scene.node.write_manifest(f"{KUBEADM_MANIFESTS}/{name}.yaml", renamed(data, f"ks-{name}"))
    host_network = {name for name, data in forms.items() if b"hostNetwork: true" in data}
    assert {"kubeadm", "kubeadm-crlf", "args-rke2"} <= host_network

    def admitted() -> set[str]:
        log = (scene.node.run / "kubelet.log").read_text(errors="replace")
        assert "can't process config file" not in log, log
        return {name for name in forms if f'source="file" pods=["kube-system/ks-{name}-{scene.node.name}"]' in log}

    wait_until(lambda: admitted() == set(forms), 60, lambda: f"every form admitted\n{scene.node.log('kubelet')}")

    def mirrors() -> dict[str, dict[str, Any]] | None:
        found = {name: scene.node.mirror_pod(f"ks-{name}") for name in host_network}
        return {k: v for k, v in found.items() if v is not None} if all(found.values()) else None

    pods = wait_until(mirrors, 120, lambda: f"a mirror pod for every hostNetwork form\n{scene.node.log('kubelet')}")
    for name, pod in pods.items():
        container = next(c for c in pod["spec"]["containers"] if c["name"] == "kube-scheduler")
        words = [*container.get("command", []), *container.get("args", [])]
        configs = [w for w in words if w.startswith("--config=")]
        assert len(configs) == 1 and configs[0].startswith("--config=/etc/kubernetes/scheduler-patcher/"), (name, words)
        paths = {v["hostPath"]["path"] for v in pod["spec"]["volumes"] if "hostPath" in v}
        assert "/etc/kubernetes/scheduler-patcher" in paths, (name, paths)
        assert pod["metadata"]["annotations"]["kubernetes.io/config.source"] == "file"


@pytest.mark.timeout(600)
def test_the_kubelet_restarts_on_a_changed_pod_not_on_changed_bytes(scene: Scene) -> None:
    """What tests/harness/emu/kubeletsim.py now follows: a comment and CRLF line ends leave the decoded pod, its hash
    and the running scheduler alone; one more flag is a new pod (new hash, new container)."""
    manifest, original, started = scene.install(KUBEADM_MANIFESTS, EXAMPLE.read_text())
    scene.node.write_manifest(f"{KUBEADM_MANIFESTS}/kube-scheduler.yaml",
                              (original.decode() + "# a comment\n").replace("\n", "\r\n").encode())
    time.sleep(8)  # the kubelet sees the file at once (inotify); a restart would have begun within a second
    assert scene.node.running() == started, "the kubelet restarted the scheduler on a byte-only change"
    changed = original.replace(b"    - --leader-elect=true\n", b"    - --leader-elect=true\n    - --v=1\n")
    scene.node.write_manifest(f"{KUBEADM_MANIFESTS}/kube-scheduler.yaml", changed)
    replaced, _ = running_after(scene, manifest, started)
    assert replaced[1] != started[1]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("scene", [RKE2_MANIFESTS], indirect=True, ids=["rke2"])
def test_a_static_pod_with_its_own_uid_restarts_only_for_a_new_uid(scene: Scene) -> None:
    """Why the agent writes a UID of its own where the manifest sets one (patcher.core.manifestedit): RKE2 writes a
    hash of the pod as `metadata.uid`, and the kubelet keys the static pod by it. An edit that keeps the UID is an
    update: the kubelet logs it and the old container keeps running, the new flags never reach the scheduler
    (the agent would wait for a restart that does not come, and roll back). A new UID is a new pod."""
    manifest, original, started = scene.install(RKE2_MANIFESTS,
                                                (FIXTURES / "manifests" / "args-rke2.yaml").read_text())
    uid = re.search(rb"\n  uid: (\S+)\n", original)
    assert uid is not None
    path = f"{RKE2_MANIFESTS}/kube-scheduler.yaml"
    edited = original.replace(b"    - --profiling=false\n", b"    - --profiling=false\n    - --v=1\n")
    scene.node.write_manifest(path, edited)
    pod = f"kube-system/kube-scheduler-{scene.node.name}"

    def updates() -> int:
        log = (scene.node.run / "kubelet.log").read_text(errors="replace")
        return sum(1 for line in log.splitlines() if '"SyncLoop UPDATE" source="file"' in line and pod in line)
    wait_until(updates, 60, lambda: f"the kubelet's update of the edited pod\n{scene.node.log('kubelet')}")
    time.sleep(20)  # a restart, where there is one, begins within seconds of the kubelet's sync (10-20 s measured)
    assert scene.node.running() == started, "the kubelet restarted a static pod whose UID stayed the same"
    scene.node.write_manifest(path, edited.replace(uid.group(1), b"1f3d2c4e-0000-4000-8000-0000000000ff"))
    replaced, took = running_after(scene, manifest, started)
    assert replaced[0] != started[0] and replaced[1] == "1f3d2c4e-0000-4000-8000-0000000000ff"
    print(f"\nrke2: an edit with a new UID -> new scheduler running {took:.1f} s")


#: A config `plan` must let through and the real scheduler refuses: a CA file the scheduler's container does not
#: have (only the node can tell, and the path is the container's). A non-PEM certificate was the first such config;
#: the oracle made `plan` refuse it (rule extender.tlsPEM), so it no longer reaches the kubelet.
#: kube-scheduler exits 1: `couldn't build extenders: open /nonexistent/ca.crt: no such file or directory`.
#: Ignorable, on a closed port: the agent's pre-flight does not hold the write back.
REFUSED_TLS = ("extenders:\n- urlPrefix: https://127.0.0.1:9\n  filterVerb: filter\n  weight: 1\n"
               "  ignorable: true\n  tlsConfig:\n    caFile: /nonexistent/ca.crt\n")


def refused_and_rolled_back(scene: Scene, source: Path, manifest: Path, working: tuple[str, str],
                            server: ExtenderServer) -> tuple[str, str]:
    """The ConfigMap changed to REFUSED_TLS: the agent writes it, the kubelet starts that scheduler, it exits 1
    (its own log names the extender), the agent sees the exit on the real mirror pod and writes the working
    manifest back; the kubelet runs it again (under the hash it had). Returns the (container, hash) it runs.

    With RKE2's manifest (no startup probe) the real kubelet shows each run of the refused scheduler
    `started: true`, `ready: true` and the pod Ready for the second it lives; the agent took that second for a
    healthy restart until it asked the same container to run `--restart-settle`."""
    before, config = manifest.read_bytes(), scene.annotations()["config-hash"]
    changed_at = time.monotonic()
    write_configmap(source, {"extenders.yaml": REFUSED_TLS})
    wait_until(lambda: manifest.read_bytes() != before, 120,
               lambda: f"the refused config written\n{scene.node.log('agent')}")

    def exited() -> str | None:
        """The refused scheduler's exit code, as the kubelet reports it on the mirror pod."""
        statuses = ((scene.node.mirror_pod() or {}).get("status") or {}).get("containerStatuses") or []
        for status in statuses:
            for state in (status.get("state") or {}, status.get("lastState") or {}):
                term = state.get("terminated") or {}
                if term.get("exitCode") and term.get("containerID") != working[0]:
                    return str(term["exitCode"])
        return None
    code = wait_until(exited, 240,
                      lambda: f"the refused scheduler's exit on its mirror pod\n{scene.node.log('kubelet')}")
    exited_in = time.monotonic() - changed_at
    logs = list((scene.node.run / "pods").rglob("*.log"))
    assert any("couldn't build extenders" in p.read_text(errors="replace") for p in logs), \
        "the scheduler's own log names the refused extender"

    def outcome() -> str | None:
        ann = scene.annotations()
        if ann.get("state") == "RolledBack" and manifest.read_bytes() == before:
            return "rolled back"
        if ann.get("state") == "Ready" and ann.get("config-hash") != config:
            return "ready"
        return None
    said = wait_until(outcome, 300, lambda: f"the agent rolled back\n{scene.node.log('agent')}")
    assert said == "rolled back", \
        f"the agent said Ready on a config the real scheduler refuses\n{scene.node.log('agent')}"
    rolled_in = time.monotonic() - changed_at
    assert scene.annotations().get("config-hash") == config
    back, took = running_after(scene, manifest, working, working[1])  # the working manifest, under the hash it had
    assert extenders_on(scene, server)[0]["urlprefix"] == server.url
    print(f"refused config: exit {code} on the mirror pod {exited_in:.1f} s after the ConfigMap change, rolled back "
          f"{rolled_in:.1f} s after it, the working scheduler running again {took:.1f} s after the rollback's write")
    return back

AGENT_NS, AGENT_DS = "scheduler-patcher", "scheduler-patcher"
KILLING = re.compile(r'^I(\d{4}) (\d{2}:\d{2}:\d{2}\.\d{6}) .*"Killing container with a grace period" '
                     r'pod="(?P<pod>[^"]+)".*gracePeriod=(?P<grace>\d+)')


def require_podman() -> None:
    why = podman_missing()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the agent's image cannot be built under CI=true: {why}")
        pytest.skip(why)


def kubelet_kill(scene: Scene, pod: str) -> tuple[float, int] | None:
    """(epoch seconds, grace period) of the kubelet's log line that starts killing `pod`'s container."""
    for line in (scene.node.run / "kubelet.log").read_text(errors="replace").splitlines():
        found = KILLING.match(line)
        if found and found["pod"] == pod:
            year = time.gmtime().tm_year  # klog writes local time without the year; this machine runs UTC
            stamp = datetime.strptime(f"{year}{found[1]} {found[2]}", "%Y%m%d %H:%M:%S.%f")
            return stamp.replace(tzinfo=UTC).timestamp(), int(found["grace"])
    return None


def agent_pod(scene: Scene, image: str, port: int, number: int) -> dict[str, Any]:
    """The DaemonSet's pod template (as `kubectl apply -k manifests/base` created the DaemonSet) bound to the
    node as its controller would bind it, with three changes: the image built from this checkout, the agent's
    port (the host's: hostNetwork), and the API server's address. No kube-proxy runs here to route the
    `kubernetes` Service's ClusterIP, which the kubelet puts into KUBERNETES_SERVICE_HOST/PORT: the container's
    own env wins over the kubelet's, as it does for any variable."""
    ds = scene.cp.ok("GET", f"/apis/apps/v1/namespaces/{AGENT_NS}/daemonsets/{AGENT_DS}")
    template = json.loads(json.dumps(ds["spec"]["template"]))
    spec = template["spec"]
    (container,) = spec["containers"]
    container["image"] = image
    container["ports"] = [{**p, "containerPort": port} for p in container["ports"]]
    env = [e for e in container["env"] if e["name"] != "PATCHER_LISTEN"]
    container["env"] = [*env, {"name": "PATCHER_LISTEN", "value": f":{port}"},
                        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                        {"name": "KUBERNETES_SERVICE_PORT", "value": str(scene.cp.port)}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{AGENT_DS}-{scene.node.name}-{number}", "namespace": AGENT_NS,
                         "labels": template["metadata"]["labels"],
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": AGENT_DS,
                                              "uid": ds["metadata"]["uid"], "controller": True,
                                              "blockOwnerDeletion": True}]},
            "spec": {**spec, "nodeName": scene.node.name}}


def as_control_plane_node(scene: Scene) -> None:
    """What kubeadm and kube-controller-manager do to a new control-plane node, which the DaemonSet's nodeSelector
    and its tolerations rely on: kubeadm's label, and (the node lifecycle controller, once the node is Ready) the
    `node.kubernetes.io/not-ready:NoSchedule` taint the kubelet registers its Node with taken off. With it the
    DaemonSet controller would place no pod here, and the agent reads the same: "no longer selects this node"."""
    path = f"/api/v1/nodes/{scene.node.name}"

    def ready() -> dict[str, Any] | None:
        node: dict[str, Any] = scene.cp.ok("GET", path)
        conditions = node.get("status", {}).get("conditions") or []
        return node if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else None
    node = wait_until(ready, 60, f"the node Ready: {scene.cp.ok('GET', path).get('status', {}).get('conditions')}")
    taints = node["spec"].get("taints") or []
    assert {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"} in [
        {k: t[k] for k in ("key", "effect")} for t in taints], taints  # the kubelet's registration taint
    scene.cp.ok("PATCH", path, {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}},
                                "spec": {"taints": [t for t in taints if t["key"] != "node.kubernetes.io/not-ready"]}},
                "application/merge-patch+json")


@dataclass
class AgentPod:
    scene: Scene
    image: str
    number: int
    port: int = field(default_factory=free_port)
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{AGENT_NS}/pods/{self.name}"

    def create(self) -> AgentPod:
        self.body = agent_pod(self.scene, self.image, self.port, self.number)
        self.scene.cp.ok("POST", f"/api/v1/namespaces/{AGENT_NS}/pods", self.body)
        return self

    def log(self) -> str:
        """The agent's container log, while the pod exists (the kubelet removes the folder with the pod)."""
        logs = sorted((self.scene.node.run / "pods").glob(f"{AGENT_NS}_{self.name}_*/agent/*.log"))
        return logs[-1].read_text(errors="replace") if logs else "(no container log)"

    def delete(self) -> tuple[float, int]:
        """DELETE with the pod's own grace period; returns the kubelet's kill (epoch s) and the grace period."""
        self.scene.cp.ok("DELETE", self.path)
        kill: tuple[float, int] = wait_until(lambda: kubelet_kill(self.scene, f"{AGENT_NS}/{self.name}"), 60,
                                             lambda: f"the kubelet killing the agent\n{self.scene.node.log('kubelet')}")
        return kill

    def gone(self) -> str:
        """Waits for the pod object to go (the kubelet deletes it once the agent exited); the agent's last log."""
        seen = ""

        def deleted() -> bool:
            nonlocal seen
            text = self.log()
            seen = text if text != "(no container log)" else seen
            return self.scene.cp.request("GET", self.path)[0] == 404
        wait_until(deleted, 120, lambda: f"the pod gone once the agent exited\n{self.log()}")
        return seen


#: A folder another tool left a kube-scheduler config in (csi-baremetal-operator's patcher uses this one): not
#: one of the three the DaemonSet mounts by default.
FOREIGN_DIR = "/etc/kubernetes/scheduler"
FOREIGN_CONFIG = """apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: /etc/kubernetes/scheduler.conf
leaderElection:
  leaderElect: true
percentageOfNodesToScore: 40
"""


def with_foreign_config(text: str) -> str:
    """The example manifest as the other tool left it: its --config, and a hostPath volume for its folder."""
    text = text.replace("    - --leader-elect=true\n",
                        f"    - --leader-elect=true\n    - --config={FOREIGN_DIR}/config.yaml\n")
    text = text.replace("    volumeMounts:\n", f"    volumeMounts:\n    - mountPath: {FOREIGN_DIR}\n"
                                               "      name: foreign\n      readOnly: true\n")
    return text.replace("  volumes:\n", f"  volumes:\n  - hostPath:\n      path: {FOREIGN_DIR}\n"
                                        "      type: Directory\n    name: foreign\n")


@pytest.mark.timeout(900)
def test_the_agent_as_a_pod_merges_a_foreign_config_once_its_folder_is_mounted(scene: Scene) -> None:
    """A manifest whose --config another tool wrote outside the folders the DaemonSet mounts: the agent's pod
    refuses, naming the path it looked at and both ways out, and writes nothing; with the foreign-config overlay
    (the folder mounted read-only below /host) the next pod merges it: the scheduler runs our extender and keeps
    the other tool's setting. The uninstall puts the other tool's --config back, and its file is still there."""
    require_podman()
    image = agent_image()
    scene.node.ctr("images", "import", str(image.archive))
    foreign = scene.node.host(f"{FOREIGN_DIR}/config.yaml")
    foreign.parent.mkdir(parents=True, exist_ok=True)
    foreign.write_text(FOREIGN_CONFIG)
    manifest, original, started = scene.install(KUBEADM_MANIFESTS, with_foreign_config(EXAMPLE.read_text()))
    as_control_plane_node(scene)
    scene.cp.ok("POST", f"/api/v1/namespaces/{AGENT_NS}/configmaps", {
        "metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": (scene.cp.pki / "ca.crt").read_text()}})
    with ExtenderServer() as server:
        scene.cp.ok("PATCH", f"/api/v1/namespaces/{AGENT_NS}/configmaps/scheduler-patcher-source",
                    {"data": {"extenders.yaml": EXTENDERS.format(url=server.url, w=1)}},
                    "application/merge-patch+json")
        blind = AgentPod(scene, image.name, 1).create()
        message = wait_until(lambda: (scene.annotations().get("message") or "") if "foreign" in (
            scene.annotations().get("message") or "") else None, 180, f"the refusal\n{blind.log()}")
        assert f"looked at /host{FOREIGN_DIR}/config.yaml" in message, message
        assert f"mount {FOREIGN_DIR} into the agent" in message and "--on-foreign-config=replace" in message
        assert manifest.read_bytes() == original and scene.node.running() == started
        blind.delete()
        blind.gone()

        proc = scene.cp.kubectl("apply", "--server-side", "--force-conflicts", "-k",
                                str(ROOT / "manifests" / "overlays" / "foreign-config"))
        assert proc.returncode == 0, proc.stderr
        scene.cp.ok("PATCH", f"/api/v1/namespaces/{AGENT_NS}/configmaps/scheduler-patcher-source",
                    {"data": {"extenders.yaml": EXTENDERS.format(url=server.url, w=1)}},
                    "application/merge-patch+json")  # the overlay's apply put the example's back
        agent = AgentPod(scene, image.name, 2).create()
        running, _ = running_after(scene, manifest, started)
        wait_until(lambda: scene.annotations().get("state") == "Ready", 180,
                   lambda: f"the agent Ready\n{agent.log()}\n{scene.node.log('kubelet')}")
        assert extenders_on(scene, server)[0]["urlprefix"] == server.url
        config = {str(k).casefold(): v for k, v in scene.configz()["componentconfig"].items()}
        assert config["percentageofnodestoscore"] == 40, config  # the other tool's setting, kept
        assert foreign.read_text() == FOREIGN_CONFIG  # read, never written

        scene.cp.ok("DELETE", f"/apis/apps/v1/namespaces/{AGENT_NS}/daemonsets/{AGENT_DS}",
                    {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"})
        agent.delete()
        back, _ = running_after(scene, manifest, running)
        agent.gone()
        assert manifest.read_bytes() == original and back[1] == started[1]
        assert foreign.read_text() == FOREIGN_CONFIG
