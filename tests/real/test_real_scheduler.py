"""The real kube-scheduler on the agent's work, for every built release.

`scheduler-patcher apply` patches a kubeadm manifest of that release on a host-root folder and renders the config
for its minor; the release's own kube-scheduler then starts from the patched manifest's command line, its flags as
written, the node paths (in the flags and inside the rendered config) being the host-root files bound at those
paths in a private mount namespace (tests/harness/real/mountns.py). It must become healthy, take its leader Lease, serve
the rendered extender in /configz, and schedule: a pod the admission policy gated stays Pending while the verdict is
not Ready, the gatekeeper releases it once the verdict is Ready, and the scheduler binds it to the Node after
calling the test extender's filter.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from patcher.adapters.kube.cluster import DEFAULT_STATUS_NAME
from tests.deploy.test_deploy_manifests import MANIFESTS
from tests.harness import admission_samples as samples
from tests.harness.emu.extservers import ExtenderServer, free_port
from tests.harness.real.controlplane import (
    Binaries,
    ControlPlane,
    built_releases,
    control_plane,
    die_with_parent,
    issue,
    kubeconfig_text,
    missing_reason,
    terminate,
    wait_until,
)
from tests.harness.real.mountns import command, pod_binds

pytestmark = pytest.mark.real_cluster

ROOT = Path(__file__).resolve().parents[2]
KUBEADM = ROOT / "examples/manifests/kube-scheduler.yaml"
SCHEDULER_PORT = 10259  # kube-scheduler's default secure port: the kubeadm manifest sets none
NS = "team-a"
START = 90.0  # seconds for the scheduler to be healthy and leading on a busy 2-core runner


def kubeadm_manifest(version: str) -> str:
    """examples/' kubeadm manifest as kubeadm writes it for this release (only the image tag differs)."""
    text = KUBEADM.read_text()
    return text.replace("registry.k8s.io/kube-scheduler:v1.30.4", f"registry.k8s.io/kube-scheduler:v{version}")


def node(name: str) -> dict[str, Any]:
    """A Node as a kubelet registers it: Ready, room for pods, no taints (no node controller here to add any)."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
            "status": {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                       "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "kubelet is posting ready status"}]}}


def register_node(cp: ControlPlane, name: str, labels: dict[str, str] | None = None,
                  taints: list[dict[str, str]] | None = None) -> None:
    """The Node as its kubelet registers it, then as the node lifecycle controller leaves a Ready one: the
    API server's TaintNodesByCondition admission adds node.kubernetes.io/not-ready at creation, and with no
    kube-controller-manager here nothing else would take it off."""
    body = node(name)
    body["metadata"]["labels"].update(labels or {})
    cp.ok("POST", "/api/v1/nodes", body)
    cp.ok("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": taints or None}}, "application/merge-patch+json")


class Scheduler:
    """The release's kube-scheduler, run from a static-pod manifest on a host-root folder."""

    def __init__(self, binaries: Binaries, host_root: Path, scratch: Path) -> None:
        self.binaries, self.host_root, self.scratch = binaries, host_root, scratch
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = scratch / "kube-scheduler.log"

    def manifest(self) -> dict[str, Any]:
        path = self.host_root / "etc/kubernetes/manifests/kube-scheduler.yaml"
        pod: dict[str, Any] = yaml.safe_load(path.read_text())
        return pod

    def argv(self) -> tuple[list[str], list[tuple[Path, str, bool]]]:
        pod = self.manifest()
        container = next(c for c in pod["spec"]["containers"] if c["name"] == "kube-scheduler")
        argv = [*container.get("command", []), *container.get("args", [])]
        assert argv[0] == "kube-scheduler", argv
        return [str(self.binaries.path("kube-scheduler")), *argv[1:]], pod_binds(pod, container, self.host_root)

    def start(self) -> None:
        argv, binds = self.argv()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(command(binds, argv, self.scratch / "shadow"), stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         preexec_fn=die_with_parent)

    def stop(self) -> None:
        terminate(self.proc)

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-25:]) if self.log.is_file() else ""

    def get(self, path: str, ctx: ssl.SSLContext) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{SCHEDULER_PORT}{path}", context=ctx, timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except OSError:
            return 0, b""

    def healthy(self, ctx: ssl.SSLContext) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"kube-scheduler exited with {self.proc.returncode}:\n{self.tail()}")
        return self.get("/healthz", ctx)[0] == 200


def scheduler_port_free() -> None:
    """The kubeadm manifest sets no --secure-port: each scheduler of these tests listens on the default one, so
    they run one at a time (the real_cluster group), and wait for a scheduler of another process to go."""
    try:
        wait_until(lambda: port_free(SCHEDULER_PORT), timeout=120, what=f"127.0.0.1:{SCHEDULER_PORT} to be free")
    except AssertionError:
        pytest.fail(f"127.0.0.1:{SCHEDULER_PORT} is taken: another kube-scheduler runs on this machine")


def port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture(params=[b.version for b in built_releases()] or ["none"])
def plane(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ControlPlane]:
    if (why := missing_reason()) is not None:
        pytest.skip(why)
    scheduler_port_free()
    binaries = next(b for b in built_releases() if b.version == request.param)
    with control_plane(binaries, tmp_path / "cp") as cp:
        yield cp


def node_root(cp: ControlPlane, tmp_path: Path) -> Path:
    """A control-plane node as kubeadm leaves it: the manifest, and scheduler.conf with the scheduler's identity."""
    root = tmp_path / "node"
    (root / "etc/kubernetes/manifests").mkdir(parents=True)
    (root / "etc/kubernetes/manifests/kube-scheduler.yaml").write_text(kubeadm_manifest(cp.binaries.version))
    cert, key = issue(cp.pki, "scheduler", "/CN=system:kube-scheduler", client=True)
    (root / "etc/kubernetes/scheduler.conf").write_text(kubeconfig_text(cp.url, cp.pki / "ca.crt", {
        "client-certificate-data": _b64(cert), "client-key-data": _b64(key)}, "kubernetes"))
    return root


def _b64(path: Path) -> str:
    import base64

    return base64.b64encode(path.read_bytes()).decode()


def apply(root: Path, source: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "patcher", "apply", "--host-root", str(root), "--source",
                           str(source), "-o", "json"], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"scheduler-patcher apply:\n{proc.stdout}\n{proc.stderr}"
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def admin_context(cp: ControlPlane) -> ssl.SSLContext:
    """The admin client cert, the scheduler's self-signed serving cert not verified (as a kubelet probe does)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(str(cp.pki / "admin.crt"), str(cp.pki / "admin.key"))
    return ctx


def extenders_source(folder: Path, url: str) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "extenders.yaml").write_text(f"extenders:\n- urlPrefix: {url}\n  filterVerb: filter\n  weight: 1\n"
                                           "  nodeCacheCapable: false\n  ignorable: false\n")
    return folder


def pod(name: str) -> dict[str, Any]:
    body = samples.new_pod()
    body["metadata"] = {"name": name, "namespace": NS}
    return body


def bound_to(cp: ControlPlane, name: str) -> str | None:
    node_name: str | None = cp.ok("GET", f"/api/v1/namespaces/{NS}/pods/{name}")["spec"].get("nodeName")
    return node_name


def filtered(extender: ExtenderServer, name: str) -> bool:
    """Whether the scheduler asked the extender's filter about pod `name` (ExtenderArgs' keys are the Go field
    names: `Pod`, as the real scheduler sends them)."""
    return any(path.endswith("/filter") and json.loads(body).get("Pod", {}).get("metadata", {}).get("name") == name
               for path, body in list(extender.bodies))


@pytest.mark.timeout(300)
def test_every_release_runs_the_config_rendered_for_its_minor(plane: ControlPlane, tmp_path: Path) -> None:
    """`apply` renders the config for the manifest's release; that release's scheduler starts from the patched
    command line, leads, shows the extender in /configz and binds a pod after asking the extender."""
    cp = plane
    with ExtenderServer() as extender:
        extender.passthrough = True
        root = node_root(cp, tmp_path)
        apply(root, extenders_source(tmp_path / "source", extender.url))
        scheduler = Scheduler(cp.binaries, root, tmp_path)
        assert any(a.startswith("--config=") for a in scheduler.argv()[0]), scheduler.argv()
        cp.ensure_namespace(NS)
        register_node(cp, "worker-1")
        ctx = admin_context(cp)
        scheduler.start()
        try:
            wait_until(lambda: scheduler.healthy(ctx), timeout=START, what="kube-scheduler /healthz")
            assert wait_until(lambda: leader(cp), timeout=START, what="the scheduler's leader Lease")
            # Authenticated by the client CA the scheduler loads from kube-system's extension-apiserver-
            # authentication ConfigMap, a moment after it turns healthy: 403 until then.
            configz = wait_until(lambda: (r := scheduler.get("/configz", ctx))[0] == 200 and r[1], timeout=30,
                                 what="/configz to authenticate the admin")
            config = json.loads(configz)["componentconfig"]
            assert [e.get("urlPrefix", e.get("URLPrefix")) for e in config.get("extenders", config.get("Extenders", []))
                    ] == [extender.url], sorted(config)
            cp.ok("POST", f"/api/v1/namespaces/{NS}/pods", pod("app"))
            assert wait_until(lambda: bound_to(cp, "app"), timeout=60, what="the pod bound") == "worker-1"
            assert filtered(extender, "app"), "the scheduler bound the pod without calling the extender's filter"
        except AssertionError as e:
            raise AssertionError(f"{e}\n{diagnose(cp, extender)}\n--- kube-scheduler log:\n{scheduler.tail()}") from e
        finally:
            scheduler.stop()


def diagnose(cp: ControlPlane, extender: ExtenderServer) -> str:
    """What the scheduler said about the test's pods: their conditions, the namespace's events, the extender calls."""
    pods = cp.request("GET", f"/api/v1/namespaces/{NS}/pods")[1].get("items", [])
    events = cp.request("GET", f"/api/v1/namespaces/{NS}/events")[1].get("items", [])
    return "\n".join([*(f"pod {p['metadata']['name']}: {p.get('status', {}).get('conditions')}" for p in pods),
                      *(f"event {e.get('reason')}: {e.get('message')}" for e in events),
                      f"extender calls: {[(path, body[:300]) for path, body in extender.bodies]}"])


def leader(cp: ControlPlane) -> str | None:
    status, lease = cp.request("GET", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kube-scheduler")
    holder: str | None = lease.get("spec", {}).get("holderIdentity") if status == 200 else None
    return holder


def start_gatekeeper(cp: ControlPlane, folder: Path) -> subprocess.Popen[bytes]:
    with open(folder / "gatekeeper.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "patcher", "gatekeeper", "--kubeconfig", str(cp.kubeconfig),
             "--namespace", "scheduler-patcher", "--identity", "gk-0", "--listen", "127.0.0.1:0",
             "--leader-elect", "false"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


# -- the whole story: the agent, a kubelet stand-in running the real scheduler, the gatekeeper ------------------


def verdict(cp: ControlPlane) -> str | None:
    status, cm = cp.request("GET", f"/api/v1/namespaces/scheduler-patcher/configmaps/{DEFAULT_STATUS_NAME}")
    ready: str | None = (cm.get("data") or {}).get("ready") if status == 200 else None
    return ready


def agent_state(cp: ControlPlane, name: str) -> str:
    annotations = cp.ok("GET", f"/api/v1/nodes/{name}")["metadata"].get("annotations") or {}
    return str(annotations.get("scheduler-patcher.io/state", ""))


@pytest.fixture
def newest(tmp_path: Path) -> Iterator[ControlPlane]:
    if (why := missing_reason()) is not None:
        pytest.skip(why)
    scheduler_port_free()
    with control_plane(built_releases()[0], tmp_path / "cp") as cp:
        yield cp


@pytest.mark.timeout(600)
def test_the_agent_the_real_scheduler_and_the_gate_together(newest: ControlPlane, tmp_path: Path) -> None:
    """The agent holds its write while the extender is down (verdict NotReady: a new pod is gated), writes once it
    answers; the kubelet stand-in restarts the real scheduler on the patched manifest; the agent sees the restart
    through the mirror pod and says Ready; the gatekeeper releases the pod and the real scheduler binds it after
    the extender's filter. The extender goes away: the agent's probe turns the verdict NotReady and a new pod is
    gated again. SIGTERM: the manifest is the original again, and the kubelet runs the original scheduler."""
    cp = newest
    from tests.harness.emu.kubeletsim import SimKubelet
    from tests.harness.real.node_client import NodeClient
    from tests.harness.real.scheduler_process import SchedulerProcess

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cp.ensure_namespace("scheduler-patcher")
    proc = cp.kubectl("apply", "-k", str(MANIFESTS / "overlays/gatekeeper-admission"), "--server-side")
    assert proc.returncode == 0, proc.stderr
    cp.ensure_namespace(NS)
    cp.ok("PATCH", f"/api/v1/namespaces/{NS}", {"metadata": {"labels": {"scheduler-patcher.io/gate": "enabled"}}},
          "application/merge-patch+json")
    register_node(cp, "cp-1", {"node-role.kubernetes.io/control-plane": ""},
                  [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}])
    register_node(cp, "worker-1")
    root = node_root(cp, tmp_path)
    original = (root / "etc/kubernetes/manifests/kube-scheduler.yaml").read_bytes()
    node = NodeClient(cp, "cp-1").credentials()
    scheduler = SchedulerProcess(cp.binaries, tmp_path)
    kubelet = SimKubelet(node, "cp-1", root, full_spec=True, process=scheduler).start()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NODE_NAME": "cp-1", "KUBECONFIG": str(cp.kubeconfig),
           "POD_NAMESPACE": "scheduler-patcher"}
    log = tmp_path / "agent.log"
    agent = subprocess.Popen(
        [sys.executable, "-m", "patcher", "run", "--host-root", str(root),
         "--source", str(extenders_source(tmp_path / "source", url)), "--listen", "127.0.0.1:0",
         "--restart-timeout", "90s", "--extender-probe-interval", "2s", "--restore-on-exit", "always",
         "--log-format", "json"], env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    gatekeeper = start_gatekeeper(cp, tmp_path)
    extender: ExtenderServer | None = None
    try:
        # The extender is down: the pre-flight holds the write, and the agent publishes NotReady.
        wait_until(lambda: verdict(cp) == "false", timeout=60, what="the agents' verdict NotReady")
        assert b"--config=" not in (root / "etc/kubernetes/manifests/kube-scheduler.yaml").read_bytes()
        wait_until(lambda: gated_on_create(cp, "app-1"), timeout=30, what="app-1 gated at creation")
        extender = ExtenderServer(port=port).__enter__()
        extender.passthrough = True
        wait_until(lambda: agent_state(cp, "cp-1") == "Ready", timeout=120, what="the agent Ready")
        assert b"--config=" in (root / "etc/kubernetes/manifests/kube-scheduler.yaml").read_bytes()
        # the original, then the patched pod
        assert len({r.content_hash for r in kubelet.restarts}) == 2, kubelet.restarts
        wait_until(lambda: verdict(cp) == "true", timeout=60, what="the verdict Ready")
        assert wait_until(lambda: bound_to(cp, "app-1"), timeout=90, what="app-1 released and bound") == "worker-1"
        assert filtered(extender, "app-1"), "the real scheduler bound app-1 without the extender's filter"
        # The extender goes away: the periodic probe turns the verdict NotReady; new pods are gated again.
        extender.__exit__(None, None, None)
        extender = None
        wait_until(lambda: verdict(cp) == "false", timeout=60, what="the verdict NotReady after the extender left")
        wait_until(lambda: gated_on_create(cp, "app-2"), timeout=30, what="app-2 gated at creation")
        # SIGTERM: the agent removes exactly what it added; the kubelet runs the original scheduler again.
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == 0, log.read_text()[-3000:]
        assert (root / "etc/kubernetes/manifests/kube-scheduler.yaml").read_bytes() == original
        wait_until(lambda: kubelet.restarts[-1].content_hash == kubelet.restarts[0].content_hash, timeout=30,
                   what="the kubelet back on the original manifest")
    except AssertionError as e:
        node_annotations = cp.ok("GET", "/api/v1/nodes/cp-1")["metadata"].get("annotations")
        configmaps = [c["metadata"]["name"] for c in cp.ok("GET", "/api/v1/namespaces/scheduler-patcher/configmaps")[
            "items"]]
        raise AssertionError(f"{e}\nnode cp-1: {node_annotations}\nconfigmaps: {configmaps}\n"
                             f"--- agent log:\n{log.read_text()[-4000:]}\n--- kubelet errors: "
                             f"{node.errors[-5:]}\n--- kube-scheduler log:\n{scheduler.tail()}") from e
    finally:
        if agent.poll() is None:
            agent.kill()
        gatekeeper.terminate()
        gatekeeper.wait(timeout=30)
        if extender is not None:
            extender.__exit__(None, None, None)
        kubelet.stop()


def gated_on_create(cp: ControlPlane, name: str) -> bool:
    """Creates pod `name` (again, while the API server has not yet seen the policy or verdict) until it is gated."""
    cp.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}?gracePeriodSeconds=0")
    wait_until(lambda: cp.request("GET", f"/api/v1/namespaces/{NS}/pods/{name}")[0] == 404, timeout=30,
               what=f"{name} deleted")
    created = cp.ok("POST", f"/api/v1/namespaces/{NS}/pods", pod(name))
    return samples.gates(created) == [samples.G]
