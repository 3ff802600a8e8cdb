"""Journey d of the kubeadm cluster (tests/real/test_real_kubeadm_cluster.py has a, b and e): a control-plane
node's maintenance in the middle of the agents' rollout, on three control-plane nodes made by the real kubeadm.
The drain, the kubelet's restart and containerd's restart are what an operator does to a node at any time; the
agents must neither leave a node without a working kube-scheduler nor patch one twice. Its own cluster: a failure
here leaves nothing behind for the other journeys.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from tests.harness.real.controlplane import one_at_a_time, wait_until
from tests.harness.real.helmtool import CHART, NAMESPACE, RELEASE
from tests.harness.real.kubeadm_chart import (
    SCHEDULER_CONFIG,
    agent_image_on,
    agents,
    chart_values,
    configs_run,
    drain_and_restart,
    scheduler_config,
    states,
    unpatched,
)
from tests.harness.real.kubeadm_cluster import KubeadmCluster, SchedulerTimeline, kubeadm_cluster
from tests.harness.real.kubeadm_node import MANIFESTS, KubeadmNode
from tests.real.test_real_kubeadm_cluster import helm, newest_release

pytestmark = pytest.mark.real_kubeadm


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeadmCluster]:
    """Three control-plane nodes of the newest release (the real-test lock held throughout)."""
    with one_at_a_time():
        binaries = newest_release()
        with kubeadm_cluster(binaries, tmp_path_factory.mktemp("ha"), 3) as made:
            yield made


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
    timeline = SchedulerTimeline.watch(cluster.first)
    try:
        wait_until(lambda: {n for _, n, r, _ in timeline.events if r} == set(written) or None, 60,
                   "the watch's first list")
        values = tmp_path / "values.json"
        values.write_text(json.dumps(chart_values(repository, tag)))
        installed_at = time.monotonic()
        proc = helm(cluster.first, "install", RELEASE, str(CHART), f"--namespace={NAMESPACE}", "--create-namespace",
                    f"--values={values}")
        assert proc.returncode == 0, proc.stderr

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
