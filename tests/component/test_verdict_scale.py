"""The verdict's reads at cluster scale, against the emulator: sized by the control plane, not by kube-system.

A kube-system of node agents' pods (a DaemonSet-like pod per node and agent) beside the schedulers: a verdict
read through a fresh ``SchedulerIndex`` makes the same requests, and reads the same bytes, whatever their
number, and decides as the one-shot read (a metadata-only list) does; the seed's corner case, an unlabelled
kube-scheduler on an unlabelled node, stays counted. The equivalence with the whole-namespace read of before
is a property of ``core.readiness`` (the last test). The real kube-apiserver's figures:
tests/real/test_real_verdict_scale.py and bench/verdict_scale.py.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from patcher.adapters.kube.cluster import collect
from patcher.adapters.kube.schedindex import SchedulerIndex
from patcher.adapters.kube.transport import METADATA_LIST, Api
from patcher.adapters.kube.transport import PODS as POD_RESOURCE
from patcher.core.gates import DEFAULT_GATE
from patcher.core.readiness import may_be_unlabelled_scheduler, scheduler_pods
from tests.harness.emu.fixtures import api as api
from tests.harness.emu.fixtures import emu as emu
from tests.harness.emu.gatekeeping import indexed, next_pass
from tests.harness.emu.kubeemu import make_mirror_pod, wait_until
from tests.harness.emu.kubeemu_ext import (
    CONFIG_HASH,
    STARTED,
    KubeEmulatorExt,
    make_pod,
    marker,
    node_annotations_for,
)
from tests.harness.traffic import Traffic

CP = "node-role.kubernetes.io/control-plane"
NODES = ("cp-1", "cp-2", "cp-3")
PODS = "/api/v1/namespaces/kube-system/pods"


def node(emu: KubeEmulatorExt, name: str, *, control_plane: bool = True, ready: bool = True) -> None:
    emu.upsert({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {CP: ""} if control_plane else {},
                             "annotations": node_annotations_for() if ready else {}}})


def scheduler(emu: KubeEmulatorExt, on: str, *, labelled: bool, **kw: Any) -> None:
    pod = make_mirror_pod(node_name=on, annotations=marker(CONFIG_HASH), started_at=STARTED, **kw)
    if labelled:
        pod["metadata"]["labels"] = {"component": "kube-scheduler", "tier": "control-plane"}
    emu.set_pod(pod)


def node_agents(emu: KubeEmulatorExt, first: int, count: int) -> None:
    """``count`` DaemonSet-like pods (four agents a node), Running, each ~2 KB."""
    for i in range(first, first + count):
        host, agent = f"worker-{i // 4}", ("kube-proxy", "cni", "csi-node", "node-exporter")[i % 4]
        emu.set_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"{agent}-{i:05d}", "namespace": "kube-system", "labels": {"app": agent},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": agent, "uid": agent,
                                 "controller": True}]},
            "spec": {"nodeName": host, "containers": [{"name": agent, "image": f"registry.example/{agent}:v1",
                                                        "args": ["--v=2"] * 60}]},
            "status": {"phase": "Running"}})


def cluster(emu: KubeEmulatorExt) -> None:
    """Three labelled control-plane nodes with kubeadm's labelled schedulers, and the seed's corner case: an
    unlabelled kube-scheduler on an unlabelled node (no agent there: the verdict is NotReady)."""
    for n in NODES:
        node(emu, n)
        scheduler(emu, n, labelled=True)
    node(emu, "bare-1", control_plane=False, ready=False)
    scheduler(emu, "bare-1", labelled=False)
    emu.set_pod(make_mirror_pod(node_name="cp-1", static_name="etcd", annotations={}))  # Node-owned, not ours


def warm_verdict(emu: KubeEmulatorExt, api: Api, index: SchedulerIndex) -> tuple[list[tuple[str, str]], int]:
    """The requests (path, selector) and the bytes of one verdict read through ``index``."""
    emu.clear_requests()
    traffic = Traffic(api)
    collect(api, index=index)
    reads = [(r.path, r.query.get("labelSelector") or r.query.get("fieldSelector") or "")
             for r in emu.requests("GET")]
    return reads, traffic.received


def test_a_warm_verdict_reads_the_same_whatever_kube_systems_size(emu: KubeEmulatorExt, api: Api) -> None:
    cluster(emu)
    node_agents(emu, 0, 40)
    changes: list[int] = []
    index = SchedulerIndex(api, on_change=lambda: changes.append(1))
    index.start()
    try:
        assert index.wait_fresh(5)
        assert index.candidates() == ["kube-scheduler-bare-1", *(f"kube-scheduler-{n}" for n in NODES)]
        verdict = collect(api, index=index)
        assert verdict == collect(api)  # the one-shot read (a metadata-only list) decides alike
        assert not verdict.ready and [(r.node, r.selected, r.reason) for r in verdict.rows if not r.ready] == [
            ("bare-1", False, "kube-scheduler runs here, no agent reports")]
        small, small_bytes = warm_verdict(emu, api, index)
        assert small == [("/api/v1/nodes", CP), ("/api/v1/nodes", "node-role.kubernetes.io/master"),
                         (PODS, "component=kube-scheduler"), (PODS, "metadata.name=kube-scheduler-bare-1"),
                         ("/api/v1/nodes", "metadata.name=bare-1")]
        node_agents(emu, 40, 800)  # twenty times as many node agents
        assert wait_until(lambda: index.fresh and len(emu.list_objects("pods", "kube-system")) == 845, 5)
        large, large_bytes = warm_verdict(emu, api, index)
        assert large == small
        assert abs(large_bytes - small_bytes) < 64  # the lists' resourceVersions have more digits, nothing else
        assert index.drops == 0  # it never stopped following the server: listed once, then only watched
        assert collect(api, index=index) == verdict
    finally:
        index.stop()


def test_the_index_follows_schedulers_that_come_change_and_go(emu: KubeEmulatorExt, api: Api) -> None:
    cluster(emu)
    changes: list[int] = []
    index = SchedulerIndex(api, on_change=lambda: changes.append(1))
    index.start()
    try:
        assert index.wait_fresh(5)
        seen = len(changes)
        node_agents(emu, 0, 8)  # not a scheduler: nobody is told
        node(emu, "bare-2", control_plane=False, ready=False)
        scheduler(emu, "bare-2", labelled=False)
        assert wait_until(lambda: "kube-scheduler-bare-2" in (index.candidates() or []), 5)
        assert len(changes) == seen + 1
        scheduler(emu, "bare-2", labelled=False, waiting_reason="CrashLoopBackOff")  # its status changed
        assert wait_until(lambda: len(changes) == seen + 2, 5)
        # deleted as kube-apiserver does it: first marked (deletionTimestamp), then gone; each one a change
        emu.delete("pods", "kube-scheduler-bare-2", namespace="kube-system")
        assert wait_until(lambda: "kube-scheduler-bare-2" not in (index.candidates() or ["x"]), 5)
        assert wait_until(lambda: len(changes) == seen + 4, 5)
        # a labelled scheduler no Node owns (the verdict's labelled list counts it): not a candidate to read
        # by name, but its changes make the verdict stale all the same
        hand_made = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "my-scheduler", "namespace": "kube-system", "labels": {"component": "kube-scheduler"}},
            "spec": {"nodeName": "cp-1", "containers": [{"name": "kube-scheduler"}]}, "status": {"phase": "Running"}}
        emu.set_pod(hand_made)
        assert wait_until(lambda: len(changes) == seen + 5, 5)
        assert "my-scheduler" not in (index.candidates() or [])
        emu.set_pod({**hand_made, "status": {"phase": "Failed"}})
        assert wait_until(lambda: len(changes) == seen + 6, 5)
        node_agents(emu, 8, 4)
        emu.delete("pods", "my-scheduler", namespace="kube-system")
        assert wait_until(lambda: len(changes) == seen + 8, 5)
    finally:
        index.stop()
    # a view that does not follow the server says so: the verdict then lists the metadata itself
    assert index.candidates() is None
    emu.clear_requests()
    assert collect(api, index=index) == collect(api)
    assert any(METADATA_LIST.split(",")[0] in r.headers.get("accept", "") for r in emu.requests("GET"))


def test_the_gatekeeper_reads_the_verdict_again_when_a_scheduler_pod_changes(emu: KubeEmulatorExt,
                                                                            api: Api) -> None:
    for n in NODES:
        node(emu, n)
        scheduler(emu, n, labelled=True)
    with indexed(api) as gk:
        assert wait_until(lambda: gk.verdict is not None and gk.verdict.ready, 5)
        # a scheduler crash-loops: no Node changes, no resync due; the index's watch alone tells
        scheduler(emu, "cp-2", labelled=True, waiting_reason="CrashLoopBackOff")
        assert wait_until(lambda: gk.verdict is not None and not gk.verdict.ready, 5)
        emu.create(make_pod("app", gates=[DEFAULT_GATE]))  # Pending, as stored: the gatekeeper's watch sees it
        gated = "scheduler_patcher_gatekeeper_gated_pods"
        assert wait_until(lambda: gk.metrics.registry.get_sample_value(gated) == 1, 5)
        assert next_pass(gk)  # a pass that knew the pod and the verdict: it released nothing
        held = emu.get("pods", "app", "default")
        assert held is not None and held["spec"].get("schedulingGates") == [{"name": DEFAULT_GATE}]


def test_the_gatekeeper_watches_by_name_a_node_only_a_scheduler_pod_led_to(emu: KubeEmulatorExt, api: Api) -> None:
    # The seed's corner case made Ready: an agent on the unlabelled node annotates it. No selector watch sees that
    # Node and its scheduler pod does not change; with a long resync, only a watch of that Node by name tells.
    cluster(emu)

    def by_name() -> int:
        return sum(r.query.get("fieldSelector") == "metadata.name=bare-1" and r.query.get("watch") == "true"
                   for r in emu.requests("GET", "/api/v1/nodes"))

    def bare_1_changes() -> bool:  # an event for every watch of bare-1: the emulator drops one closed meanwhile
        node(emu, "bare-1", control_plane=False, ready=False)
        node(emu, "bare-1", control_plane=False, ready=True)
        return emu.open_watches == 4

    with indexed(api) as gk:
        # the pods, the two control-plane selectors, the scheduler index, and bare-1 by name
        assert wait_until(lambda: gk.verdict is not None and by_name() == 1 and emu.open_watches == 5, 5)
        assert gk.verdict is not None and not gk.verdict.ready
        node(emu, "bare-1", control_plane=False, ready=True)
        assert wait_until(lambda: gk.verdict is not None and gk.verdict.ready, 5)
        # the scheduler pod goes (the node left the control plane): the verdict names the node no more, and its
        # watch by name is closed
        emu.delete("pods", "kube-scheduler-bare-1", namespace="kube-system")
        assert wait_until(bare_1_changes, 5)
        assert gk.verdict is not None and "bare-1" not in [r.node for r in gk.verdict.rows]
    assert by_name() == 1  # and not opened again


def test_the_emulator_answers_metadata_only_as_asked(emu: KubeEmulatorExt, api: Api) -> None:
    cluster(emu)
    listed = api.list(POD_RESOURCE, namespace="kube-system", accept=METADATA_LIST)
    assert listed["kind"] == "PartialObjectMetadataList" and listed["apiVersion"] == "meta.k8s.io/v1"
    assert {tuple(sorted(i)) for i in listed["items"]} == {("apiVersion", "kind", "metadata")}
    assert listed["metadata"]["resourceVersion"]
    # a list's form for one object is not served (kube-apiserver answers 406 Not Acceptable)
    status, _ = emu_request(api, f"{PODS}/kube-scheduler-cp-1", METADATA_LIST.split(",")[0])
    assert status == 406


def emu_request(api: Api, path: str, accept: str) -> tuple[int, Any]:
    from kubernetes.client.exceptions import ApiException

    try:
        return 200, api.call("GET", path, accept=accept)
    except ApiException as exc:
        return int(exc.status), exc.body


# --- the same verdict as the whole namespace's list: a property of the pure part ---------------------------

NAMES = st.sampled_from(["kube-scheduler", "etcd", "kube-proxy", "second-scheduler", "kube-scheduler-x"])
HOSTS = st.sampled_from(["a", "b", "c"])


@st.composite
def pods(draw: st.DrawFn) -> list[dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for _ in range(draw(st.integers(0, 12))):
        host = draw(HOSTS)
        name = f"{draw(NAMES)}-{draw(st.sampled_from(['a', 'b', 'c', 'zz']))}"
        owner = draw(st.sampled_from([None, "Node", "ReplicaSet", "DaemonSet"]))
        refs = [] if owner is None else [{"kind": owner, "name": draw(HOSTS) if owner == "Node" else "o",
                                          "controller": draw(st.booleans())}]
        meta: dict[str, Any] = {"name": name, "ownerReferences": refs}
        if draw(st.booleans()):
            meta["labels"] = {"component": "kube-scheduler"}
        spec = {"nodeName": host} if draw(st.booleans()) else {}
        out[name] = {"metadata": meta, "spec": spec}
    return [out[n] for n in sorted(out)]


@settings(max_examples=300, deadline=None)
@given(pods())
def test_the_candidates_and_the_labelled_list_judge_as_the_whole_namespace_did(
        everything: list[dict[str, Any]]) -> None:
    """What a verdict reads now (the labelled pods, and the candidates by name) gives the schedulers the whole
    namespace gave: ``may_be_unlabelled_scheduler`` misses no pod ``scheduler_pods`` counts without its label."""
    labelled = [p for p in everything if (p["metadata"].get("labels") or {}).get("component") == "kube-scheduler"]
    have = {p["metadata"]["name"] for p in labelled}
    read = [p for p in everything
            if may_be_unlabelled_scheduler(p["metadata"]) and p["metadata"]["name"] not in have]
    node_owned = sorted([*labelled, *read], key=lambda p: str(p["metadata"]["name"]))
    assert scheduler_pods(labelled, node_owned) == scheduler_pods(labelled, everything)
