"""Three control-plane nodes made by the real kubeadm (tests/harness/real/kubeadm_cluster.py): the cluster a kubeadm
user runs, with stacked etcd, the API endpoint behind haproxy, and one kube-scheduler and kube-controller-manager per
node electing their leaders through the real Leases.

What only such a cluster can say: that the nodes kubeadm joins are what the agents' DaemonSet selects, that the real
DaemonSet controller places one agent on each, that the agents take turns on the real nodes (never two schedulers
down at once), and that `helm uninstall` leaves every node's manifest as kubeadm wrote it while the real garbage
collector takes the agents' pods. And a control-plane node's maintenance in the middle of the rollout (a drain,
the kubelet's restart, containerd's restart: what an operator does to a node at any time): the agents neither leave a
node without a working kube-scheduler nor patch one twice. The journeys share the module's cluster (one start,
~1.5 min); each ends with `helm uninstall` and kubeadm's manifests back.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from bench.rollout_gap import PROBE_LABEL, PROBE_NAMESPACE, Prober, figures, percentile
from tests.harness.real.controlplane import Binaries, one_at_a_time, wait_until
from tests.harness.real.helmtool import CHART, NAMESPACE, RELEASE
from tests.harness.real.kubeadm_chart import (
    SCHEDULER_CONFIG,
    AgentLogs,
    agent_image_on,
    agents,
    chart_values,
    configs_run,
    daemonset,
    drain_and_restart,
    each_waited_for_the_last,
    events,
    files_of,
    helm_in,
    helm_path,
    lease_holder,
    next_agent_image_on,
    ready,
    rolled_out,
    scheduler_config,
    scheduler_run,
    settled_nodes,
    states,
    uninstall,
    unpatched,
)
from tests.harness.real.kubeadm_cluster import (
    KubeadmCluster,
    SchedulerTimeline,
    cluster_missing,
    kubeadm_cluster,
)
from tests.harness.real.kubeadm_node import MANIFESTS, KubeadmNode, releases_with_kubeadm
from tests.harness.real.kubeadm_upgrade import SchedulerWatch

pytestmark = pytest.mark.real_kubeadm

def newest_release() -> Binaries:
    """The newest built release with kubeadm, or one line on why the cluster cannot start (a failure under CI=true,
    where nothing may skip)."""
    why = cluster_missing()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the kubeadm cluster cannot start under CI=true: {why}")
        pytest.skip(why)
    return releases_with_kubeadm()[0]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeadmCluster]:
    """Three control-plane nodes of the newest release, shared by this module's tests (the real-test lock held
    from before the first node to after the last one stopped)."""
    with one_at_a_time():
        binaries = newest_release()
        with kubeadm_cluster(binaries, tmp_path_factory.mktemp("ha"), 3) as made:
            print(f"\nkubeadm cluster v{binaries.version}: {made.timings()}")
            yield made


@pytest.fixture(autouse=True)
def chart_gone_after(cluster: KubeadmCluster) -> Iterator[None]:
    """Each journey ends with `helm uninstall`. One that failed midway left the chart installed: it is uninstalled
    here the same way, and kubeadm's schedulers waited for, so the next test starts from kubeadm's manifests and
    fails, if it does, on its own."""
    yield
    status = helm(cluster.first, "status", RELEASE, f"--namespace={NAMESPACE}")
    if status.returncode != 0 and "not found" in status.stderr:
        return  # not installed: the test uninstalled it or never installed it
    if cluster.first.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/scheduler-patcher") is not None:
        uninstall(cluster.first, helm_path())
    else:
        proc = helm(cluster.first, "uninstall", RELEASE, f"--namespace={NAMESPACE}")
        assert proc.returncode == 0, proc.stderr
    wait_until(lambda: not agents(cluster.first) and all(unpatched(n) for n in cluster.nodes), 300,
               "kubeadm's schedulers back after a failed journey's uninstall")


def etcd_members(node: KubeadmNode) -> list[dict[str, Any]] | None:
    """The etcd cluster's members, as the node's etcd tells them (its grpc-gateway, with kubeadm's health-check
    client certificate); None while it does not answer."""
    pki = "/etc/kubernetes/pki/etcd"
    proc = subprocess.run(node.inside(["curl", "-sS", "--fail", "--max-time", "10", "--cacert", f"{pki}/ca.crt",
                                       "--cert", f"{pki}/healthcheck-client.crt", "--key",
                                       f"{pki}/healthcheck-client.key", "-X", "POST", "-d", "{}",
                                       "https://127.0.0.1:2379/v3/cluster/member/list"]),
                          capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        return None
    members: list[dict[str, Any]] = json.loads(proc.stdout)["members"]
    return members


def test_three_control_plane_nodes(cluster: KubeadmCluster) -> None:
    """kubeadm init + two joins -> three Ready Nodes with kubeadm's control-plane label and taint; three etcd
    members, none a learner any more; kube-scheduler's and kube-controller-manager's Leases each held by one of the
    three; and every node runs kubeadm's four static pods."""
    names = [n.name for n in cluster.nodes]
    assert wait_until(lambda: settled_nodes(cluster), 300, "three Ready control-plane Nodes, only kubeadm's taint "
                      "on each") == sorted(names)

    def all_started() -> list[dict[str, Any]] | None:
        members = etcd_members(cluster.first) or []
        return members if len(members) == 3 and not any(m.get("isLearner") for m in members) else None
    members = wait_until(all_started, 120, "three voting etcd members")
    assert sorted(m["name"] for m in members) == sorted(names)
    assert sorted(u for m in members for u in m["clientURLs"]) == sorted(
        f"https://{n.address}:2379" for n in cluster.nodes)

    for node in cluster.nodes:
        for component in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
            wait_until(partial(node.running, component), 300,
                       f"{component} on {node.name}\n{node.log('kubelet')}")
    for lease in ("kube-scheduler", "kube-controller-manager"):
        holder = wait_until(partial(lease_holder, cluster.first, lease), 120, f"the {lease} Lease held")
        assert holder in names, holder
    print(f"\ncluster idle: {cluster.rss() / 2**20:.0f} MiB RSS (3 nodes and haproxy); "
          f"scheduler leader {lease_holder(cluster.first, 'kube-scheduler')}")


# -- the journey: helm install, the rollout one node at a time, helm uninstall ------------------------------------

def helm(node: KubeadmNode, *args: str) -> subprocess.CompletedProcess[str]:
    return helm_in(node, helm_path(), *args)


#: issue 43's goal: no pod waits more than this beyond the idle p99 during the leader-aware rollout...
GOAL_S = 5.0
#: ...and what this sandbox adds on a busy 2-core machine (the three nodes' control planes share it): the test
#: fails on a wait near a scheduler's whole restart (10-20 s with no leader), not on a slow moment.
SLACK_S = 7.0
IDLE_PODS = 120  # 30 s of bench/rollout_gap.py's prober, one pod every 250 ms


def install(cluster: KubeadmCluster, timeline: SchedulerTimeline, values: Path, repository: str, tag: str) -> float:
    """`helm install` of the chart with the image `repository:tag`, once the scheduler timeline has listed every
    node (a restart before that would be missed); returns when the command was given (monotonic)."""
    wait_until(lambda: {n for _, n, r, _ in timeline.events if r} == {n.name for n in cluster.nodes} or None, 60,
               "the watch's first list")
    values.write_text(json.dumps(chart_values(repository, tag)))
    installed_at = time.monotonic()
    proc = helm(cluster.first, "install", RELEASE, str(CHART), f"--namespace={NAMESPACE}", "--create-namespace",
                f"--values={values}")
    assert proc.returncode == 0, proc.stderr
    return installed_at


def idle_wait(prober: Prober) -> float:
    """The idle p99 of the pods' waits: the next IDLE_PODS probe pods bound before anything else happens."""
    wait_until(lambda: prober.bound, 120, "the prober's first pod bound")
    since = time.monotonic()
    wait_until(lambda: sum(t >= since for t in list(prober.bound.values())) >= IDLE_PODS, 300,
               f"{IDLE_PODS} probe pods bound")
    waits, _ = prober.waits(since, time.monotonic())
    return percentile(waits, 0.99)


def pods_waited(cluster: KubeadmCluster, prober: Prober, since: float, idle_p99: float) -> dict[str, Any]:
    """bench/rollout_gap.py's figures of the probe pods created from `since` until now, once each is bound."""
    until = time.monotonic()

    def unbound() -> list[str]:
        return [n for n, t in list(prober.created.items()) if since <= t < until and n not in prober.bound]
    wait_until(lambda: not unbound(), 120, lambda: f"every probe pod of the window bound:\n"
               f"{unbound_report(cluster, prober, unbound(), since)}")
    return figures(prober, since, until, idle_p99)


def unbound_report(cluster: KubeadmCluster, prober: Prober, names: list[str], since: float) -> str:
    """Why probe pods are not bound, as far as this side can tell: from the nodes' files, the control plane's
    container restarts and each scheduler's last lines; from the API if it answers, whether it has the pods bound
    (then the prober's watch missed it) and, if not, what the scheduler said (PodScheduled) or that it never tried,
    the Nodes' taints and readiness and the scheduler Lease; the prober's watch restarts."""
    lines = [f"{len(names)} unbound, created {', '.join(f'{prober.created[n] - since:.1f}' for n in names[:10])} s "
             f"into the window; the prober's watch restarts since: "
             f"{[(round(t - since, 1), e) for t, e in prober.restarts if t >= since]}"]
    for node in cluster.nodes:
        runs = sorted(node.host("/var/log/pods").glob("kube-system_*/*/*.log"))  # one file per container run
        lines.append(f"{node.name}'s control-plane container runs: {[f'{f.parent.name}/{f.stem}' for f in runs]}")
        logs = sorted((f for f in runs if f.parent.name == "kube-scheduler"), key=lambda f: f.stat().st_mtime)
        tail = logs[-1].read_text(errors="replace").splitlines()[-15:] if logs else ["(no log)"]
        lines.append(f"{node.name}'s kube-scheduler, last lines:\n" + "\n".join(f"  {line}" for line in tail))
    try:
        pods = {p["metadata"]["name"]: p for p in (cluster.first.get(
            f"/api/v1/namespaces/{PROBE_NAMESPACE}/pods?labelSelector=app%3D{PROBE_LABEL}") or {}).get("items") or []}
        for name in names[:5]:
            pod = pods.get(name)
            if pod is None:
                lines.append(f"  {name}: not in the API")
                continue
            said = [c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"]
            lines.append(f"  {name}: nodeName {pod['spec'].get('nodeName')!r}, deleting "
                         f"{bool(pod['metadata'].get('deletionTimestamp'))}, PodScheduled {said or 'never set'}")
        per_node: dict[str, int] = {}
        for pod in pods.values():
            node_name = pod["spec"].get("nodeName") or "(none)"
            per_node[node_name] = per_node.get(node_name, 0) + 1
        lines.append(f"probe pods in the API by node: {per_node}")
        for found in (cluster.first.get("/api/v1/nodes") or {}).get("items") or []:
            lines.append(f"Node {found['metadata']['name']}: Ready {ready(found)}, unschedulable "
                         f"{bool(found['spec'].get('unschedulable'))}, taints "
                         f"{[t['key'] for t in found['spec'].get('taints') or []]}")
        lines.append(f"scheduler Lease: {lease_holder(cluster.first, 'kube-scheduler')}")
    except AssertionError as exc:  # the API did not answer: what the files said is all there is
        lines.append(f"the API: {exc}")
    return "\n".join(lines)


def upgrade_restarts_no_scheduler(cluster: KubeadmCluster, timeline: SchedulerTimeline, prober: Prober,
                                  idle_p99: float, values: Path, repository: str, tag: str) -> None:
    """`helm upgrade` to a new image tag, the values otherwise the same, on the patched cluster -> the DaemonSet's
    rolling update (maxUnavailable 1, maxSurge 0) replaces one agent after the other, each only once the one before
    it is Ready; each old agent keeps the patch on SIGTERM (`--restore-on-exit=auto`: its DaemonSet still selects
    the node; Event PatchKept) and its successor adopts it without a write: no kube-scheduler replaced or
    restarted (same container), every manifest and config file untouched (same inode, mtime and bytes), every Node
    still Ready, and the probe pods wait no longer than during the install's goal."""
    new_tag = next_agent_image_on(cluster, repository, tag)  # before the window: the import is not the rollout's
    image = f"{repository}:{new_tag}"
    watched = [f"{MANIFESTS}/kube-scheduler.yaml", SCHEDULER_CONFIG]
    files = {n.name: files_of(n, watched) for n in cluster.nodes}
    running = {n.name: wait_until(partial(scheduler_run, n), 300, f"kube-scheduler on {n.name}")
               for n in cluster.nodes}
    kept = events(cluster.first, "PatchKept")
    old_images = {s["imageID"] for p in agents(cluster.first) for s in p["status"]["containerStatuses"]}
    generation = daemonset(cluster.first)["metadata"]["generation"]
    values.write_text(json.dumps(chart_values(repository, new_tag)))
    upgraded_at = time.monotonic()
    proc = helm(cluster.first, "upgrade", RELEASE, str(CHART), f"--namespace={NAMESPACE}", f"--values={values}")
    assert proc.returncode == 0, proc.stderr
    pods = wait_until(partial(rolled_out, cluster.first, image), 600,
                      f"the agents' rolling update to {image}: {daemonset(cluster.first).get('status')}")
    rollout_in = time.monotonic() - upgraded_at
    gap = pods_waited(cluster, prober, upgraded_at, idle_p99)
    assert daemonset(cluster.first)["metadata"]["generation"] > generation
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(files), pods
    assert each_waited_for_the_last(pods) == [], pods  # the controller waited for each new agent's readiness
    new_images = {s["imageID"] for p in pods for s in p["status"]["containerStatuses"]}
    assert len(new_images) == 1 and not new_images & old_images, (old_images, new_images)  # another image runs
    window = timeline.replacements(upgraded_at, time.monotonic())
    assert not [down for _, _, down in window if down], window  # no kube-scheduler replaced
    for node in cluster.nodes:
        now = scheduler_run(node)
        assert now is not None and now[0] == running[node.name][0], (node.name, now)  # the same static pod
        assert now[3] == running[node.name][3], (node.name, now)
        if now[2] != running[node.name][2]:  # the container: not even restarted, unless by its own exit
            assert now[1] > running[node.name][1], (node.name, running[node.name], now)
            print(f"{node.name}: its kube-scheduler exited by itself during the upgrade (restart count "
                  f"{running[node.name][1]} -> {now[1]}); its kubelet restarted the same pod")
        assert files_of(node, watched) == files[node.name], node.name  # nothing written, not even the same bytes
    assert set(states(cluster).values()) == {"Ready"}, states(cluster)
    now_kept = events(cluster.first, "PatchKept")
    assert {n: now_kept.get(n, 0) - kept.get(n, 0) for n in files} == dict.fromkeys(files, 1), now_kept
    print(f"helm upgrade to {new_tag} -> rolling update of {len(pods)} agents done in {rollout_in:.1f} s, "
          f"{len(window)} scheduler pod events, 0 schedulers replaced or restarted; pods bound meanwhile: {gap}")
    assert gap["max_wait_s"] <= GOAL_S + SLACK_S, gap


def test_helm_install_rolls_out_one_node_at_a_time_and_uninstall_gives_kubeadm_its_bytes(
        cluster: KubeadmCluster, tmp_path: Path) -> None:
    """`helm install` (the real helm, in a node, as kubeadm's admin) -> the real DaemonSet controller places one
    agent on each control-plane node; the agents take the rollout Lease in turn: never two kube-scheduler mirror pods
    not ready at once; each kubelet restarts its scheduler with `--config`; each Node reports Ready. `helm
    uninstall` (its pre-delete hook's `stop-agents` first: the DaemonSet deleted in the foreground while the agents'
    RBAC is there) -> the garbage collector deletes the agents' pods, each agent restores on its way out, taking
    turns: never two schedulers not ready at once; every manifest is byte-identical to what kubeadm wrote and every
    scheduler runs it again. Meanwhile bench/rollout_gap.py's
    prober creates a pod every 250 ms: during the install none waits more than GOAL_S + SLACK_S beyond the idle
    p99 measured first, during the install and during the uninstall, and the scheduler Lease changes hands at most
    twice in each (~30 s more than the journey alone)."""
    manifests = {n.name: n.host(f"{MANIFESTS}/kube-scheduler.yaml") for n in cluster.nodes}
    written = {name: path.read_bytes() for name, path in manifests.items()}
    before = {n.name: wait_until(partial(scheduler_config, n), 300, f"kube-scheduler on {n.name}")
              for n in cluster.nodes}
    assert all(flags == [] for _, flags in before.values()), before
    started = time.monotonic()
    repository, tag = agent_image_on(cluster)
    print(f"\nagent image imported into {cluster.size} nodes in {time.monotonic() - started:.1f} s")

    prober = Prober.start(lambda argv: cluster.first.inside(argv, pid_namespace=False))
    timeline = SchedulerWatch.watch(cluster.first)
    kept: AgentLogs | None = None
    try:
        idle_p99 = idle_wait(prober)
        installed_at = install(cluster, timeline, tmp_path / "values.json", repository, tag)

        def all_ready() -> dict[str, str] | None:
            now = states(cluster)
            assert not [s for s in now.values() if s in ("Failed", "RolledBack")], now
            return now if set(now.values()) == {"Ready"} else None
        wait_until(all_ready, 900, f"every node Ready: {states(cluster)}")
        install_in = time.monotonic() - installed_at
        gap = pods_waited(cluster, prober, installed_at, idle_p99)
        pods = agents(cluster.first)
        assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(written), pods  # one agent per node
        assert all(p["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet" for p in pods)
        for node in cluster.nodes:
            container, flags = wait_until(partial(scheduler_config, node), 300, f"kube-scheduler on {node.name}")
            assert container != before[node.name][0], node.name  # restarted by its kubelet
            assert len(flags) == 1 and flags[0].startswith(f"--config={SCHEDULER_CONFIG}"), flags
            assert manifests[node.name].read_bytes() != written[node.name]
        window = timeline.replacements(installed_at, time.monotonic())
        replaced = sorted({node for _, _, down in window for node in down})
        assert replaced == sorted(written), window  # every scheduler was replaced by its kubelet...
        assert max(len(down) for _, _, down in window) == 1, window  # ...and never two at once
        print(f"helm install -> {cluster.size} nodes patched one at a time, all Ready: {install_in:.1f} s; "
              f"pods bound meanwhile (idle p99 {idle_p99:.2f} s): {gap}")
        assert gap["max_wait_s"] <= GOAL_S + SLACK_S, gap  # issue 43's goal, loosely: no pod waits a restart out
        assert gap["leader_changes"] <= 2, gap  # one expected: the leader's node goes last

        upgrade_restarts_no_scheduler(cluster, timeline, prober, idle_p99, tmp_path / "values-next.json",
                                      repository, tag)

        uninstalled_at, uninstall_wall = time.monotonic(), time.time()
        kept = AgentLogs(cluster.nodes).start()  # what the agents say on their way out goes with their pods
        # The chart's pre-delete hook, as its Job runs it (here from a node's network: chart_values): the DaemonSet
        # deleted in the foreground while the agents' RBAC is there, done once the real garbage collector and
        # kubelets ended every agent pod; each agent restored its node in turn, the leader's last.
        uninstall(cluster.first, helm_path())

        def restored() -> bool:
            if agents(cluster.first):
                return False
            if any(manifests[n].read_bytes() != written[n] for n in written):
                return False
            return all((scheduler_config(n) or ("", ["?"]))[1] == [] for n in cluster.nodes)
        wait_until(restored, 300, f"kubeadm's manifests back, agents gone: {len(agents(cluster.first))} left")
        uninstall_in = time.monotonic() - uninstalled_at
        now = time.monotonic()
        gap = pods_waited(cluster, prober, uninstalled_at, idle_p99)
        window = timeline.replacements(uninstalled_at, now)
        most_after = max((len(down) for _, _, down in window), default=0)
        print(f"helm uninstall -> agents gone, kubeadm's bytes on every node, schedulers back: {uninstall_in:.1f} s "
              f"(at most {most_after} scheduler(s) not ready at once; none ready for "
              f"{timeline.down_for(uninstalled_at, now, cluster.size):.1f} s); the Nodes' state: {states(cluster)}; "
              f"pods bound meanwhile (idle p99 {idle_p99:.2f} s): {gap}")
        assert sorted({node for _, _, down in window for node in down}) == sorted(written), window  # all restarted
        stops = "\n".join(f"{stamp - uninstall_wall:7.2f} s {name}: {line}" for name, rows in kept.stop().items()
                           for stamp, line in sorted(rows) if stamp >= uninstall_wall)
        # ...one at a time: the agents took turns with their RBAC still there
        assert most_after == 1, f"{window}\nthe agents' lines since the uninstall:\n{stops}"
        assert gap["max_wait_s"] <= GOAL_S + SLACK_S, gap  # issue 43's goal, loosely, for the uninstall too
        assert gap["leader_changes"] <= 2, gap  # one expected: the leader's node restores last
    finally:
        prober.stop()
        timeline.stop()
        if kept is not None:
            kept.stop()


# -- journey d: a node's maintenance in the middle of the rollout ----------------------------------------------

def test_a_node_drained_and_its_kubelet_and_containerd_restarted_mid_rollout_is_patched_once(
        cluster: KubeadmCluster, tmp_path: Path) -> None:
    """`helm install`, and once a node is Ready, the maintenance of the next one while its agent waits for the
    restart of its patched scheduler: `kubectl drain`, its kubelet restarted, containerd restarted, `kubectl
    uncordon` -> the rollout goes on and ends with
    every node Ready: never two kube-schedulers down for a new manifest at once (so never a node left without one
    and the cluster with a working one), each node's scheduler ran exactly two configs (kubeadm's, then the patched
    one: nothing patched twice, nothing rolled back), each runs `--config` at the end. `helm uninstall` then gives
    kubeadm its bytes back."""
    manifests = {n.name: n.host(f"{MANIFESTS}/kube-scheduler.yaml") for n in cluster.nodes}
    written = {name: path.read_bytes() for name, path in manifests.items()}
    for node in cluster.nodes:
        wait_until(partial(unpatched, node), 300, f"kubeadm's scheduler on {node.name}")
    repository, tag = agent_image_on(cluster)
    timeline = SchedulerWatch.watch(cluster.first)
    try:
        installed_at = install(cluster, timeline, tmp_path / "values.json", repository, tag)

        def no_failure() -> dict[str, str]:
            now = states(cluster)
            assert not [s for s in now.values() if s in ("Failed", "RolledBack")], now
            return now

        def middle() -> KubeadmNode | None:
            """A node whose new manifest waits for its kubelet's restart, once another node is Ready: the
            kubelet and containerd go away between the agent's write and the restart it waits for."""
            now = no_failure()
            assert set(now.values()) != {"Ready"}, f"the rollout ended before a node was caught waiting: {now}"
            waiting = [n for n in cluster.nodes if now.get(n.name) == "WaitingForRestart"]
            return waiting[0] if waiting and "Ready" in now.values() else None
        target = wait_until(middle, 600, f"a node Ready and another waiting for its restart: {states(cluster)}")
        done = drain_and_restart(target)
        wait_until(lambda: set(no_failure().values()) == {"Ready"} or None, 900,
                   f"every node Ready: {states(cluster)}")
        rollout_in = time.monotonic() - installed_at
        now = time.monotonic()
        window = timeline.replacements(installed_at, now)
        assert max(len(down) for _, _, down in window) == 1, window  # never two at once
        ran = {n: configs_run(timeline.events, n, installed_at) for n in written}
        assert all(len(configs) == 2 for configs in ran.values()), ran  # kubeadm's, then the patched one: once
        for node in cluster.nodes:
            _, flags = wait_until(partial(scheduler_config, node), 300, f"kube-scheduler on {node.name}")
            assert len(flags) == 1 and flags[0].startswith(f"--config={SCHEDULER_CONFIG}"), (node.name, flags)
        restarts = {p["spec"]["nodeName"]: p["status"]["containerStatuses"][0]["restartCount"]
                    for p in agents(cluster.first)}
        print(f"\nhelm install, {target.name} drained and restarted while waiting for its restart "
              f"({', '.join(done)}) -> "
              f"every node Ready in {rollout_in:.1f} s, each patched once, never two schedulers down; "
              f"agent container restarts {restarts}")

        proc = helm(cluster.first, "uninstall", RELEASE, f"--namespace={NAMESPACE}")
        assert proc.returncode == 0, proc.stderr
        wait_until(lambda: not agents(cluster.first) and all(manifests[n].read_bytes() == written[n] for n in written)
                   and all(unpatched(n) for n in cluster.nodes), 300,
                   "kubeadm's manifests back, agents gone")
    finally:
        timeline.stop()
