"""The node `kubeadm init` makes: the agent meets the manifest kubeadm itself wrote, not a fixture of it.

tests/harness/real/kubeadm_node.py runs the release's `kubeadm init` on a host of its own (namespaces, containerd,
the release's kubelet, kubeadm's images built here from the release's binaries). What only kubeadm can say: that the
manifest it writes for its release is one `plan` accepts and `apply` patches into one the kubelet runs, and that
`restore` gives kubeadm its bytes back (kubeadm's upgrade compares the mirror pod's hash of what it wrote).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import write_configmap
from tests.harness.real.controlplane import Binaries, wait_until
from tests.harness.real.forms import patched_forms, renamed
from tests.harness.real.kubeadm_node import (
    MANIFESTS,
    KubeadmNode,
    kubeadm_missing,
    kubeadm_node,
    releases_with_kubeadm,
)
from tests.harness.real.kubeadm_upgrade import Timeline, agent, extender, ready_on

pytestmark = pytest.mark.real_kubeadm

ROOT = Path(__file__).resolve().parents[2]
KUBEADM_INIT = ROOT / "tests" / "fixtures" / "kubeadm" / "kube-scheduler.yaml"
#: The agent's pre-flight calls it before it writes (tests/harness/real/kubeadm_upgrade.py `extender` answers there);
#: the scheduler calls it only to schedule a pod.
EXTENDER_PORT = 8889
EXTENDERS = f"extenders:\n- urlPrefix: http://127.0.0.1:{EXTENDER_PORT}\n  filterVerb: filter\n  weight: 1\n"
CONFIG_DIR = "/etc/kubernetes/scheduler-patcher"


def require_kubeadm(version: str) -> Binaries:
    """The release's binaries, or one line on why the node cannot start (a failure under CI=true, where nothing may
    skip)."""
    why = kubeadm_missing()
    found = [b for b in releases_with_kubeadm() if b.version == version]
    if why is None and not found:
        built = ", ".join(b.version for b in releases_with_kubeadm())
        why = (f"no release with kubeadm but the newest is built ({built}): the newest's `kubeadm init` is met by "
               "tests/real/test_real_registry.py")
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the kubeadm node cannot start under CI=true: {why}")
        pytest.skip(why)
    return found[0]


def kubeadms_manifest(version: str) -> bytes:
    """What `kubeadm init` of `version` writes for kube-scheduler: tests/fixtures/kubeadm/ (1.37.2's) but the tag."""
    return KUBEADM_INIT.read_bytes().replace(b"kube-scheduler:v1.37.2", f"kube-scheduler:v{version}".encode())


@pytest.fixture(params=[b.version for b in releases_with_kubeadm()][1:] or ["none"])
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KubeadmNode]:
    """A node of each built release that has kubeadm but the newest, newest first (or one test that skips, where
    none has). The newest's `kubeadm init` node is tests/real/test_real_registry.py's, which holds its manifest to the
    same fixture and runs the agent's patch and restore on it (as the chart installs it); its forms meet the newest
    kubelet in tests/real/test_real_kubelet.py, and the clusters of tests/real/test_real_kubeadm_cluster.py are made
    by its kubeadm: this test again on it would add ~70 s and nothing else."""
    with kubeadm_node(require_kubeadm(request.param), tmp_path / "kubeadm") as made:
        print(f"\nkubeadm node v{made.binaries.version}: runtime and images {made.runtime_in:.1f} s, "
              f"kubeadm init {made.init_in:.1f} s")
        yield made


def patcher(command: str, node: KubeadmNode, source: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The agent's one-shot command on the node's file system, as its pod sees it (`--host-root`)."""
    return subprocess.run([sys.executable, "-m", "patcher", command, "--host-root", str(node.host_root),
                           "--source", str(source), *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120, check=False)


def command_of(pod: dict[str, Any]) -> list[str]:
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "kube-scheduler")
    return [*container.get("command", []), *container.get("args", [])]


def extenders_of(node: KubeadmNode) -> list[str]:
    """The extender URLs of the configuration the running scheduler loaded, once it serves one."""
    urls: list[str] = wait_until(node.scheduler_extenders, 120,
                                 lambda: f"the extender on the scheduler's /configz\n{node.log('kubelet')}")
    return urls


def replaced(node: KubeadmNode, before: str) -> tuple[str, dict[str, Any]]:
    """The scheduler's next running, ready container after `before` (the kubelet reads the folder at once, by
    inotify, and again every 20 s; the old container may take its grace period to go)."""
    def new() -> tuple[str, dict[str, Any]] | None:
        now = node.running()
        return now if now is not None and now[0] != before else None
    found: tuple[str, dict[str, Any]] = wait_until(
        new, 300, lambda: f"a new kube-scheduler running\n{node.log('kubelet')}")
    return found


@pytest.mark.timeout(900)
def test_the_agent_patches_and_restores_the_scheduler_kubeadm_init_wrote(node: KubeadmNode, tmp_path: Path) -> None:
    """kubeadm init -> a Ready control-plane Node whose kube-scheduler static pod (kubeadm's manifest, the bytes of
    tests/fixtures/kubeadm/ but the image tag) runs; `plan` on that manifest -> the pending patch (the manifest gains
    `--config` and the config folder's volume, the config file is created); the agent (`run`, as its pod runs it)
    -> the release's kubelet replaces the scheduler with one started with `--config` (/configz shows the extender),
    and the agent reports Ready; SIGTERM -> kubeadm's bytes again, and the kubelet runs kubeadm's pod under its
    first hash. Then every form the agent writes is decoded and admitted by this release's kubelet."""
    manifest = node.host(f"{MANIFESTS}/kube-scheduler.yaml")
    written = manifest.read_bytes()
    version = node.binaries.version
    # what tests/unit/test_kubeadm_written.py patches is what this release's kubeadm writes (1.37.2's, but the tag)
    fixture = kubeadms_manifest(version)
    assert written == fixture, f"kubeadm {version} writes another manifest than {KUBEADM_INIT}:\n{written.decode()}"

    nodes = node.get("/api/v1/nodes")
    assert nodes is not None and [n["metadata"]["name"] for n in nodes["items"]] == [node.name]
    labels = nodes["items"][0]["metadata"]["labels"]
    assert "node-role.kubernetes.io/control-plane" in labels  # kubeadm's mark-control-plane phase
    first_id, first_pod = wait_until(node.running, 300,
                                     lambda: f"kubeadm's kube-scheduler ready\n{node.log('kubelet')}")
    first_hash = first_pod["metadata"]["annotations"]["kubernetes.io/config.hash"]
    for component in ("etcd", "kube-apiserver", "kube-controller-manager"):
        wait_until(partial(node.running, component), 300,
                   f"kubeadm's {component} ready\n{node.log('kubelet')}")

    source = tmp_path / "source"
    source.mkdir()
    write_configmap(source, {"extenders.yaml": EXTENDERS})
    plan = patcher("plan", node, source, "--output", "json")
    assert plan.returncode == 2, plan.stdout + plan.stderr  # changes pending
    doc = json.loads(plan.stdout)
    assert doc["pending"] and doc["manifest"] == f"{MANIFESTS}/kube-scheduler.yaml", doc
    actions = {c["path"]: c["action"] for c in doc["changes"]}
    assert actions[f"{MANIFESTS}/kube-scheduler.yaml"] == "update", actions
    assert [a for p, a in actions.items() if p.startswith(f"{CONFIG_DIR}/")] == ["create"], actions
    diff = next(c["diff"] for c in doc["changes"] if c["path"].endswith("kube-scheduler.yaml"))
    added = [line for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert any(f"--config={CONFIG_DIR}/" in line for line in added), diff
    assert any(f"path: {CONFIG_DIR}" in line for line in added), diff
    assert manifest.read_bytes() == written  # plan writes nothing

    # The agent as its DaemonSet pod runs it (a process in the node, kubeadm's admin credentials), with an extender
    # that answers its pre-flight: it patches, the release's kubelet replaces the scheduler, the agent reports Ready
    # for the manifest it wrote; SIGTERM gives kubeadm its bytes back.
    timeline = Timeline()
    processes = [extender(node, timeline, EXTENDER_PORT)]
    try:
        created = node.kubectl("create", "namespace", "scheduler-patcher")
        assert created.returncode == 0, created.stderr
        run = agent(node, source, timeline)
        processes.append(run)
        wait_until(lambda: ready_on(node, version), 300,
                   lambda: f"the agent's patch Ready on v{version}\n{run.text(40)}\n"
                           f"--- kubelet ---\n{node.log('kubelet')}")
        assert manifest.read_bytes() != written
        second_id, second_pod = replaced(node, first_id)
        configs = [w for w in command_of(second_pod) if w.startswith("--config=")]
        assert len(configs) == 1 and configs[0].startswith(f"--config={CONFIG_DIR}/"), command_of(second_pod)
        assert second_pod["metadata"]["annotations"]["kubernetes.io/config.hash"] != first_hash
        assert node.host(configs[0].split("=", 1)[1]).is_file()
        assert extenders_of(node) == [f"http://127.0.0.1:{EXTENDER_PORT}"]

        assert run.terminate() == 0, run.text(40)
        assert manifest.read_bytes() == written
        _, third_pod = replaced(node, second_id)
        assert third_pod["metadata"]["annotations"]["kubernetes.io/config.hash"] == first_hash
        assert not [w for w in command_of(third_pod) if w.startswith("--config=")]
    finally:
        for process in processes:
            if process.proc.poll() is None:
                process.terminate()
    forms_run_by_the_kubelet(node, tmp_path)


def forms_run_by_the_kubelet(node: KubeadmNode, tmp_path: Path) -> None:
    """Each form the agent writes (tests/harness/real/forms.py: the corpus' manifests patched,
    CRLF kept, a foreign `--config` merged) as a static pod file beside kubeadm's: this release's kubelet decodes and
    admits it (its log names the pod in a `SyncLoop ADD` from the file source; one it cannot decode is logged as
    such and gets no pod), and for the hostNetwork forms creates the mirror pod with the agent's `--config` and the
    config folder's volume. The images are the corpus' own, which no registry serves here: what is seen is the
    decoding and the mirror pod, not a running scheduler."""
    forms = patched_forms(tmp_path / "forms")
    for name, data in forms.items():  # whole, by rename: a plain write shows the kubelet an empty file first
        path = node.host(f"{MANIFESTS}/ks-{name}.yaml")
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(renamed(data, f"ks-{name}"))
        os.replace(tmp, path)
    host_network = {name for name, data in forms.items() if b"hostNetwork: true" in data}
    assert {"kubeadm", "kubeadm-crlf", "args-rke2"} <= host_network
    log = node.run / "kubelet.log"

    def admitted() -> set[str]:
        text = log.read_text(errors="replace")
        assert "can't process config file" not in text, node.log("kubelet")
        return {name for name in forms if f'source="file" pods=["kube-system/ks-{name}-{node.name}"]' in text}

    wait_until(lambda: admitted() == set(forms), 60, lambda: f"every form admitted\n{node.log('kubelet')}")

    def mirrors() -> dict[str, dict[str, Any]] | None:
        found = {name: node.get(f"/api/v1/namespaces/kube-system/pods/ks-{name}-{node.name}") for name in host_network}
        return {k: v for k, v in found.items() if v is not None} if all(found.values()) else None

    pods = wait_until(mirrors, 120, lambda: f"a mirror pod for every hostNetwork form\n{node.log('kubelet')}")
    for name, pod in pods.items():
        words = command_of(pod)
        configs = [w for w in words if w.startswith("--config=")]
        assert len(configs) == 1 and configs[0].startswith(f"--config={CONFIG_DIR}/"), (name, words)
        paths = {v["hostPath"]["path"] for v in pod["spec"]["volumes"] if "hostPath" in v}
        assert CONFIG_DIR in paths, (name, paths)
        assert pod["metadata"]["annotations"]["kubernetes.io/config.source"] == "file"
