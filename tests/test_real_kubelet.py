"""The real kubelet runs the static pod (issue 34): the agent patches a manifest that the upstream kubelet reads.

Everywhere else tests/kubeletsim.py plays the kubelet. Here one real node (tests/realnode.py: the release's
kubelet on containerd and runc, registered with the release's kube-apiserver) runs the release's kube-scheduler
from the kubeadm manifest of examples/ and from an RKE2 one, and the agent runs on that node as a process with the
node's file system as its host root. What only the real kubelet can say: that it accepts the manifest the agent
writes, restarts the scheduler on each write and on the restore, and that the mirror pod the agent watches
carries what the agent expects.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES, write_configmap
from tests.extservers import ExtenderServer
from tests.helpers import P
from tests.realk8s import (
    Binaries,
    ControlPlane,
    built_releases,
    control_plane,
    free_port,
    missing_reason,
    wait_until,
)
from tests.realnode import KUBEADM_MANIFESTS, RKE2_MANIFESTS, RealNode, runtime_missing, scheduler_images

# The group is also given by tests/conftest.py, but there too late for pytest-xdist's loadgroup (it read the
# marks first; `make test` ran two nodes at once, one per worker): two nodes compete for the 2 cores.
pytestmark = pytest.mark.real_kubelet

ROOT = Path(__file__).resolve().parents[1]
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
        running = wait_until(self.node.running, 120, f"the original scheduler running\n{self.node.log('kubelet')}")
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
    (the kubeadm folder unless a test parametrizes it)."""
    binaries = require_node()
    static_pod_path = getattr(request, "param", KUBEADM_MANIFESTS)
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
    def found() -> list[dict[str, Any]] | None:
        try:
            profiles = scene.configz()["componentconfig"]
        except OSError:
            return None
        out: list[dict[str, Any]] = profiles.get("extenders") or []
        return out or None
    extenders: list[dict[str, Any]] = wait_until(found, 60, "the extender on /configz")
    assert [e["urlPrefix"] for e in extenders] == [server.url]
    return extenders


def running_after(scene: Scene, manifest: Path, before: tuple[str, str]) -> tuple[tuple[str, str], float]:
    """The (container, hash) the kubelet runs once it replaced the container `before`, and seconds from the
    manifest's write (its mtime) to the first look that saw the new container running."""
    def replaced() -> tuple[str, str] | None:
        now = scene.node.running()
        return now if now is not None and now[0] != before[0] else None
    # Generous: the kubelet re-reads the folder every 20 s, and the old scheduler took up to 15 s to go.
    new: tuple[str, str] = wait_until(replaced, 240,
                                      f"the kubelet running the new manifest\n{scene.node.log('kubelet')}")
    return new, time.time() - manifest.stat().st_mtime


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("scene", "form"), [(KUBEADM_MANIFESTS, "kubeadm"), (RKE2_MANIFESTS, "rke2")],
                         indirect=["scene"], ids=["kubeadm", "rke2"])
def test_agent_process_on_the_real_node(scene: Scene, form: str, tmp_path: Path) -> None:
    """Install -> patched, the kubelet restarts the scheduler (new hash), agent Ready, /configz shows the
    extender; a config change -> restarted again; SIGTERM -> the original bytes, and the kubelet runs the
    original manifest under its original hash again."""
    flags: tuple[str, ...] = ()
    if form == "kubeadm":
        manifest_dir, text = KUBEADM_MANIFESTS, EXAMPLE.read_text()
    else:
        manifest_dir, text = RKE2_MANIFESTS, (FIXTURES / "manifests" / "args-rke2.yaml").read_text()
        flags = ("--manifest-dir", RKE2_MANIFESTS)
    manifest, original, started = scene.install(manifest_dir, text)
    source = tmp_path / "source"
    source.mkdir()
    with ExtenderServer() as server:
        write_configmap(source, {"extenders.yaml": EXTENDERS.format(url=server.url, w=1)})
        scene.start_agent(source, *flags)
        first, took = running_after(scene, manifest, started)
        print(f"\n{form}: manifest write -> new scheduler running {took:.1f} s (real kubelet)")
        # The kubelet's config.hash is the static pod's UID: derived from the decoded pod unless the manifest
        # sets metadata.uid, as RKE2's does; then it stays the same across every edit and restart.
        assert (first[1] == started[1]) is (form == "rke2"), (started, first)
        wait_until(scene.ready, 120, f"the agent Ready\n{scene.node.log('agent')}")
        assert b"--config=" in manifest.read_bytes()
        assert extenders_on(scene, server)[0]["weight"] == 1

        configured = scene.annotations()["config-hash"]
        write_configmap(source, {"extenders.yaml": EXTENDERS.format(url=server.url, w=2)})
        second, took = running_after(scene, manifest, first)
        print(f"{form}: config change -> new scheduler running {took:.1f} s")
        wait_until(lambda: scene.ready(configured), 120, f"Ready on the new config\n{scene.node.log('agent')}")
        assert wait_until(lambda: extenders_on(scene, server)[0]["weight"] == 2, 60, "weight 2 on /configz")

        scene.stop_agent()
        assert scene.agent is not None and scene.agent.returncode == 0, scene.node.log("agent")
        assert manifest.read_bytes() == original
        restored, took = running_after(scene, manifest, second)
        print(f"{form}: restore -> original scheduler running {took:.1f} s")
        assert restored[1] == started[1], "the kubelet runs the original manifest under its original hash"


def patched_forms(tmp: Path) -> dict[str, bytes]:
    """Every manifest of the corpus (tests/fixtures/manifests) as `scheduler-patcher apply` writes it, the
    foreign `--config` one merged, and the kubeadm one with CRLF line ends (the agent keeps a file's)."""
    from tests.test_engine import FOREIGN_CONFIG

    source = tmp / "source"
    source.mkdir(parents=True)
    write_configmap(source, {"extenders.yaml": EXTENDERS.format(url="http://127.0.0.1:8889", w=1)})
    fixtures = {p.stem: p.read_bytes() for p in sorted((FIXTURES / "manifests").glob("*.yaml"))}
    fixtures["kubeadm-crlf"] = fixtures["kubeadm"].replace(b"\n", b"\r\n")
    forms = {}
    for name, data in fixtures.items():
        root = tmp / name
        manifest = root / KUBEADM_MANIFESTS.lstrip("/") / "kube-scheduler.yaml"
        manifest.parent.mkdir(parents=True)
        manifest.write_bytes(data)
        foreign = root / "srv" / "scheduler" / "scheduler-config.yaml"
        foreign.parent.mkdir(parents=True)
        foreign.write_text(FOREIGN_CONFIG)
        proc = subprocess.run([sys.executable, "-m", "patcher", "apply", "--host-root", str(root), "--source",
                               str(source), "--on-foreign-config", "merge"], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60, check=False)
        assert proc.returncode == 0, f"apply {name}: {proc.stderr}"
        forms[name] = manifest.read_bytes()
        assert forms[name] != data and b"--config=/etc/kubernetes/scheduler-patcher/" in forms[name], name
    return forms


def renamed(data: bytes, name: str) -> bytes:
    """The pod's own name (its first `name:`, in metadata in every form) changed, the rest byte for byte: the
    forms then sit side by side in one static pod folder."""
    out, count = re.subn(rb'name: ("?)kube-scheduler\1', f"name: {name}".encode(), data, count=1)
    assert count == 1, data[:200]
    return out


@pytest.mark.timeout(300)
def test_every_form_the_agent_writes_is_run_by_the_real_kubelet(scene: Scene, tmp_path: Path) -> None:
    """Each patched form as a static pod file: the kubelet decodes and admits it (its log names the pod in a
    `SyncLoop ADD` from the file source; a file it cannot decode or validate is logged as such and gets no
    pod), and for the hostNetwork forms creates the mirror pod with the `--config` and the config folder's
    volume the agent wrote. The other forms wait for a pod network this node has not (no CNI), before any
    mirror pod; the images are the corpus' own, which no registry serves here: what is seen is the decoding."""
    forms = patched_forms(tmp_path / "forms")
    for name, data in forms.items():
        scene.node.write_manifest(f"{KUBEADM_MANIFESTS}/{name}.yaml", renamed(data, f"ks-{name}"))
    host_network = {name for name, data in forms.items() if b"hostNetwork: true" in data}
    assert {"kubeadm", "kubeadm-crlf", "args-rke2"} <= host_network

    def admitted() -> set[str]:
        log = (scene.node.run / "kubelet.log").read_text(errors="replace")
        assert "can't process config file" not in log, log
        return {name for name in forms if f'source="file" pods=["kube-system/ks-{name}-{scene.node.name}"]' in log}

    wait_until(lambda: admitted() == set(forms), 60, f"every form admitted\n{scene.node.log('kubelet')}")

    def mirrors() -> dict[str, dict[str, Any]] | None:
        found = {name: scene.node.mirror_pod(f"ks-{name}") for name in host_network}
        return {k: v for k, v in found.items() if v is not None} if all(found.values()) else None

    pods = wait_until(mirrors, 120, f"a mirror pod for every hostNetwork form\n{scene.node.log('kubelet')}")
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
    """What tests/kubeletsim.py now follows: a comment and CRLF line ends leave the decoded pod, its hash and
    the running scheduler alone; one more flag is a new pod (new hash, new container)."""
    manifest, original, started = scene.install(KUBEADM_MANIFESTS, EXAMPLE.read_text())
    scene.node.write_manifest(f"{KUBEADM_MANIFESTS}/kube-scheduler.yaml",
                              (original.decode() + "# a comment\n").replace("\n", "\r\n").encode())
    time.sleep(8)  # the kubelet sees the file at once (inotify); a restart would have begun within a second
    assert scene.node.running() == started, "the kubelet restarted the scheduler on a byte-only change"
    changed = original.replace(b"    - --leader-elect=true\n", b"    - --leader-elect=true\n    - --v=1\n")
    scene.node.write_manifest(f"{KUBEADM_MANIFESTS}/kube-scheduler.yaml", changed)
    replaced, _ = running_after(scene, manifest, started)
    assert replaced[1] != started[1]


#: An extender whose client certificate is not PEM. scheduler-patcher's validation lets it through (the fields
#: are well-formed: a cert and its key, base64 bytes); kube-scheduler 1.37.2 exits 1 at start with
#: `"command failed" err="couldn't build extenders: tls: failed to find any PEM data in certificate input"`.
#: Ignorable, on a closed port: the agent's pre-flight does not hold the write back.
REFUSED_TLS = ("extenders:\n- urlPrefix: https://127.0.0.1:9\n  filterVerb: filter\n  weight: 1\n"
               "  ignorable: true\n  tlsConfig:\n    certData: eA==\n    keyData: eA==\n")


@pytest.mark.timeout(900)
def test_a_config_the_real_scheduler_refuses_is_rolled_back(scene: Scene, tmp_path: Path) -> None:
    """A working config, then one the real kube-scheduler refuses at start (a non-PEM extender certificate that
    the agent's validation lets through): the kubelet starts the new scheduler, it exits, the agent sees the
    failure on the real mirror pod and writes the last manifest that worked back; the kubelet runs it again
    under the hash it had, and /configz shows the working extender. The restore then brings back the original."""
    manifest, original, started = scene.install(KUBEADM_MANIFESTS, EXAMPLE.read_text())
    source = tmp_path / "source"
    source.mkdir()
    with ExtenderServer() as server:
        write_configmap(source, {"extenders.yaml": EXTENDERS.format(url=server.url, w=1)})
        scene.start_agent(source)
        good, _ = running_after(scene, manifest, started)
        wait_until(scene.ready, 120, f"the agent Ready\n{scene.node.log('agent')}")
        working = manifest.read_bytes()
        good_config = scene.annotations()["config-hash"]

        changed_at = time.monotonic()
        write_configmap(source, {"extenders.yaml": REFUSED_TLS})

        def written() -> bool:
            return manifest.read_bytes() != working
        wait_until(written, 120, f"the refused config written\n{scene.node.log('agent')}")
        refused = manifest.read_bytes()

        def failed() -> str | None:
            """The refused scheduler's exit, as the kubelet reports it on the mirror pod."""
            pod = scene.node.mirror_pod()
            statuses = (pod or {}).get("status", {}).get("containerStatuses") or []
            for status in statuses:
                for state in (status.get("state", {}), status.get("lastState", {})):
                    term = state.get("terminated")
                    if term and term.get("exitCode") and pod and pod["metadata"]["annotations"][HASH] != good[1]:
                        return str(term.get("exitCode"))
            return None
        code = wait_until(failed, 240, f"the refused scheduler's exit on its mirror pod\n{scene.node.log('kubelet')}")
        failed_in = time.monotonic() - changed_at
        logs = list((scene.node.run / "pods").rglob("*.log"))
        assert any("couldn't build extenders" in p.read_text(errors="replace") for p in logs), \
            "the scheduler's own log names the refused extender"

        def rolled_back() -> bool:
            ann = scene.annotations()
            return ann.get("state") == "RolledBack" and manifest.read_bytes() == working
        wait_until(rolled_back, 300, f"the agent rolled back\n{scene.node.log('agent')}")
        rolled_in = time.monotonic() - changed_at
        assert scene.annotations().get("config-hash") == good_config
        back, took = running_after(scene, manifest, good)
        assert back[1] == good[1], "the kubelet runs the working manifest under the hash it had"
        assert extenders_on(scene, server)[0]["urlPrefix"] == server.url
        print(f"\nrefused config: exit {code} seen on the mirror pod {failed_in:.1f} s after the ConfigMap change, "
              f"rolled back {rolled_in:.1f} s after it, working scheduler running again {took:.1f} s after the "
              f"rollback's write ({len(refused)} -> {len(working)} bytes)")

        scene.stop_agent()
        assert scene.agent is not None and scene.agent.returncode == 0, scene.node.log("agent")
        assert manifest.read_bytes() == original
        restored, _ = running_after(scene, manifest, back)
        assert restored[1] == started[1], "the kubelet runs the original manifest under its original hash"
