"""`kubeadm upgrade apply` from one release to the next with the agent running on the node.

kubeadm's static-pod upgrade (phases/upgrade/staticpods.go) renames each component's manifest into its backup
folder, renames the one it rendered into the manifest folder, waits (up to `timeouts.upgradeManifests`, 5 min) for
the mirror pod's `kubernetes.io/config.hash` to differ from the one it read before the upgrade and for the pods of
that component to run, and moves the backups back ("rolls back") when either does not come. The agent, running as
its DaemonSet pod would (a process in the node's namespaces, `--host-root /`), sees kubeadm's new scheduler manifest
and patches it again. This test records who wrote what and when (tests/harness/real/kubeadm_upgrade.py) and holds
the journey to: kubeadm finishes without a rollback, the node runs the new release with the extender, kubeadm's
backup folder stays as kubeadm made it, and the agent wrote the manifest once after kubeadm did. Then the same
release's `upgrade apply` again, which the agent's re-patch would fail (kubeadm's manifest differs from the node's by
the patch only, so the hash kubeadm waits to see change comes back): run with the node held, as the operator
contract says, kubeadm finishes and the agent patches once more at the hold's release.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import write_configmap
from tests.harness.real.controlplane import Binaries, wait_until
from tests.harness.real.kubeadm_node import MANIFESTS, KubeadmNode, kubeadm_missing
from tests.harness.real.kubeadm_upgrade import (
    PREFIX,
    UPGRADE_DEADLINE,
    ManifestWatch,
    PodWatch,
    StampedProcess,
    Timeline,
    agent,
    answer,
    drain,
    extender,
    import_release_images,
    node_annotations,
    ready_on,
    restart_kubelet,
    snapshot,
    uncordon,
    upgrade_apply,
    upgrade_releases,
    use_tools,
)

pytestmark = pytest.mark.real_kubeadm

EXTENDER_PORT = 8889
#: An extender that answers (the agent's pre-flight calls it before each write; the scheduler calls it for the
#: pod of kubeadm's health-check Job).
EXTENDERS = f"extenders:\n- urlPrefix: http://127.0.0.1:{EXTENDER_PORT}\n  filterVerb: filter\n  weight: 1\n"
WROTE_MANIFEST = rf"wrote {MANIFESTS}/kube-scheduler.yaml"


def releases() -> tuple[Binaries, Binaries]:
    return upgrade_releases(kubeadm_missing(), "the kubeadm upgrade")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[KubeadmNode]:
    old, _ = releases()
    made = KubeadmNode(old, tmp_path / "kubeadm")
    try:
        made.start()
        print(f"\nkubeadm node v{old.version}: runtime and images {made.runtime_in:.1f} s, "
              f"kubeadm init {made.init_in:.1f} s")
        yield made
    finally:
        made.stop()


@pytest.mark.timeout(2400)
def test_kubeadm_upgrade_apply_with_the_agent_running(node: KubeadmNode, tmp_path: Path) -> None:
    old, new = releases()
    timeline = Timeline()

    def keep(source: str, what: str) -> bool:
        if source.startswith("kubeadm"):
            return what.startswith(("[upgrade", "[apiclient]", "[WARNING", "\t[WARNING", "error", "[kubelet")) or \
                "rolled back" in what
        if source == "agent":
            return "health server" not in what
        return source != "extender"

    journey = time.time()
    pods = PodWatch(node, timeline).start()
    manifests = ManifestWatch(node, timeline).start()
    processes: list[StampedProcess] = []
    try:
        processes.append(extender(node, timeline, EXTENDER_PORT))
        created = node.kubectl("create", "namespace", "scheduler-patcher")
        assert created.returncode == 0, created.stderr
        source = tmp_path / "source"
        source.mkdir()
        write_configmap(source, {"extenders.yaml": EXTENDERS})

        # -- the agent patches the manifest `kubeadm init` wrote ------------------------------------------------
        run = agent(node, source, timeline)
        processes.append(run)
        wait_until(lambda: ready_on(node, old.version), 300, lambda: (f"the agent's patch Ready on v{old.version}\n"
                   f"{run.text(40)}\n--- kubelet ---\n{node.log('kubelet')}"))
        assert wait_until(node.scheduler_extenders, 120, "the extender on /configz") == \
            [f"http://127.0.0.1:{EXTENDER_PORT}"]
        patched = node.host(f"{MANIFESTS}/kube-scheduler.yaml").read_bytes()
        before = node_annotations(node)
        writes_before = sum(WROTE_MANIFEST in line for _, line in run.lines)
        assert writes_before == 1, run.text()
        patched_at = time.time()

        # -- kubeadm upgrade apply with the new release's kubeadm and images ------------------------------------
        import_release_images(node, new)
        use_tools(node, new, "kubeadm")
        drain(node)  # kubeadm's documented first step
        upgrade_started = time.time()
        kubeadm = upgrade_apply(node, new, timeline)
        code = kubeadm.wait(UPGRADE_DEADLINE)
        upgrade_ended = time.time()
        output = kubeadm.text()
        assert code == 0, f"kubeadm upgrade apply exited {code}\n{kubeadm.text(80)}\n--- agent ---\n{run.text(40)}"
        assert "rolled back" not in output and "restoring" not in output.lower(), output
        assert "did not change after" not in output and "tried to recover" not in output, output
        assert f'SUCCESS! A control plane node of your cluster was upgraded to "v{new.version}"' in output, output
        backups = sorted((node.host("/etc/kubernetes/tmp")).glob("kubeadm-backup-manifests-*"))
        assert len(backups) == 1, backups
        backup = snapshot(backups[0])
        # kubeadm moved the manifest the agent had patched into its backup, untouched
        assert (backups[0] / "kube-scheduler.yaml").read_bytes() == patched

        # -- the kubelet of the new release (kubeadm's documentation: after `upgrade apply`) --------------------
        kubelet_at = time.time()
        timeline.add("harness", f"kubelet v{old.version} stopped, v{new.version} started")
        restart_kubelet(node, old, new)
        use_tools(node, new, "kubelet", "kubectl")
        node.binaries = new
        pod = wait_until(lambda: ready_on(node, new.version), 600, lambda: (
                         f"the agent's patch Ready on v{new.version}\n"
                         f"{run.text(40)}\n--- kubelet ---\n{node.log('kubelet')}"))
        wait_until(lambda: (answer(node, f"/api/v1/nodes/{node.name}") or {}).get("status", {}).get("nodeInfo", {})
                   .get("kubeletVersion") == f"v{new.version}", 120, "the Node reporting the new kubelet")
        uncordon(node)  # and its last
        assert wait_until(node.scheduler_extenders, 120, "the extender on /configz") == \
            [f"http://127.0.0.1:{EXTENDER_PORT}"]
        after = node_annotations(node)
        assert after["state"] == "Ready" and after["source-hash"] == before["source-hash"], (before, after)
        assert after["config-hash"] != before["config-hash"]  # rendered for the new minor
        container = next(c for c in pod["spec"]["containers"] if c["name"] == "kube-scheduler")
        configs = [f for f in container["command"] if f.startswith("--config=")]
        assert len(configs) == 1 and node.host(configs[0].split("=", 1)[1]).is_file(), container["command"]

        # -- what each writer did ------------------------------------------------------------------------------
        assert snapshot(backups[0]) == backup, "kubeadm's backup folder changed after kubeadm's exit"
        moved = timeline.first("kubeadm", r'Moving new manifest to ".*kube-scheduler\.yaml"')
        agent_writes = [t for t, line in run.lines if WROTE_MANIFEST in line]
        assert len([t for t in agent_writes if t > moved]) == 1, run.text()
        assert len([t for t in agent_writes if patched_at < t < moved]) == 0, run.text()
        # the manifest's versions: kubeadm's init, the agent's patch, kubeadm's upgrade, the agent's patch of it
        kinds = [("patched" if p else "kubeadm") for _, _, _, p in manifests.versions]
        assert kinds[-2:] == ["kubeadm", "patched"] or kinds[-1:] == ["patched"], manifests.versions
        for line in run.lines:
            assert "rolled back" not in line[1].lower() and "PatchFailed" not in line[1], run.text()

        # -- `upgrade apply` to the release the node runs: kubeadm's manifest differs from the node's by the patch
        # only, so the agent's re-patch would give back the very hash kubeadm read before and waits for a change of
        # (measured: kubeadm waits its 5 min and rolls back). The operator's hold keeps the agent off meanwhile.
        held = node.kubectl("annotate", "node", node.name, f"{PREFIX}hold=kubeadm upgrade apply v{new.version}")
        assert held.returncode == 0, held.stderr
        wait_until(lambda: node_annotations(node).get("state") == "Held", 120, lambda: f"Held\n{run.text(20)}")
        writes_held = sum(WROTE_MANIFEST in line for _, line in run.lines)
        # kubeadm's upgrade reads the API endpoint from the kube-apiserver mirror pod's annotation (60 s, then
        # "failed to getAPIEndpoint"); the new kubelet re-created every mirror pod, on a loaded machine not yet.
        endpoint = "kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint"
        wait_until(lambda: endpoint in ((answer(node, f"/api/v1/namespaces/kube-system/pods/kube-apiserver-{node.name}")
                                        or {}).get("metadata", {}).get("annotations") or {}),
                   300, "the kube-apiserver mirror pod's endpoint annotation")
        drain(node)
        again = upgrade_apply(node, new, timeline, "kubeadm-again")
        code = again.wait(UPGRADE_DEADLINE)
        output = again.text()
        assert code == 0, f"kubeadm upgrade apply (again) exited {code}\n{again.text(80)}"
        assert "tried to recover" not in output and "did not change after" not in output, output
        assert b"--config=" not in node.host(f"{MANIFESTS}/kube-scheduler.yaml").read_bytes()  # kubeadm's own
        assert sum(WROTE_MANIFEST in line for _, line in run.lines) == writes_held  # nothing while held
        released = node.kubectl("annotate", "node", node.name, f"{PREFIX}hold-")
        assert released.returncode == 0, released.stderr
        wait_until(lambda: ready_on(node, new.version), 600, lambda: (
            f"the agent's patch Ready again; the Node says {node_annotations(node)}\n{run.text(60)}\n"
            f"--- kubelet ---\n{node.log('kubelet')}"))
        assert sum(WROTE_MANIFEST in line for _, line in run.lines) == writes_held + 1, run.text()
        uncordon(node)
        assert wait_until(node.scheduler_extenders, 120, "the extender on /configz") == \
            [f"http://127.0.0.1:{EXTENDER_PORT}"]
    finally:
        manifests.stop()
        pods.stop()
        for proc in processes:
            if proc.proc.poll() is None:
                proc.proc.kill()
        print("\n" + timeline.render(journey, keep))
    ended = time.time()

    # -- the report --------------------------------------------------------------------------------------------
    def component_times() -> list[str]:
        out = []
        for component in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
            start = timeline.first("kubeadm", rf'Preparing for "{component}" upgrade')
            done = timeline.first("kubeadm", rf'Component "{component}" upgraded successfully')
            out.append(f"{component} {done - start:.1f} s")
        return out

    print(f"\nkubeadm upgrade apply v{old.version} -> v{new.version}: {upgrade_ended - upgrade_started:.1f} s "
          f"({', '.join(component_times())}); kubelet restart to the agent's Ready {ended - kubelet_at:.1f} s; "
          f"journey (agent start to the end) {ended - journey:.1f} s")
    versions = [(round(t - journey, 2), d, "patched" if p else "kubeadm") for t, _, d, p in manifests.versions]
    print(f"scheduler containers: {len(pods.of('kube-scheduler'))}, manifest versions: {json.dumps(versions)}")
