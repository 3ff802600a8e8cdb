"""The cluster readiness verdict against the API emulator: three control-plane nodes, their mirror pods.

Nodes and mirror pods are set directly (the agents and kubelets are not part of this test); the command is run
through ``main`` with the flags a user would pass.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from patcher.adapters.kube.cluster import collect, publish_status
from patcher.adapters.kube.errors import Conflict, ServerError
from patcher.adapters.kube.transport import Api
from patcher.commands import cli, readiness
from patcher.core.readiness import ClusterVerdict, NodeRow, evaluate, render_table, scheduler_pods
from tests.harness.emu.fixtures import api as api
from tests.harness.emu.fixtures import emu as emu
from tests.harness.emu.kubeemu import make_mirror_pod, wait_until
from tests.harness.emu.kubeemu_ext import (
    BEFORE,
    CONFIG_HASH,
    MTIME,
    OTHER_HASH,
    OTHER_SOURCE,
    SOURCE_HASH,
    STARTED,
    KubeEmulatorExt,
    marker,
    node_annotations_for,
)

CP = "node-role.kubernetes.io/control-plane"
MASTER = "node-role.kubernetes.io/master"
NODES = ("cp-1", "cp-2", "cp-3")
NS = "scheduler-patcher"


def set_node(emu: KubeEmulatorExt, name: str, annotations: dict[str, str] | None = None, *,
             labels: dict[str, str] | None = None) -> None:
    emu.upsert({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {CP: ""} if labels is None else labels,
                             "annotations": dict(annotations or {})}})


def set_mirror(emu: KubeEmulatorExt, node: str, *, config_hash: str = CONFIG_HASH, started_at: str = STARTED,
               labels: dict[str, str] | None = None, **kw: Any) -> None:
    pod = make_mirror_pod(node_name=node, annotations=marker(config_hash), started_at=started_at, **kw)
    if labels:
        pod["metadata"]["labels"] = labels
    emu.set_pod(pod)


def ready_cluster(emu: KubeEmulatorExt, nodes: tuple[str, ...] = NODES) -> None:
    for n in nodes:
        set_mirror(emu, n)
        set_node(emu, n, node_annotations_for())
    set_node(emu, "worker-1", {}, labels={})  # not a control-plane node: never part of the verdict


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    readiness.add_arguments(parser)
    return parser.parse_args(list(argv))


def run_main(kubeconfig: Path, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = readiness.main(parse("--kubeconfig", str(kubeconfig), *argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


# --- the verdict ------------------------------------------------------------------------------------------


def test_three_ready_nodes_give_a_ready_table_and_exit_0(emu: KubeEmulatorExt, kubeconfig: Path) -> None:
    ready_cluster(emu)
    code, out, err = run_main(kubeconfig)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["NODE", "STATE", "SOURCE-HASH", "CONFIG-HASH", "MANIFEST-MTIME",
                                "SCHEDULER-STARTED", "RESTARTED-AT", "READY", "MESSAGE"]
    assert [line.split()[:4] for line in lines[1:4]] == [[n, "Ready", SOURCE_HASH[:12], CONFIG_HASH[:12]]
                                                         for n in NODES]
    assert lines[1].split()[4:] == [MTIME, STARTED, "2026-11-21T23:40:03.000000000Z", "yes", "-"]
    assert lines[4] == f"verdict: Ready: 3/3 nodes run source {SOURCE_HASH[:12]}"
    assert "worker-1" not in out
    assert len(lines) == 5


def test_json_output_carries_every_row_and_the_overall_verdict(emu: KubeEmulatorExt, kubeconfig: Path) -> None:
    ready_cluster(emu)
    set_node(emu, "cp-3", node_annotations_for("RolledBack", message="kube-scheduler crash-loops with config x."))
    code, out, _ = run_main(kubeconfig, "--output", "json")
    doc = json.loads(out)
    assert code == 1
    assert doc["ready"] is False and doc["expectedHash"] == SOURCE_HASH
    assert [n["node"] for n in doc["nodes"]] == list(NODES)
    first = doc["nodes"][0]
    assert first == {"node": "cp-1", "state": "Ready", "sourceHash": SOURCE_HASH, "configHash": CONFIG_HASH,
                     "manifestMtime": MTIME,
                     "schedulerStarted": STARTED, "restartedAt": "2026-11-21T23:40:03.000000000Z", "message": None,
                     "mirrorPod": "kube-scheduler-cp-1", "ready": True, "reason": None, "selected": True}
    assert doc["nodes"][2]["reason"] == "state is RolledBack: kube-scheduler crash-loops with config x."
    assert doc["nodes"][2]["message"] == "kube-scheduler crash-loops with config x."
    assert doc["summary"] == f"NotReady: 2/3 nodes ready for source {SOURCE_HASH[:12]}"


def test_each_reason_for_not_ready_is_named(emu: KubeEmulatorExt, api: Api) -> None:
    ready_cluster(emu, ("cp-1", "cp-2", "cp-3", "cp-4", "cp-5", "cp-6"))
    set_node(emu, "cp-1", node_annotations_for("WaitingForRestart"))
    set_mirror(emu, "cp-2", started_at=BEFORE)  # the old scheduler (with a copied marker): not proof
    emu.delete("pods", "kube-scheduler-cp-3", namespace="kube-system")
    set_mirror(emu, "cp-4", config_hash=OTHER_HASH)  # the kubelet still runs another manifest
    set_mirror(emu, "cp-5", waiting_reason="CrashLoopBackOff")
    set_node(emu, "cp-6", {})
    verdict = collect(api)
    reasons = {r.node: r.reason for r in verdict.rows}
    assert not verdict.ready and verdict.expected_hash == SOURCE_HASH
    assert reasons["cp-1"] == "state is WaitingForRestart"
    assert reasons["cp-2"] == ("mirror pod kube-scheduler-cp-2: container kube-scheduler started at "
                               f"{BEFORE}, before the write at 2026-11-21T23:40:01.000000000Z")
    assert reasons["cp-3"] == "mirror pod kube-scheduler-cp-3: the mirror pod does not exist (yet)"
    assert reasons["cp-4"] == ("mirror pod kube-scheduler-cp-4: the mirror pod runs config fedcba987654, "
                               "not 0123456789ab yet")
    assert "CrashLoopBackOff" in reasons["cp-5"]
    assert reasons["cp-6"] == "no scheduler-patcher annotations (is the agent running on this node?)"
    assert verdict.explain() == [f"{n}: {reasons[n]}" for n in ("cp-1", "cp-2", "cp-3", "cp-4", "cp-5", "cp-6")]
    assert [r.mirror_pod for r in verdict.rows][2] is None


def test_a_ready_node_whose_extender_stopped_answering_is_not_ready(emu: KubeEmulatorExt,
                                                                    api: Api) -> None:
    ready_cluster(emu)
    down = "extenders stopped answering: extender http://127.0.0.1:8889/filter does not answer: HTTP 500"
    set_node(emu, "cp-2", {**node_annotations_for(), "scheduler-patcher.io/message": down})
    verdict = collect(api)
    assert not verdict.ready and verdict.explain() == [f"cp-2: {down}"]


def test_a_scheduler_that_restarted_since_is_still_ready(emu: KubeEmulatorExt, api: Api) -> None:
    # kube-scheduler exits whenever it loses its leader election; the kubelet restarts it with the same
    # manifest. That is no reason to call the cluster not ready.
    ready_cluster(emu)
    set_mirror(emu, "cp-2", restart_count=3, started_at="2026-11-22T08:00:00Z")
    assert collect(api).ready


def test_nodes_must_agree_on_one_source_unless_one_is_expected(emu: KubeEmulatorExt, api: Api) -> None:
    ready_cluster(emu)
    set_node(emu, "cp-3", node_annotations_for(config_hash=OTHER_HASH, source_hash=OTHER_SOURCE))
    set_mirror(emu, "cp-3", config_hash=OTHER_HASH)
    verdict = collect(api)
    assert not verdict.ready and verdict.expected_hash is None
    assert verdict.problems == (f"nodes disagree on the config: {SOURCE_HASH[:12]} on cp-1, cp-2; "
                                f"{OTHER_SOURCE[:12]} on cp-3",)
    assert all(r.ready for r in verdict.rows)  # each node does run what it says: the cluster as a whole does not

    pinned = collect(api, expected_hash=SOURCE_HASH[:12])
    assert not pinned.ready and pinned.problems == ()
    assert [r.node for r in pinned.not_ready()] == ["cp-3"]
    assert pinned.not_ready()[0].reason == (f"runs source {OTHER_SOURCE[:12]} (config fedcba987654), "
                                            f"expected {SOURCE_HASH[:12]}")
    # A config hash names it as well (upper case too); fewer than 12 digits could match by accident.
    assert [r.node for r in collect(api, expected_hash=OTHER_HASH.upper()).not_ready()] == ["cp-1", "cp-2"]
    with pytest.raises(ValueError, match="12 to 64 hex digits"):
        collect(api, expected_hash="0123")


def test_mid_upgrade_nodes_render_one_source_into_different_configs(emu: KubeEmulatorExt,
                                                                   api: Api) -> None:
    # cp-3 already runs the next kube-scheduler minor: the same ConfigMap renders to another file there.
    ready_cluster(emu)
    set_node(emu, "cp-3", node_annotations_for(config_hash=OTHER_HASH))
    set_mirror(emu, "cp-3", config_hash=OTHER_HASH)
    assert collect(api).ready
    set_mirror(emu, "cp-3", config_hash=CONFIG_HASH)  # but its mirror pod must prove its own config
    assert [r.node for r in collect(api).not_ready()] == ["cp-3"]
    # Agents that publish no source-hash are compared by config-hash.
    for n in NODES:
        set_node(emu, n, node_annotations_for(source_hash=None))
    set_mirror(emu, "cp-3")
    assert collect(api).expected_hash == CONFIG_HASH


def test_the_legacy_master_label_counts_once(emu: KubeEmulatorExt, api: Api) -> None:
    ready_cluster(emu, ("cp-1", "old-master"))
    set_node(emu, "cp-1", node_annotations_for(), labels={CP: "", MASTER: ""})
    set_node(emu, "old-master", node_annotations_for(), labels={MASTER: ""})
    assert [r.node for r in collect(api).rows] == ["cp-1", "old-master"]
    assert [r.node for r in collect(api, node_selector="no-such-label").rows] == ["cp-1", "old-master"]
    # Without the legacy label the scheduler on old-master is still counted (it runs there), outside the selector.
    narrow = collect(api, legacy_master_label=False)
    assert [(r.node, r.selected, r.ready) for r in narrow.rows] == [("cp-1", True, True), ("old-master", False, True)]
    assert len(narrow.warnings) == 1 and "on node old-master" in narrow.warnings[0]
    emu.delete("pods", "kube-scheduler-old-master", namespace="kube-system")
    assert [r.node for r in collect(api, legacy_master_label=False).rows] == ["cp-1"]


def test_scheduler_pods_come_from_the_labelled_list_the_metadata_and_reads_by_name(emu: KubeEmulatorExt,
                                                                                    api: Api) -> None:
    ready_cluster(emu)
    pods = "/api/v1/namespaces/kube-system/pods"
    emu.clear_requests()
    # kubeletsim-style mirror pods without kubeadm's labels: the labelled list misses them, the namespace's
    # metadata has them (Node-owned, named kube-scheduler-<node>), each is then read by name; no GET
    assert collect(api).ready
    reads = [(r.path, r.query.get("labelSelector"), r.query.get("fieldSelector"), r.query.get("limit"),
              "as=PartialObjectMetadataList" in r.headers.get("accept", "")) for r in emu.requests("GET")]
    assert reads == [("/api/v1/nodes", CP, None, None, False), ("/api/v1/nodes", MASTER, None, None, False),
                     (pods, "component=kube-scheduler", None, "500", False), (pods, None, None, "500", True),
                     *((pods, None, f"metadata.name=kube-scheduler-{n}", None, False) for n in NODES)]
    # A caller that may not list pods reads each selected node's mirror pod, and cannot call the cluster Ready:
    # a scheduler outside the selector would be invisible.
    emu.fail("GET", pods, 403)
    emu.clear_requests()
    verdict = collect(api)
    assert sorted(r.path for r in emu.requests("GET") if r.path.startswith(pods + "/")) == [
        f"{pods}/kube-scheduler-{n}" for n in NODES]
    assert all(r.ready for r in verdict.rows) and not verdict.ready
    assert verdict.problems == ("cannot list pods in kube-system (forbidden): kube-schedulers on nodes outside the "
                                "node selector cannot be counted",)


def test_with_an_executor_the_four_lists_go_at_once_and_decide_the_same(emu: KubeEmulatorExt,
                                                                         api: Api) -> None:
    # The gatekeeper reads the verdict between two batches of releases: one round trip for the four lists (two
    # of Nodes, the labelled pods and the namespace's metadata), one for the reads by name.
    ready_cluster(emu, ("cp-1", "cp-2", "old-master"))
    set_node(emu, "old-master", node_annotations_for(), labels={MASTER: ""})
    set_node(emu, "cp-4", {}, labels={})
    set_mirror(emu, "cp-4", labels={"component": "kube-scheduler"})  # a scheduler outside the selector
    pods = "/api/v1/namespaces/kube-system/pods"
    # Each read waits at a barrier until all four have arrived: sent one after another, they would never meet.
    barrier = threading.Barrier(4, timeout=20)
    for path in ("/api/v1/nodes", pods):
        emu.before("GET", path, lambda _e: barrier.wait(), times=2)
    with ThreadPoolExecutor(4) as pool:
        parallel = collect(api, executor=pool)
        assert emu.pending_rules() == 0 and not barrier.broken
        assert parallel == collect(api)
        assert [(r.node, r.selected, r.ready) for r in parallel.rows] == [
            ("cp-1", True, True), ("cp-2", True, True), ("cp-4", False, False), ("old-master", True, True)]
        # Pods that may not be listed: each selected node's mirror pod is read instead, as without an executor.
        emu.fail("GET", pods, 403, times=3)  # both lists at once, then the first of the sequential two
        forbidden = collect(api, executor=pool)
        assert forbidden == collect(api) and emu.pending_rules() == 0
        assert not forbidden.ready and forbidden.problems == (
            "cannot list pods in kube-system (forbidden): kube-schedulers on nodes outside the node selector cannot "
            "be counted",)


def test_evaluate_is_pure_and_handles_an_empty_cluster() -> None:
    verdict = evaluate([], {})
    assert not verdict.ready and verdict.problems == ("no control-plane nodes found",)
    assert verdict.summary() == "NotReady: 0/0 nodes ready"
    assert render_table(verdict).splitlines()[-2:] == ["verdict: NotReady: 0/0 nodes ready",
                                                                 "  no control-plane nodes found"]


# --- --wait and errors --------------------------------------------------------------------------------


def test_wait_returns_0_as_soon_as_the_last_node_becomes_ready(emu: KubeEmulatorExt, kubeconfig: Path) -> None:
    ready_cluster(emu)
    set_node(emu, "cp-3", node_annotations_for("WaitingForRestart"))
    set_mirror(emu, "cp-3", started_at=BEFORE)

    def node_watches() -> list[object]:
        return [r for r in emu.requests("GET", "/api/v1/nodes") if r.query.get("watch") == "true"]

    out_io, err_io = io.StringIO(), io.StringIO()

    def kubelet_and_agent() -> None:
        # The waiter listens (both selectors) and has judged the cluster once: a change before that first
        # verdict (a busy machine can let this thread run first) would make it Ready without ever waiting.
        assert wait_until(lambda: len(node_watches()) >= 2 and "waiting:" in err_io.getvalue(), 60)
        set_mirror(emu, "cp-3")  # the restarted scheduler
        set_node(emu, "cp-3", node_annotations_for())  # the agent saw it

    t = threading.Thread(target=kubelet_and_agent)
    t.start()
    # The poll interval lies beyond the timeout: a 0 can only come from the Node watch ending the wait.
    code = readiness.main(parse("--kubeconfig", str(kubeconfig), "--wait", "--timeout", "30s", "--poll-interval",
                                "600s"), out=out_io, err=err_io)
    out, err = out_io.getvalue(), err_io.getvalue()
    t.join()
    assert code == 0, err
    assert "verdict: Ready: 3/3" in out
    assert err.startswith(f"waiting: NotReady: 2/3 nodes ready for source {SOURCE_HASH[:12]}; "
                          "cp-3: state is WaitingForRestart")
    watches = [r for r in emu.requests("GET", "/api/v1/nodes") if r.query.get("watch") == "true"]
    assert {r.query.get("labelSelector") for r in watches} == {CP, MASTER}


def test_wait_gives_up_with_1_and_names_the_nodes(emu: KubeEmulatorExt, kubeconfig: Path) -> None:
    ready_cluster(emu)
    set_node(emu, "cp-2", node_annotations_for("Pending"))
    set_mirror(emu, "cp-3", started_at=BEFORE)
    started = time.monotonic()
    code, out, err = run_main(kubeconfig, "--wait", "--timeout", "1s", "--poll-interval", "0.2s")
    assert code == 1
    assert time.monotonic() - started >= 1.0  # it waited out its timeout (a slow machine only adds)
    assert "verdict: NotReady: 1/3 nodes ready" in out
    last = err.splitlines()[-1]
    assert last.startswith("scheduler-patcher: not ready after 1s: cp-2: state is Pending; cp-3: mirror pod "
                           "kube-scheduler-cp-3: container kube-scheduler started at")


def test_api_errors_give_1_and_one_clear_line(emu: KubeEmulatorExt, kubeconfig: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    ready_cluster(emu)
    emu.go_down("503")
    code, out, err = run_main(kubeconfig)
    assert (code, out) == (1, "")
    assert err == ("scheduler-patcher: error: cannot list nodes (node-role.kubernetes.io/control-plane): "
                   "HTTP 503 Service Unavailable\n")
    assert len(emu.requests("GET", "/api/v1/nodes")) == 3  # retried: a restarting apiserver is routine

    code, out, err = run_main(kubeconfig, "--wait", "--timeout", "0.5s")
    assert (code, out) == (1, "")
    assert err.startswith("scheduler-patcher: error: cannot list nodes") and err.count("\n") == 1

    emu.come_up()
    with pytest.raises(SystemExit) as exit_info:  # a bad flag value is a usage error, as for every command
        cli.main(["readiness", "--kubeconfig", str(kubeconfig), "--expected-hash", "abc"])
    assert exit_info.value.code == 64
    assert capsys.readouterr().err.endswith("scheduler-patcher readiness: error: argument --expected-hash: the "
                                            "expected config hash must be 12 to 64 hex digits, got 'abc'\n")


def test_an_outage_during_wait_is_survived(emu: KubeEmulatorExt, kubeconfig: Path,
                                          caplog: pytest.LogCaptureFixture) -> None:
    ready_cluster(emu)
    set_node(emu, "cp-1", node_annotations_for("WaitingForRestart"))
    emu.go_down("refuse")
    caplog.set_level(logging.DEBUG, logger="patcher.adapters.kube.listwatch")

    refused: list[bool] = []

    def recover() -> None:  # once the wait's watches were refused (a refused connection reaches no server)
        refused.append(wait_until(lambda: any("failed" in r.getMessage() for r in list(caplog.records)), 10))
        emu.come_up()
        set_node(emu, "cp-1", node_annotations_for())

    t = threading.Thread(target=recover)
    t.start()
    code, out, _ = run_main(kubeconfig, "--wait", "--timeout", "10s", "--poll-interval", "0.3s")
    t.join()
    assert refused == [True]
    assert code == 0 and "verdict: Ready" in out


# --- published ConfigMaps -----------------------------------------------------------------------------


def configmap(emu: KubeEmulatorExt, name: str, namespace: str = NS) -> dict[str, Any]:
    cm = emu.get("configmaps", name, namespace)
    assert cm is not None, f"ConfigMap {namespace}/{name} missing"
    return cm


def test_publish_writes_our_status_and_the_csi_baremetal_shape(emu: KubeEmulatorExt, api: Api) -> None:
    ready_cluster(emu)
    set_node(emu, "cp-2", node_annotations_for("WaitingForRestart"))
    written = publish_status(api, collect(api), namespace=NS, compat_csi_baremetal=True)
    assert not written.ready

    status = configmap(emu, "scheduler-patcher-status")
    assert status["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "scheduler-patcher"}
    assert status["data"]["ready"] == "false" and status["data"]["expected-hash"] == SOURCE_HASH
    doc = json.loads(status["data"]["status.json"])
    assert doc == written.to_dict()
    assert [n["ready"] for n in doc["nodes"]] == [True, False, True]

    compat = configmap(emu, "extender-readiness")
    assert list(compat["data"]) == ["nodes.yaml"]
    # What csi-baremetal's extender health server unmarshals (common.ReadinessStatusList).
    assert YAML(typ="safe").load(compat["data"]["nodes.yaml"]) == {"nodes": [
        {"node_name": "cp-1", "kube_scheduler": "kube-scheduler-cp-1", "restarted": True},
        {"node_name": "cp-2", "kube_scheduler": "kube-scheduler-cp-2", "restarted": False},
        {"node_name": "cp-3", "kube_scheduler": "kube-scheduler-cp-3", "restarted": True},
    ]}
    assert compat["data"]["nodes.yaml"].startswith("nodes:\n- node_name: cp-1\n  kube_scheduler: kube-scheduler-cp-1\n")


def test_compat_quotes_names_yaml_would_misread_and_lists_nodes_without_a_pod(api: Api,
                                                                            emu: KubeEmulatorExt) -> None:
    ready_cluster(emu, ("true", "123"))
    emu.delete("pods", "kube-scheduler-123", namespace="kube-system")
    publish_status(api, collect(api), namespace=NS, compat_csi_baremetal=True, compat_namespace="csi")
    nodes = YAML(typ="safe").load(configmap(emu, "extender-readiness", "csi")["data"]["nodes.yaml"])["nodes"]
    assert nodes == [{"node_name": "123", "kube_scheduler": "", "restarted": False},
                     {"node_name": "true", "kube_scheduler": "kube-scheduler-true", "restarted": True}]
    assert emu.get("configmaps", "extender-readiness", NS) is None


def test_publish_updates_with_the_resource_version_only_when_something_changed(
        emu: KubeEmulatorExt, api: Api) -> None:
    ready_cluster(emu)
    # The csi-baremetal operator may have created it (with its owner reference): we keep what is not ours.
    emu.create({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "extender-readiness", "namespace": NS,
                             "ownerReferences": [{"apiVersion": "csi-baremetal.dell.com/v1", "kind": "Deployment",
                                                  "name": "csi-baremetal", "uid": "u-1"}]},
                "data": {"other": "kept"}})
    publish_status(api, collect(api), namespace=NS, compat_csi_baremetal=True)
    emu.clear_requests()
    publish_status(api, collect(api), namespace=NS, compat_csi_baremetal=True)
    assert emu.requests("PUT") == [] and emu.requests("POST") == []

    set_node(emu, "cp-1", node_annotations_for("WaitingForRestart"))
    before = configmap(emu, "extender-readiness")["metadata"]["resourceVersion"]
    publish_status(api, collect(api), namespace=NS, compat_csi_baremetal=True)
    puts = emu.requests("PUT")
    assert [r.path for r in puts] == [f"/api/v1/namespaces/{NS}/configmaps/scheduler-patcher-status",
                                      f"/api/v1/namespaces/{NS}/configmaps/extender-readiness"]
    assert puts[1].json()["metadata"]["resourceVersion"] == before
    compat = configmap(emu, "extender-readiness")
    assert compat["data"]["other"] == "kept"
    assert compat["metadata"]["ownerReferences"][0]["name"] == "csi-baremetal"
    assert "restarted: false" in compat["data"]["nodes.yaml"]


def test_a_concurrent_writer_makes_publish_read_and_evaluate_again(emu: KubeEmulatorExt,
                                                                  api: Api) -> None:
    ready_cluster(emu)
    set_node(emu, "cp-1", node_annotations_for("WaitingForRestart"))
    publish_status(api, collect(api), namespace=NS)
    path = f"/api/v1/namespaces/{NS}/configmaps/scheduler-patcher-status"

    def other_agent(e: Any) -> None:  # another agent publishes between our read and our write
        e.mutate("configmaps", "scheduler-patcher-status", lambda cm: cm["data"].update(ready="other"),
                 namespace=NS)

    emu.before("PUT", path, other_agent)
    calls: list[ClusterVerdict] = []

    def fresh() -> ClusterVerdict:
        calls.append(collect(api))
        return calls[-1]

    set_node(emu, "cp-1", node_annotations_for())
    written = publish_status(api, fresh, namespace=NS)
    assert written.ready and len(calls) == 2  # evaluated again after the conflict
    assert [r.status for r in emu.requests("PUT", path)] == [409, 200]
    assert configmap(emu, "scheduler-patcher-status")["data"]["ready"] == "true"

    emu.fail("PUT", path, 409, times=10)
    set_node(emu, "cp-1", node_annotations_for("Pending"))
    with pytest.raises(Conflict, match="still conflicting after 5 attempts"):
        publish_status(api, fresh, namespace=NS)
    emu.go_down("503")
    with pytest.raises(ServerError, match="cannot read ConfigMap scheduler-patcher/scheduler-patcher-status: "
                                             "HTTP 503") as info:
        publish_status(api, written, namespace=NS)
    assert info.value.status == 503


# --- every scheduler counted -----------------------------------------------------------------------------------


def test_a_scheduler_on_an_unlabelled_node_is_not_ready(emu: KubeEmulatorExt, api: Api,
                                                         kubeconfig: Path) -> None:
    # Some installers do not label control-plane nodes: the DaemonSet's default placement puts no agent there,
    # and a verdict that starts from node labels would never see that scheduler, which runs without the extender.
    ready_cluster(emu)
    set_node(emu, "cp-4", {}, labels={})
    set_mirror(emu, "cp-4", labels={"component": "kube-scheduler", "tier": "control-plane"})
    verdict = collect(api)
    assert not verdict.ready
    row = {r.node: r for r in verdict.rows}["cp-4"]
    assert row.reason == "kube-scheduler runs here, no agent reports"
    assert row.mirror_pod == "kube-scheduler-cp-4" and not row.selected
    assert verdict.warnings == ("kube-scheduler pod kube-system/kube-scheduler-cp-4 runs on node cp-4, which the "
                                "control-plane node selector does not select: the DaemonSet's default placement "
                                "puts no agent there (see 'Unlabelled control plane' in docs/operator-contract.md)",)
    code, out, _ = run_main(kubeconfig, "-o", "json")
    doc = json.loads(out)
    assert code == 1 and doc["warnings"] == list(verdict.warnings)
    assert doc["nodes"][-1] == {**doc["nodes"][-1], "node": "cp-4", "selected": False, "ready": False,
                                "reason": "kube-scheduler runs here, no agent reports"}
    code, out, _ = run_main(kubeconfig)
    assert "warning: kube-scheduler pod kube-system/kube-scheduler-cp-4 runs on node cp-4" in out
    assert "  cp-4: kube-scheduler runs here, no agent reports" in out
    # the published verdict carries the row too, and the csi-baremetal shape lists the node as not restarted
    publish_status(api, lambda: collect(api), namespace=NS, compat_csi_baremetal=True)
    status = json.loads(configmap(emu, "scheduler-patcher-status")["data"]["status.json"])
    assert status["nodes"][-1]["reason"] == "kube-scheduler runs here, no agent reports"
    compat = YAML(typ="safe").load(configmap(emu, "extender-readiness")["data"]["nodes.yaml"])
    assert compat["nodes"][-1] == {"node_name": "cp-4", "kube_scheduler": "kube-scheduler-cp-4", "restarted": False}


def test_a_node_owned_scheduler_pod_without_labels_is_counted_too(emu: KubeEmulatorExt,
                                                                   api: Api) -> None:
    # kubeletsim-style mirror pods carry no labels; their owner (the Node) and name make them the scheduler.
    ready_cluster(emu)
    set_node(emu, "cp-4", {}, labels={})
    set_mirror(emu, "cp-4")
    verdict = collect(api)
    assert [r.node for r in verdict.rows] == [*NODES, "cp-4"]
    assert verdict.rows[-1].reason == "kube-scheduler runs here, no agent reports"
    # the Node object is gone (or never readable): the scheduler pod alone still makes the row
    emu.delete("nodes", "cp-4")
    assert {r.node: r.reason for r in collect(api).rows}["cp-4"] == "kube-scheduler runs here, no agent reports"


def test_an_agent_on_an_unselected_node_is_judged_like_any_other(emu: KubeEmulatorExt, api: Api) -> None:
    # The operator widened the DaemonSet's placement: the agent there reports and the row can be Ready (every
    # scheduler runs the config); the warning stays, because the verdict's node selector still misses that node.
    ready_cluster(emu)
    set_node(emu, "cp-4", node_annotations_for(), labels={})
    set_mirror(emu, "cp-4")
    verdict = collect(api)
    assert verdict.rows[-1].ready and not verdict.rows[-1].selected
    assert verdict.ready and len(verdict.warnings) == 1


def test_pods_of_another_controller_are_not_counted_as_the_static_scheduler(emu: KubeEmulatorExt,
                                                                             api: Api) -> None:
    ready_cluster(emu)
    pod = make_mirror_pod(node_name="worker-1", static_name="second-scheduler", annotations={})
    pod["metadata"]["labels"] = {"component": "kube-scheduler"}
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "second-abc",
                                           "uid": "rs", "controller": True}]
    emu.set_pod(pod)
    verdict = collect(api)
    assert verdict.ready and [r.node for r in verdict.rows] == list(NODES)
    # etcd and the apiserver are Node-owned too, but they are not the scheduler
    emu.set_pod(make_mirror_pod(node_name="cp-9", static_name="etcd", annotations={}))
    assert collect(api).ready


def test_scheduler_pods_prefers_the_mirror_name_when_two_pods_claim_a_node() -> None:
    mirror = make_mirror_pod(node_name="cp-1", annotations={})
    other = make_mirror_pod(node_name="cp-1", static_name="kube-scheduler-custom", annotations={})
    found = scheduler_pods([other, mirror], [mirror, other])
    assert found.by_node == {"cp-1": mirror}
    assert found.warnings == ("pod kube-scheduler-custom-cp-1 on node cp-1 also looks like a kube-scheduler; the "
                              "verdict judges kube-scheduler-cp-1",)
    unscheduled = make_mirror_pod(node_name="cp-2", annotations={})
    del unscheduled["spec"]["nodeName"], unscheduled["metadata"]["ownerReferences"]
    assert scheduler_pods([unscheduled], []).by_node == {}


def test_the_summary_names_the_kind_of_hash_it_held_the_nodes_against() -> None:
    """The agreed hash is the ConfigMap's source hash, not a config: the summary says so; a config hash given as
    --expected-hash is called a config."""
    row = NodeRow(node="cp-1", state="Ready", source_hash="5" * 64, config_hash="c" * 64, manifest_mtime=None,
                  scheduler_started=None, restarted_at=None, message=None, mirror_pod="kube-scheduler-cp-1",
                  ready=True)
    assert ClusterVerdict((row,), "5" * 64).summary() == "Ready: 1/1 nodes run source 555555555555"
    assert ClusterVerdict((row,), "c" * 12).summary() == "Ready: 1/1 nodes run config cccccccccccc"
