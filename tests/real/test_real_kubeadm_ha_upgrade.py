"""`kubeadm upgrade` of three control-plane nodes, node by node, with the chart's agents running on every one.

What only this test proves: that the agents installed by the real helm as a DaemonSet let a three-control-plane
cluster be upgraded to the next release the way kubeadm's documentation orders it -- on the first node `kubeadm
upgrade apply`, on each other one `kubeadm upgrade node`, each node drained first, its kubelet replaced by the new
release's and uncordoned after -- and that meanwhile: each kubeadm exits 0 without a rollback and without waiting out
its 5 min wait for the scheduler's new mirror pod (the agent's re-patch lands under kubeadm's feet on every node, and
the other nodes' agents, sharing the rollout Lease, write nothing); each node ends on the new release's
kube-scheduler with the agent's `--config` and the extender, the Node saying `Ready` for the manifest as it is; each
node's kubeadm backup folder stays as kubeadm left it; each agent writes the manifest exactly once after kubeadm's
write; and never two kube-schedulers of the cluster are down for a new manifest at once. Then kubeadm once more on
the last node, to the release it runs, with the node held (the operator contract's way for a re-run, which the
agent's re-patch would otherwise make kubeadm wait out and roll back): kubeadm exits 0, the agent writes nothing
until the hold's release and then once. Then `helm uninstall` (journey e after c): every node's manifest is
byte-identical to what kubeadm's upgrade wrote, and the agents' pods are gone. It prints the timeline of the
upgrade: kubeadm's writes, the agents' writes, each scheduler's restart, in seconds."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from tests.harness.real.controlplane import Binaries, one_at_a_time, wait_until
from tests.harness.real.helmtool import CHART, NAMESPACE, RELEASE
from tests.harness.real.kubeadm_chart import (
    SCHEDULER_CONFIG,
    AgentLogs,
    agent_image_on,
    agent_log,
    agents,
    chart_values,
    helm_in,
    helm_path,
    settled_nodes,
    states,
    uninstall,
    unpatched,
)
from tests.harness.real.kubeadm_cluster import KubeadmCluster, cluster_missing, kubeadm_cluster
from tests.harness.real.kubeadm_node import MANIFESTS, KubeadmNode
from tests.harness.real.kubeadm_upgrade import (
    PREFIX,
    UPGRADE_DEADLINE,
    ManifestWatch,
    SchedulerWatch,
    Snapshot,
    StampedProcess,
    Timeline,
    answer,
    drain,
    import_release_images,
    node_annotations,
    ready_on,
    restart_kubelet,
    snapshot,
    uncordon,
    upgrade_apply,
    upgrade_node,
    upgrade_releases,
    use_tools,
)

pytestmark = pytest.mark.real_kubeadm

MANIFEST = f"{MANIFESTS}/kube-scheduler.yaml"
WROTE_MANIFEST = f"wrote {MANIFEST}"
#: What kubeadm prints when a component's wait fails (its 5 min out, or the pod's hash unchanged) and it moves its
#: backup back.
KUBEADM_FAILED = ("rolled back", "did not change after", "tried to recover")


def releases() -> tuple[Binaries, Binaries]:
    return upgrade_releases(cluster_missing(), "the kubeadm cluster's upgrade")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[KubeadmCluster]:
    """Three control-plane nodes of the second newest release (the real-test lock held throughout), whose pods get
    an address: kubeadm's upgrade health check runs a Job's pod (`KubeadmNode.pod_addresses`)."""
    old, _ = releases()
    with one_at_a_time(), kubeadm_cluster(old, tmp_path / "ha", 3, pod_addresses=True) as made:
        print(f"\nkubeadm cluster v{old.version}: {made.timings()}")
        yield made


def helm(node: KubeadmNode, *args: str) -> subprocess.CompletedProcess[str]:
    return helm_in(node, helm_path(), *args)


def writes(log: list[tuple[float, str]], since: float = 0.0, until: float = float("inf")) -> list[float]:
    return [t for t, line in log if WROTE_MANIFEST in line and since <= t <= until]


def not_ready(node: KubeadmNode, version: str) -> str:
    return (f"the agent's patch Ready on v{version} on {node.name}: {node_annotations(node)}\n"
            f"--- kubelet ---\n{node.log('kubelet')}")


def runs_kubelet(node: KubeadmNode, version: str) -> bool:
    """The Node reports the kubelet of `version`."""
    found = (answer(node, f"/api/v1/nodes/{node.name}") or {}).get("status", {}).get("nodeInfo", {})
    return bool(found.get("kubeletVersion") == f"v{version}")


def keep(source: str, what: str) -> bool:
    """The timeline's rows worth reading: kubeadm's steps (not its klog lines), the agents' lines but their health
    server's and their debug lines."""
    if source.startswith("kubeadm"):
        return what.startswith(("[upgrade", "[apiclient]", "[WARNING", "\t[WARNING", "error", "[kubelet")) or \
            any(f in what for f in KUBEADM_FAILED)
    if source.startswith("agent"):
        return "health server" not in what and " DEBUG " not in what
    return True


def add_schedulers(timeline: Timeline, schedulers: SchedulerWatch, clock: float) -> None:
    """Each change of a node's kube-scheduler mirror pod (ready or not, its config hash, gone) as timeline rows;
    `clock` is time.time() - time.monotonic()."""
    last: dict[str, tuple[bool, str]] = {}
    for stamp, node, is_ready, config in list(schedulers.events):
        if last.get(node) != (is_ready, config):
            last[node] = (is_ready, config)
            what = "gone" if not config else f"{'ready' if is_ready else 'not ready'}, config hash {config[:12]}"
            timeline.add("scheduler", f"{node}: {what}", stamp + clock)
    for ended, listed in schedulers.gaps:
        timeline.add("scheduler", f"(watch ended; listed again {listed - ended:.1f} s later)", ended + clock)


def upgrade_again_held(node: KubeadmNode, new: Binaries, timeline: Timeline, extender: str,
                       kubeadm_wrote: dict[str, bytes], backups: dict[str, tuple[Path, Snapshot]]) -> float:
    """kubeadm run again to the release the node runs (a re-run after a failure, a configuration change):
    kubeadm's manifest then differs from the node's by the agent's patch only, and the agent's re-patch would give
    back the very hash kubeadm read before and waits to see change (measured: kubeadm waits its 5 min and rolls
    back). So the operator holds the node first (the operator contract's way): the agent writes nothing, kubeadm's
    own manifest changes the hash, kubeadm exits 0; at the hold's release the agent patches once more. kubeadm's
    earlier backups stay as they were. Returns the seconds from the hold to the agent's Ready."""
    started = time.time()
    name = node.name
    writes_before = len(writes(agent_log(node)))
    held = node.kubectl("annotate", "node", name, f"{PREFIX}hold=kubeadm upgrade node v{new.version}")
    assert held.returncode == 0, held.stderr
    timeline.add("harness", f"{name}: held")
    wait_until(lambda: node_annotations(node).get("state") == "Held", 120,
               lambda: f"{name} Held: {node_annotations(node)}")
    drain(node)
    again = upgrade_node(node, new, timeline, f"kubeadm {name} (again, held)")
    code = again.wait(UPGRADE_DEADLINE)
    output = again.text()
    assert code == 0, f"kubeadm upgrade node (again) on {name} exited {code}\n{again.text(80)}"
    assert not [f for f in KUBEADM_FAILED if f in output], output
    manifest = node.host(MANIFEST).read_bytes()
    assert b"--config=" not in manifest, manifest.decode()  # kubeadm's own, left alone while held
    assert manifest == kubeadm_wrote[name]  # the same release, the same bytes as its first upgrade wrote
    assert len(writes(agent_log(node))) == writes_before, agent_log(node)  # nothing while held
    folder, files = backups[name]
    now = snapshot(folder)
    assert {k: now.get(k) for k in files} == files, f"{name}: kubeadm's earlier backups changed"
    backups[name] = (folder, now)  # and the new backup folder this run made, from here on
    released = node.kubectl("annotate", "node", name, f"{PREFIX}hold-")
    assert released.returncode == 0, released.stderr
    timeline.add("harness", f"{name}: hold released")
    wait_until(partial(ready_on, node, new.version), 600, lambda: (
        f"the agent's patch Ready again on {name}: {node_annotations(node)}\n{agent_log(node)[-20:]}\n"
        f"--- kubelet ---\n{node.log('kubelet')}"))
    assert len(writes(agent_log(node))) == writes_before + 1, agent_log(node)  # once, at the release
    uncordon(node)
    assert wait_until(node.scheduler_extenders, 120, f"the extender on {name}'s /configz") == [extender]
    return time.time() - started


@pytest.mark.timeout(3000)
def test_kubeadm_upgrade_of_three_control_plane_nodes_with_the_agents_running(
        cluster: KubeadmCluster, tmp_path: Path) -> None:
    """helm install -> every node Ready on N; then node by node: drain, `kubeadm upgrade apply vN+1` (first) or
    `kubeadm upgrade node` (the others) with N+1's kubeadm and images on the node, N+1's kubelet, uncordon ->
    kubeadm exits 0, no rollback, no wait out; the node Ready on N+1 with --config and the extender; its backup
    folder as kubeadm left it; its agent wrote once after kubeadm; never two schedulers down. Then stop-agents and
    helm uninstall -> kubeadm's upgraded bytes on every node, the agents gone."""
    old, new = releases()
    nodes = cluster.nodes
    names = [n.name for n in nodes]
    timeline = Timeline()
    clock = time.time() - time.monotonic()
    journey = time.time()
    watches = {n.name: ManifestWatch(n, timeline, f"manifest {n.name}").start() for n in nodes}
    schedulers = SchedulerWatch.watch(cluster.first)
    kubeadms: dict[str, StampedProcess] = {}
    logs: dict[str, list[tuple[float, str]]] = {}
    marks: dict[str, dict[str, float]] = {n: {} for n in names}
    backups: dict[str, tuple[Path, Snapshot]] = {}
    timings: list[str] = []
    kept: AgentLogs | None = None
    try:
        assert wait_until(lambda: settled_nodes(cluster), 300, "three Ready control-plane Nodes") == sorted(names)
        for node in nodes:
            wait_until(partial(unpatched, node), 300, f"kubeadm's scheduler on {node.name}")
        wait_until(lambda: {n for _, n, r, _ in schedulers.events if r} == set(names) or None, 60,
                   "the scheduler watch's first list")

        # -- the agents installed by helm, every node Ready on the old release ------------------------------------
        repository, tag = agent_image_on(cluster)
        values = chart_values(repository, tag)
        extender = values["extenders"][0]["urlPrefix"]
        (tmp_path / "values.json").write_text(json.dumps(values))
        started = time.time()
        timeline.add("harness", "helm install")
        proc = helm(cluster.first, "install", RELEASE, str(CHART), f"--namespace={NAMESPACE}", "--create-namespace",
                    f"--values={tmp_path / 'values.json'}")
        assert proc.returncode == 0, proc.stderr
        wait_until(lambda: all(ready_on(n, old.version) for n in nodes), 900,
                   lambda: f"every node Ready on v{old.version}: {states(cluster)}")
        timings.append(f"helm install to every node Ready {time.time() - started:.1f} s")
        timeline.add("harness", f"every node Ready on v{old.version}")
        patched = {n.name: n.host(MANIFEST).read_bytes() for n in nodes}
        before = {n.name: node_annotations(n) for n in nodes}
        installed = time.time()

        # -- node by node, as kubeadm's upgrade documentation orders it --------------------------------------------
        for index, node in enumerate(nodes):
            mark = marks[node.name]
            started = time.time()
            import_release_images(node, new)
            use_tools(node, new, "kubeadm")
            timeline.add("harness", f"{node.name}: v{new.version}'s kubeadm and images in place; drain")
            drain(node)
            mark["kubeadm"] = time.time()
            run = (upgrade_apply(node, new, timeline, f"kubeadm {node.name}") if index == 0 else
                   upgrade_node(node, new, timeline, f"kubeadm {node.name}"))
            kubeadms[node.name] = run
            code = run.wait(UPGRADE_DEADLINE)
            mark["exited"] = time.time()
            output = run.text()
            command = "upgrade apply" if index == 0 else "upgrade node"
            assert code == 0, f"kubeadm {command} on {node.name} exited {code}\n{run.text(80)}"
            assert not [f for f in KUBEADM_FAILED if f in output], output
            # kubeadm's folder: its backup of the manifests (and of the kubelet's config), as it left them
            folders = sorted(node.host("/etc/kubernetes/tmp").glob("kubeadm-backup-manifests-*"))
            assert len(folders) == 1, folders
            backups[node.name] = (node.host("/etc/kubernetes/tmp"), snapshot(node.host("/etc/kubernetes/tmp")))
            # kubeadm moved the manifest the agent had patched into its backup, untouched
            assert (folders[0] / "kube-scheduler.yaml").read_bytes() == patched[node.name]

            # the kubelet of the new release (kubeadm's documentation: after `upgrade apply` / `upgrade node`)
            mark["kubelet"] = time.time()
            timeline.add("harness", f"{node.name}: kubelet v{old.version} stopped, v{new.version} started")
            restart_kubelet(node, old, new)
            use_tools(node, new, "kubelet", "kubectl")
            node.binaries = new
            pod = wait_until(partial(ready_on, node, new.version), 600, partial(not_ready, node, new.version))
            mark["ready"] = time.time()
            wait_until(partial(runs_kubelet, node, new.version), 120, f"{node.name} reporting the new kubelet")
            uncordon(node)
            timeline.add("harness", f"{node.name}: uncordoned")
            timings.append(f"{node.name} ({command}) {time.time() - started:.1f} s: kubeadm "
                           f"{mark['exited'] - mark['kubeadm']:.1f} s, new kubelet to Ready "
                           f"{mark['ready'] - mark['kubelet']:.1f} s")
            container = next(c for c in pod["spec"]["containers"] if c["name"] == "kube-scheduler")
            configs = [f for f in container["command"] if f.startswith("--config=")]
            assert len(configs) == 1 and configs[0].startswith(f"--config={SCHEDULER_CONFIG}"), container["command"]
            assert wait_until(node.scheduler_extenders, 120, f"the extender on {node.name}'s /configz") == [extender]
            after = node_annotations(node)
            assert after["source-hash"] == before[node.name]["source-hash"], (before[node.name], after)
            assert after["config-hash"] != before[node.name]["config-hash"]  # rendered for the new minor
        upgraded = time.time()

        # -- what each writer did ------------------------------------------------------------------------------
        logs.update({n.name: agent_log(n) for n in nodes})
        kubeadm_wrote: dict[str, bytes] = {}
        for node in nodes:
            name, mark = node.name, marks[node.name]
            assert snapshot(backups[name][0]) == backups[name][1], f"{name}: kubeadm's backups changed after its exit"
            mark["step"] = next(t for t, line in kubeadms[name].lines
                                if 'Component "kube-scheduler" upgraded successfully' in line)
            mark["moved"] = next(t for t, line in kubeadms[name].lines
                                 if re.search(r'Moving new manifest to ".*kube-scheduler\.yaml"', line))
            # the manifest's versions from kubeadm's start: its own, then the agent's patch of it, and no other
            watch = watches[name]
            since = [(v, data) for v, data in zip(watch.versions, watch.contents, strict=True)
                     if v[0] >= mark["kubeadm"]]
            kinds = [("patched" if v[3] else "kubeadm") for v, _ in since]
            assert kinds == ["kubeadm", "patched"], (name, watch.versions)
            assert f"kube-scheduler:v{new.version}".encode() in since[0][1], since[0][1].decode()
            kubeadm_wrote[name] = since[0][1]
            mark["agent"] = since[1][0][0]
            assert node.host(MANIFEST).stat().st_ino == since[1][0][1]  # the agent's write is the manifest now
            # and the agent says the same: one write after kubeadm's, none between the install and kubeadm's
            assert len(writes(logs[name], installed)) == 1, (name, logs[name])
            assert writes(logs[name], installed)[0] > mark["kubeadm"], (name, mark, logs[name])
            assert len(writes(logs[name])) == 2, (name, logs[name])  # in all: the install's, the upgrade's
            assert not [line for _, line in logs[name] if "RolledBack" in line or "PatchFailed" in line], logs[name]
        window = schedulers.replacements(installed - clock, upgraded - clock)
        most = max((len(down) for _, _, down in window), default=0)
        assert most == 1, window  # each node's scheduler replaced, never two at once

        # -- `kubeadm upgrade node` again, to the release the node runs, with the node held ------------------------
        held_in = upgrade_again_held(nodes[-1], new, timeline, extender, kubeadm_wrote, backups)
        timings.append(f"{nodes[-1].name}: held, `kubeadm upgrade node` again, released, Ready {held_in:.1f} s")

        # -- journey e after c: helm uninstall gives every node kubeadm's upgraded bytes -----------------------------
        started = time.time()
        timeline.add("harness", "stop-agents, helm uninstall")
        kept = AgentLogs(nodes).start()
        uninstall(cluster.first, helm_path())

        def restored() -> bool:
            if agents(cluster.first):
                return False
            if any(n.host(MANIFEST).read_bytes() != kubeadm_wrote[n.name] for n in nodes):
                return False
            return all(unpatched(n) for n in nodes)
        wait_until(restored, 300, lambda: f"kubeadm's upgraded manifests back, agents gone: "
                   f"{len(agents(cluster.first))} agents left")
        uninstalled = time.time()
        timeline.add("harness", "kubeadm's manifests back on every node, schedulers running them, agents gone")
        timings.append(f"stop-agents + helm uninstall to kubeadm's bytes {uninstalled - started:.1f} s")
        uninstall_window = schedulers.replacements(started - clock, uninstalled - clock)
        assert max((len(down) for _, _, down in uninstall_window), default=0) == 1, uninstall_window
        for name, (folder, files) in backups.items():
            assert snapshot(folder) == files, f"{name}: kubeadm's backups changed"
        timings.append(f"journey (cluster Ready to the uninstall's end) {uninstalled - journey:.1f} s")
    finally:
        schedulers.stop()
        for watch in watches.values():
            watch.stop()
        if not logs:
            try:
                logs.update({n.name: agent_log(n) for n in nodes})
            except OSError as exc:
                print(f"the agents' logs: {exc}")
        if kept is not None:  # the uninstall's lines, read while the agents' pods were there
            for name, rows in kept.stop().items():
                logs[name] = sorted(set(logs.get(name, [])) | rows)
        for name, log in logs.items():
            for stamp, line in log:
                timeline.add(f"agent {name}", line.split(" ", 1)[-1], stamp)
        add_schedulers(timeline, schedulers, clock)
        print("\n" + timeline.render(journey, keep))
    print("\n" + "\n".join(timings))
    for name, mark in marks.items():
        print(f"{name}: kubeadm started {mark['kubeadm'] - journey:.1f} s, moved the scheduler's manifest in at "
              f"{mark['moved'] - journey:.1f} s, the agent's write {mark['agent'] - mark['moved']:.2f} s later, "
              f"kubeadm's kube-scheduler step done {mark['step'] - mark['moved']:.2f} s after its write, exit "
              f"at {mark['exited'] - journey:.1f} s; new kubelet at {mark['kubelet'] - journey:.1f} s, "
              f"Ready at {mark['ready'] - journey:.1f} s")
