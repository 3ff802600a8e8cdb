"""The gatekeeper against the API emulator: three control-plane nodes, gated pods, two replicas.

The nodes' annotations and mirror pods are set directly, as the agents and kubelets would; pods are created
as the API server stores them (``status.phase: Pending``). Everything else goes through the official client.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from patcher.adapters.kube.backoff import Backoff
from patcher.adapters.kube.client import ClientSettings, build_api_client
from patcher.adapters.kube.cluster import collect
from patcher.adapters.kube.errors import Forbidden, ServerError, TooManyRequests
from patcher.adapters.kube.gaterelease import MAX_THROTTLED, GateOutcome, release_gate
from patcher.adapters.kube.leader import LeaderElector
from patcher.adapters.kube.schedindex import SchedulerIndex
from patcher.adapters.kube.throttle import Throttle
from patcher.adapters.kube.transport import Api
from patcher.commands import gatekeeper
from patcher.commands.gatekeeper import DEFAULT_LEASE
from patcher.core.gates import DEFAULT_GATE, GatedPod, release_patch, slim
from patcher.core.readiness import DEFAULT_MIRROR_SELECTOR
from patcher.services.gatekeeper import Gatekeeper, GateMetrics
from tests.harness.emu.fixtures import emu as emu
from tests.harness.emu.gatekeeping import Observed, next_pass
from tests.harness.emu.kubeemu import KubeEmulator, make_mirror_pod, wait_until
from tests.harness.emu.kubeemu_ext import BEFORE, STARTED, KubeEmulatorExt, make_pod, marker, node_annotations_for

CP = "node-role.kubernetes.io/control-plane"
NODES = ("cp-1", "cp-2", "cp-3")
GATE = DEFAULT_GATE
NS = "scheduler-patcher"
CREATED = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 120))
METRIC = "scheduler_patcher_gatekeeper_"


def client(kubeconfig: Path, agent: str = "gatekeeper-test") -> Api:
    api = build_api_client(ClientSettings(kubeconfig=str(kubeconfig), timeout=(0.5, 2.0)))
    api.default_headers["User-Agent"] = agent  # tells the replicas' requests apart in the emulator's log
    return api


@pytest.fixture
def api(kubeconfig: Path) -> Iterator[Api]:
    c = client(kubeconfig)
    yield c
    c.close()


def node_state(emu: KubeEmulator, node: str, ready: bool) -> None:
    """Play kubelet and agent: a ready node has the restarted mirror pod and says Ready."""
    emu.set_pod(make_mirror_pod(node_name=node, annotations=marker(), started_at=STARTED if ready else BEFORE))
    emu.upsert({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node, "labels": {CP: ""},
                             "annotations": node_annotations_for("Ready" if ready else "WaitingForRestart")}})


def cluster(emu: KubeEmulator, *ready: str) -> None:
    for n in NODES:
        node_state(emu, n, n in ready)


def gates(emu: KubeEmulator, name: str, namespace: str = "default") -> list[str]:
    """The pod's gate names; none stored as no field at all, as the API server does with an emptied list."""
    pod = emu.get("pods", name, namespace)
    assert pod is not None
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def patches(emu: KubeEmulator) -> list[Any]:
    return [r for r in emu.requests("PATCH") if "/pods/" in r.path]


def verdict_reads(emu: KubeEmulator) -> int:
    """Verdicts the emulator served: each lists the labelled kube-scheduler pods once, a list no watch makes (the
    scheduler index lists the namespace without a selector)."""
    return sum(1 for r in emu.requests("GET", "/api/v1/namespaces/kube-system/pods")
               if r.query.get("labelSelector") == DEFAULT_MIRROR_SELECTOR and r.query.get("watch") not in ("true", "1"))


@contextmanager
def running(api: Api, keeper: Callable[..., Observed] = Observed, **kw: Any) -> Iterator[Observed]:
    """A gatekeeper loop in a thread, with quick backoffs; no resync in a test's time: only watches act."""
    gk = keeper(api, verdict_fn=lambda: collect(api), backoff=Backoff(0.05, 0.2), resync_interval=kw.pop(
        "resync_interval", 60.0), **kw)
    stop = threading.Event()
    thread = threading.Thread(target=gk.run, args=(stop,), daemon=True)
    gk.start()
    assert gk.wait_synced(5)
    thread.start()
    try:
        yield gk
    finally:
        stop.set()
        gk.wake()
        thread.join(5)
        gk.stop()
        assert not thread.is_alive()


def metric(gk: Gatekeeper, name: str) -> float:
    return float(gk.metrics.registry.get_sample_value(METRIC + name) or 0.0)


# --- pure parts ---------------------------------------------------------------------------------------


def test_the_patch_tests_the_whole_array_and_keeps_other_gates_in_order() -> None:
    pod = make_pod("p", gates=["a", GATE, "b"])
    assert release_patch(slim(pod), GATE) == [
        {"op": "test", "path": "/spec/schedulingGates", "value": [{"name": "a"}, {"name": GATE}, {"name": "b"}]},
        {"op": "replace", "path": "/spec/schedulingGates", "value": [{"name": "a"}, {"name": "b"}]},
    ]
    assert slim(pod).waits_on(GATE)
    assert not slim(make_pod("p", gates=["a"])).waits_on(GATE)
    assert not slim(make_pod("p", gates=[GATE], phase="Running")).waits_on(GATE)
    deleting = make_pod("p", gates=[GATE])
    deleting["metadata"]["deletionTimestamp"] = CREATED
    assert not slim(deleting).waits_on(GATE)


# --- releasing ----------------------------------------------------------------------------------------


def test_releases_only_its_gate_and_only_once_every_node_is_ready(emu: KubeEmulatorExt, api: Api) -> None:
    cluster(emu, "cp-1", "cp-2")
    emu.create(make_pod("multi", gates=["example.com/a", GATE, "example.com/b"], created=CREATED))
    emu.create(make_pod("only", "team-a", gates=[GATE], created=CREATED))
    emu.create(make_pod("foreign", gates=["example.com/a"]))
    emu.create(make_pod("plain"))
    with running(api) as gk:
        assert wait_until(lambda: metric(gk, "gated_pods") == 2, 5)
        assert next_pass(gk)  # a pass that knew both pods and the verdict: it released nothing
        assert gk.verdict is not None and not gk.verdict.ready
        assert patches(emu) == []
        assert metric(gk, "verdict_ready") == 0
        # The pod watch is one cluster-wide watch of unbound Pending pods: the API server cannot select on gates.
        watches = [r.query for r in emu.requests("GET", "/api/v1/pods") if r.query.get("watch") == "true"]
        assert watches and {q.get("fieldSelector") for q in watches} == {"status.phase=Pending,spec.nodeName="}
        lists = [r.query for r in emu.requests("GET", "/api/v1/pods") if r.query.get("watch") != "true"]
        assert lists and all(q.get("limit") == "100" for q in lists)  # listed in pages

        emu.clear_requests()
        node_state(emu, "cp-3", True)  # the last scheduler comes back with the config
        assert wait_until(lambda: gates(emu, "multi") == ["example.com/a", "example.com/b"]
                          and gates(emu, "only", "team-a") == [], 5)
        assert wait_until(lambda: metric(gk, "gated_pods") == 0, 5)
        assert wait_until(lambda: metric(gk, "pods_released_total") == 2, 5)  # counted once the PATCH answered
        assert metric(gk, "wait_seconds_count") == 2
        assert metric(gk, "wait_seconds_sum") >= 2 * 119  # from the pods' creation, two minutes ago
        assert metric(gk, "verdict_ready") == 1
    assert gates(emu, "foreign") == ["example.com/a"]
    assert gates(emu, "plain") == []  # and not patched (below)
    sent = patches(emu)
    assert sorted(r.path for r in sent) == ["/api/v1/namespaces/default/pods/multi",
                                            "/api/v1/namespaces/team-a/pods/only"]
    assert {r.headers["content-type"] for r in sent} == {"application/json-patch+json"}
    multi = next(r for r in sent if r.path.endswith("/multi")).json()
    assert [op["op"] for op in multi] == ["test", "replace"]


def test_pods_created_later_are_released_and_nothing_while_the_verdict_is_not_ready(
        emu: KubeEmulatorExt, api: Api) -> None:
    cluster(emu, *NODES)
    with running(api) as gk:
        assert wait_until(lambda: gk.verdict is not None and gk.verdict.ready, 5)
        emu.create(make_pod("late", gates=[GATE, "example.com/b"]))
        assert wait_until(lambda: gates(emu, "late") == ["example.com/b"], 5)

        node_state(emu, "cp-2", False)  # a node rolls over to a new config (or back)
        assert wait_until(lambda: gk.verdict is not None and not gk.verdict.ready, 5)
        emu.create(make_pod("later", gates=[GATE]))
        assert wait_until(lambda: metric(gk, "gated_pods") == 1, 5)
        assert next_pass(gk)  # a pass that knew the pod and the verdict: it released nothing
        assert gates(emu, "later") == [GATE]
        assert gates(emu, "late") == ["example.com/b"]  # released pods stay released: gates cannot be added

        node_state(emu, "cp-2", True)
        assert wait_until(lambda: gates(emu, "later") == [], 5)
        emu.delete("pods", "later", "default")
        emu.create(make_pod("gone", gates=[GATE]))
        assert wait_until(lambda: gates(emu, "gone") == [], 5)
        assert wait_until(lambda: metric(gk, "pods_released_total") == 3, 5)  # counted once the PATCH answered


def test_node_updates_that_do_not_touch_our_annotations_cost_nothing(emu: KubeEmulatorExt,
                                                                     api: Api) -> None:
    cluster(emu, *NODES)
    with running(api) as gk:
        assert wait_until(lambda: gk.verdict is not None and gk.verdict.ready, 5)
        assert next_pass(gk)  # whatever the first passes read is read before the count starts
        emu.clear_requests()
        delivered = gk.node_events

        def heartbeat(node: dict[str, Any]) -> None:
            node.setdefault("status", {})["conditions"] = [{"type": "Ready", "status": "True",
                                                            "lastHeartbeatTime": time.strftime("%H:%M:%S")}]

        for n in NODES:
            emu.mutate("nodes", n, heartbeat)
        assert wait_until(lambda: gk.node_events >= delivered + len(NODES), 5)  # the watch delivered them
        assert next_pass(gk)  # and a pass after them: a stale verdict would have been read in it
        reads = [r for r in emu.requests("GET") if r.query.get("watch") != "true"]
        assert reads == []  # no verdict was re-evaluated
        node_state(emu, "cp-1", False)
        assert wait_until(lambda: gk.verdict is not None and not gk.verdict.ready, 5)


def test_a_concurrent_change_of_the_gates_makes_it_read_again_and_retry(emu: KubeEmulatorExt,
                                                                       api: Api) -> None:
    cluster(emu, *NODES)
    emu.create(make_pod("raced", gates=["example.com/a", GATE, "example.com/b"]))
    emu.create(make_pod("conflict", gates=[GATE, "example.com/c"]))
    raced = "/api/v1/namespaces/default/pods/raced"
    conflict = "/api/v1/namespaces/default/pods/conflict"

    def other_controller(e: KubeEmulator) -> None:  # removes its own gate between our read and our patch
        e.mutate("pods", "raced", lambda p: p["spec"].update(
            schedulingGates=[g for g in p["spec"]["schedulingGates"] if g["name"] != "example.com/a"]),
            namespace="default")

    emu.before("PATCH", raced, other_controller)
    emu.fail("PATCH", conflict, 409)
    with running(api) as gk:
        assert wait_until(lambda: gates(emu, "raced") == ["example.com/b"] and gates(emu, "conflict") ==
                          ["example.com/c"], 5)
        assert metric(gk, "patch_conflicts_total") == 2
        assert wait_until(lambda: metric(gk, "pods_released_total") == 2, 5)  # counted once the PATCH answered
    assert [r.status for r in emu.requests("PATCH", raced)] == [422, 200]
    assert [r.status for r in emu.requests("PATCH", conflict)] == [409, 200]
    second = emu.requests("PATCH", raced)[1].json()
    assert second[0]["value"] == [{"name": GATE}, {"name": "example.com/b"}]  # rebuilt from the pod read again
    assert len(emu.requests("GET", raced)) == 1 and len(emu.requests("GET", conflict)) == 1  # read again, once


class LaggingPodWatch(Observed):
    """A gatekeeper whose pod watch is behind its releases, as a drain's watch is on a busy server: the events
    of pod ``held`` wait in ``late`` until the test delivers them, in order."""

    def __init__(self, api: Api, held: str, **kw: Any) -> None:
        self.held = held
        self.late: list[tuple[str, GatedPod]] = []
        self._late_lock = threading.Lock()
        super().__init__(api, **kw)

    def _pod_event(self, kind: str, pod: GatedPod) -> None:
        if pod.name == self.held:
            with self._late_lock:
                self.late.append((kind, pod))
            return
        super()._pod_event(kind, pod)

    def deliver(self, which: Callable[[GatedPod], bool]) -> int:
        """Deliver the held events, from the first, while ``which`` holds for their pod; how many."""
        with self._late_lock:
            count = next((i for i, (_, pod) in enumerate(self.late) if not which(pod)), len(self.late))
            due, self.late[:count] = self.late[:count], []
        for kind, pod in due:
            super()._pod_event(kind, pod)
        return count


def test_an_event_from_before_the_release_does_not_release_the_pod_again(emu: KubeEmulatorExt, api: Api) -> None:
    """Another controller changes the pod between our read and our patch; the watch brings that change only after
    the gate is gone. The API server refuses a gate added after creation, so the event showing ours is a late
    one: no second release (its PATCH would be refused, the pod read again, a conflict counted that is none)."""
    cluster(emu, *NODES)
    emu.create(make_pod("raced", gates=["example.com/a", GATE, "example.com/b"]))
    raced = "/api/v1/namespaces/default/pods/raced"
    emu.before("PATCH", raced, lambda e: e.mutate("pods", "raced", lambda p: p["spec"].update(
        schedulingGates=[g for g in p["spec"]["schedulingGates"] if g["name"] != "example.com/a"]),
        namespace="default"))
    with running(api, keeper=lambda api, **kw: LaggingPodWatch(api, "raced", **kw)) as gk:
        assert isinstance(gk, LaggingPodWatch)
        assert wait_until(lambda: gates(emu, "raced") == ["example.com/b"], 5)
        assert wait_until(lambda: any(not pod.waits_on(GATE) for _, pod in gk.late), 5)  # the release's event
        assert gk.deliver(lambda pod: pod.waits_on(GATE)) >= 1  # the other controller's change, late
        assert next_pass(gk)
        assert [r.status for r in emu.requests("PATCH", raced)] == [422, 200]
        assert gk.waiting() == [] and metric(gk, "patch_conflicts_total") == 1
        gk.deliver(lambda pod: True)  # the watch catches up
        assert next_pass(gk)
    assert [r.status for r in emu.requests("PATCH", raced)] == [422, 200]
    assert len(emu.requests("GET", raced)) == 1


def test_an_api_failure_on_release_is_retried_later(emu: KubeEmulatorExt, api: Api) -> None:
    cluster(emu, *NODES)
    emu.create(make_pod("p", gates=[GATE]))
    path = "/api/v1/namespaces/default/pods/p"
    emu.fail("PATCH", path, 503, times=2)
    with running(api):
        assert wait_until(lambda: gates(emu, "p") == [], 5)
    assert [r.status for r in emu.requests("PATCH", path)] == [503, 503, 200]


# --- release_gate, the adapter: one pod, by what the API answers ---------------------------------------


def stored(emu: KubeEmulator, name: str) -> dict[str, Any]:
    pod = emu.get("pods", name, "default")
    assert pod is not None
    return pod


def test_release_gate_a_pod_deleted_meanwhile_no_longer_waits(emu: KubeEmulatorExt, api: Api) -> None:
    emu.create(make_pod("p", gates=[GATE]))
    pod = stored(emu, "p")
    emu.delete("pods", "p", "default")
    conflicts: list[None] = []
    result = release_gate(api, pod, GATE, attempts=3, on_conflict=lambda: conflicts.append(None))
    assert result.outcome is GateOutcome.NOT_WAITING and conflicts == []
    assert [r.status for r in emu.requests("PATCH", "/api/v1/namespaces/default/pods/p")] == [404]


def test_release_gate_gives_up_on_a_pod_that_keeps_changing(emu: KubeEmulatorExt, api: Api) -> None:
    emu.create(make_pod("p", gates=[GATE]))
    path = "/api/v1/namespaces/default/pods/p"
    emu.fail("PATCH", path, 409, times=3)
    conflicts: list[None] = []
    result = release_gate(api, stored(emu, "p"), GATE, attempts=3,
                          on_conflict=lambda: conflicts.append(None))
    assert result.outcome is GateOutcome.KEPT_CHANGING and len(conflicts) == 3
    assert len(emu.requests("GET", path)) == 3 and gates(emu, "p") == [GATE]
    again = release_gate(api, result.pod, GATE, attempts=3)  # a later pass
    assert again.outcome is GateOutcome.RELEASED and gates(emu, "p") == []


def test_release_gate_raises_the_failure_of_the_read_again_by_its_class(emu: KubeEmulatorExt,
                                                                          api: Api) -> None:
    emu.create(make_pod("p", gates=[GATE]))
    path = "/api/v1/namespaces/default/pods/p"
    emu.fail("PATCH", path, 422)
    emu.fail("GET", path, 503)
    conflicts: list[None] = []
    with pytest.raises(ServerError, match=r"^cannot read pod default/p: HTTP 503"):
        release_gate(api, stored(emu, "p"), GATE, attempts=3,
                     on_conflict=lambda: conflicts.append(None))
    assert len(conflicts) == 1  # counted although the pass then failed
    emu.fail("PATCH", path, 403)
    with pytest.raises(Forbidden, match=r"^cannot release pod default/p: HTTP 403"):
        release_gate(api, stored(emu, "p"), GATE, attempts=3)
    assert gates(emu, "p") == [GATE]


# --- the command, namespaces, leader election ---------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(url: str) -> str:
    """The /metrics text, or "" while the server does not answer yet."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=2) as resp:
            return str(resp.read().decode())
    except OSError:
        return ""


def test_the_command_watches_only_its_namespaces_holds_the_lease_and_serves_metrics(
        emu: KubeEmulatorExt, kubeconfig: Path) -> None:
    cluster(emu, *NODES)
    for ns in ("a", "b", "c"):
        emu.create(make_pod("p", ns, gates=[GATE]))
    parser = argparse.ArgumentParser()
    gatekeeper.add_arguments(parser)
    port = free_port()
    args = parser.parse_args(["--kubeconfig", str(kubeconfig), "--namespaces", "a, b", "--namespace", NS,
                              "--identity", "gk-0", "--listen", f"127.0.0.1:{port}", "--retry-period", "0.2s"])
    stop = threading.Event()
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(gatekeeper.run(args, stop)), daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: gates(emu, "p", "a") == [] and gates(emu, "p", "b") == [], 10)
        url = f"http://127.0.0.1:{port}"
        # The drain that released them is over once no gated pod is left to it: had it known the pod in c, that
        # one would be released by then too (or still counted).
        assert wait_until(lambda: f"{METRIC}gated_pods 0.0" in scrape(url), 5)
        assert gates(emu, "p", "c") == [GATE]
        lease = emu.get("leases", "scheduler-patcher-gatekeeper", NS, group="coordination.k8s.io")
        assert lease is not None and lease["spec"]["holderIdentity"] == "gk-0"
        assert lease["spec"]["leaseDurationSeconds"] == 15
        body = scrape(url)
        assert f"{METRIC}pods_released_total 2.0" in body and f"{METRIC}leader 1.0" in body
        assert urllib.request.urlopen(url + "/healthz", timeout=2).status == 200
    finally:
        stop.set()
        thread.join(5)
    assert result == [0]
    watched = {r.path for r in emu.requests("GET") if r.query.get("watch") == "true" and "/pods" in r.path
               and "PartialObjectMetadata" not in r.headers.get("accept", "")}
    assert watched == {"/api/v1/namespaces/a/pods", "/api/v1/namespaces/b/pods"}
    # and the scheduler index's metadata-only watch of kube-system (the unlabelled kube-schedulers)
    assert {r.path for r in emu.requests("GET") if r.query.get("watch") == "true"
            and "PartialObjectMetadata" in r.headers.get("accept", "")} == {"/api/v1/namespaces/kube-system/pods"}
    lease = emu.get("leases", "scheduler-patcher-gatekeeper", NS, group="coordination.k8s.io")
    assert lease is not None and not lease["spec"].get("holderIdentity")  # handed back on the way out


def elector(api: Api, identity: str, on_change: Callable[[bool], None] | None = None, *,
            renew_period: float | None = None) -> LeaderElector:
    return LeaderElector(api, namespace=NS, name=DEFAULT_LEASE, identity=identity, lease_duration=1.5,
                         renew_deadline=1.0, retry_period=0.1, renew_period=renew_period, on_change=on_change)


def test_of_two_gatekeepers_only_the_leader_releases(emu: KubeEmulatorExt, kubeconfig: Path) -> None:
    cluster(emu, *NODES)
    for i in range(4):
        emu.create(make_pod(f"p{i}", gates=[GATE]))
    apis = [client(kubeconfig, "gk-a"), client(kubeconfig, "gk-b")]
    gks: list[Gatekeeper] = []

    def waker(i: int) -> Callable[[bool], None]:
        def wake(_leading: bool) -> None:
            if len(gks) > i:
                gks[i].wake()
        return wake

    electors = [elector(a, name, waker(i)) for i, (a, name) in enumerate(zip(apis, ("gk-a", "gk-b"), strict=True))]
    try:
        with running(apis[0], elector=electors[0]) as gk_a, running(apis[1], elector=electors[1]) as gk_b:
            gks += [gk_a, gk_b]
            for e in electors:
                e.start()
            assert wait_until(lambda: all(gates(emu, f"p{i}") == [] for i in range(4)), 5)
            leaders = [e for e in electors if e.is_leader()]
            assert len(leaders) == 1
            leader = leaders[0]
            standby = next(e for e in electors if e is not leader)
            assert {r.headers["user-agent"] for r in patches(emu)} == {leader.identity}
            assert wait_until(lambda: standby.holder == leader.identity, 2)  # it saw who leads

            leader.stop(release=True)  # a rolling update: the old replica hands the Lease over
            assert wait_until(standby.is_leader, 3)
            emu.create(make_pod("after", gates=[GATE]))
            assert wait_until(lambda: gates(emu, "after") == [], 5)
            after = [r for r in patches(emu) if r.path.endswith("/after")]
            assert {r.headers["user-agent"] for r in after} == {standby.identity}
            assert metric(gks[electors.index(leader)], "leader") == 0
    finally:
        for e in electors:
            e.stop(release=False)
        for a in apis:
            a.close()


def test_the_leader_renews_with_one_write_a_period_and_reads_after_a_conflict(emu: KubeEmulatorExt,
                                                                            api: Api) -> None:
    # client-go's leader renews so: its last write's resourceVersion makes the update a CAS, so no read is
    # needed while nobody else writes the Lease (an idle install's requests).
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{DEFAULT_LEASE}"
    e = elector(api, "gk-1")
    e.start()
    try:
        assert wait_until(e.is_leader, 3)
        emu.clear_requests()
        assert wait_until(lambda: len(emu.requests("PUT", lease_path)) >= 5, 5)
        assert emu.requests("GET", lease_path) == [] and e.is_leader()
        # another writer (an operator's annotation): the next renewal conflicts, reads, and renews
        emu.mutate("leases", DEFAULT_LEASE, lambda lease: {**lease, "metadata": {
            **lease["metadata"], "annotations": {"example.com/note": "x"}}}, NS, group="coordination.k8s.io")
        assert wait_until(lambda: len(emu.requests("GET", lease_path)) >= 1, 5)
        puts = len(emu.requests("PUT", lease_path))
        assert wait_until(lambda: len(emu.requests("PUT", lease_path)) >= puts + 3, 5)
        assert e.is_leader() and emu.count("PUT", 409) >= 1
        held = emu.get("leases", DEFAULT_LEASE, NS, group="coordination.k8s.io")
        assert held is not None and held["metadata"]["annotations"] == {"example.com/note": "x"}
        assert held["spec"]["holderIdentity"] == "gk-1"
    finally:
        e.stop()


def test_the_leader_renews_every_renew_period_not_every_retry_period(emu: KubeEmulatorExt, api: Api) -> None:
    # An idle install's requests: a renewal every retry period (client-go's 2 s) is 30 writes a minute.
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{DEFAULT_LEASE}"
    e = elector(api, "gk-1", renew_period=0.3)
    e.start()
    try:
        assert wait_until(e.is_leader, 3)
        emu.clear_requests()
        started = time.monotonic()
        assert wait_until(lambda: len(emu.requests("PUT", lease_path)) >= 4, 10)
        # four renewals are at least three renew periods apart (a lower bound: a busy machine only adds to it)
        assert time.monotonic() - started >= 3 * 0.3
        assert e.is_leader()
    finally:
        e.stop()
    with pytest.raises(ValueError, match="retry period <= renew period < renew deadline"):
        elector(api, "gk-2", renew_period=1.0)


def test_a_standby_that_watches_the_lease_sends_nothing_while_the_leader_renews(emu: KubeEmulatorExt,
                                                                               kubeconfig: Path) -> None:
    apis = [client(kubeconfig, "gk-a"), client(kubeconfig, "gk-b")]
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{DEFAULT_LEASE}"
    leader = elector(apis[0], "gk-a")
    standby = elector(apis[1], "gk-b")

    def standby_requests() -> list[object]:
        return [r for r in emu.requests(None, lease_path) if r.headers.get("user-agent") == "gk-b"]

    try:
        leader.start()
        assert wait_until(leader.is_leader, 5)
        standby.start()
        assert wait_until(lambda: standby.holder == "gk-a", 5)
        assert wait_until(lambda: standby._watcher.fresh, 5)
        emu.clear_requests()
        # the leader renews five more times, each a change the standby's watch delivers, and each restarts its
        # count of the lease duration (1.5 s, longer than a renewal period): it never reads the Lease
        assert wait_until(lambda: len(emu.requests("PUT", lease_path)) >= 5, 10)
        assert not standby.is_leader()
        assert standby_requests() == []
        # a rolling update: the leader hands the Lease back, the standby sees it on the watch and takes it
        leader.stop(release=True)
        assert wait_until(standby.is_leader, 3)
        assert len(standby_requests()) <= 2
    finally:
        leader.stop(release=False)
        standby.stop(release=False)
        for a in apis:
            a.close()


def test_a_watching_standby_takes_over_a_crashed_leaders_lease_after_its_duration(emu: KubeEmulatorExt,
                                                                                 kubeconfig: Path) -> None:
    apis = [client(kubeconfig, "gk-a"), client(kubeconfig, "gk-b")]
    leader = elector(apis[0], "gk-a")
    standby = elector(apis[1], "gk-b")
    try:
        leader.start()
        assert wait_until(leader.is_leader, 5)
        standby.start()
        assert wait_until(lambda: standby.holder == "gk-a", 5)
        leader.stop(release=False)  # a crash: the Lease stays as its last renewal left it
        crashed = time.monotonic()
        assert wait_until(standby.is_leader, 10)
        assert time.monotonic() - crashed >= 1.5 - 0.3 - 0.1  # its duration since the last renewal it saw
        spec = (emu.get("leases", DEFAULT_LEASE, NS, group="coordination.k8s.io") or {})["spec"]
        assert spec["holderIdentity"] == "gk-b"
    finally:
        standby.stop(release=False)
        for a in apis:
            a.close()


def test_a_lease_left_by_a_dead_replica_is_taken_over_after_its_duration(emu: KubeEmulatorExt,
                                                                        api: Api) -> None:
    # The dead holder's renewTime lies in the future (a skewed clock): only our own clock counts.
    emu.create({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "scheduler-patcher-gatekeeper", "namespace": NS},
                "spec": {"holderIdentity": "dead", "leaseDurationSeconds": 1, "leaseTransitions": 4,
                         "renewTime": "2099-01-01T00:00:00.000000Z"}})
    e = elector(api, "gk-new")
    started = time.monotonic()
    e.start()
    try:
        assert wait_until(e.is_leader, 5)
        assert time.monotonic() - started >= 0.9
        spec = (emu.get("leases", "scheduler-patcher-gatekeeper", NS, group="coordination.k8s.io") or {})["spec"]
        assert spec["holderIdentity"] == "gk-new" and spec["leaseTransitions"] == 5
        assert spec["leaseDurationSeconds"] == 2  # 1.5 s, rounded up
    finally:
        e.stop()


def test_a_leader_that_cannot_renew_stops_acting_before_its_lease_expires(emu: KubeEmulatorExt,
                                                                         api: Api) -> None:
    e = elector(api, "gk-1")
    e.start()
    try:
        assert wait_until(e.is_leader, 3)
        emu.go_down("503")
        lost_at = time.monotonic()  # no renewal attempted after this can succeed
        # Leadership is judged on the clock, not by the renew thread: once the renew deadline (1.0 s, less than
        # the lease duration 1.5 s) has passed since the outage began, it is over however busy the machine is.
        assert wait_until(lambda: time.monotonic() >= lost_at + 1.0, 10)
        assert not e.is_leader()
    finally:
        emu.come_up()
        e.stop()


def test_metrics_registry_is_private() -> None:
    a, b = GateMetrics(), GateMetrics()
    a.released(3.0)
    released = METRIC + "pods_released_total"
    assert a.registry.get_sample_value(released) == 1 and b.registry.get_sample_value(released) == 0
    assert b"scheduler_patcher_gatekeeper_wait_seconds_bucket" in a.render()


# --- a backlog: parallel, throttled, oldest first, stopped by the verdict ------------------------------


def backlog(emu: KubeEmulatorExt, count: int) -> list[str]:
    """``count`` gated pods, created a second apart, oldest first (names sort the other way on purpose)."""
    names = []
    for i in range(count):
        name = f"z{count - i:03d}"
        emu.create(make_pod(name, gates=[GATE], created=time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600 + i))))
        names.append(name)
    return names


def released(emu: KubeEmulator, names: list[str]) -> list[str]:
    return [n for n in names if gates(emu, n) == []]


def test_a_backlog_is_released_by_a_bounded_pool_oldest_first(emu: KubeEmulatorExt, api: Api) -> None:
    cluster(emu, *NODES)
    names = backlog(emu, 24)
    emu.latency = 0.05  # a remote API server: requests that overlap show as more than one in flight
    with running(api, concurrency=3, batch_size=6) as gk:
        assert wait_until(lambda: released(emu, names) == names, 20)
        assert wait_until(lambda: metric(gk, "pods_released_total") == 24, 5)
        # counted when the drain ends, which is after its last PATCH is answered
        assert wait_until(lambda: metric(gk, "release_batches_total") == 4, 5)
    order = [r.path.rsplit("/", 1)[1] for r in patches(emu)]
    assert sorted(order) == sorted(names)
    # Oldest first: a worker takes the next pod only once its last is answered, so when the k-th oldest goes,
    # at most two others are in flight and every pod older than those three has been answered.
    answered = {name: i for i, name in enumerate(order)}
    assert all(answered[names[j]] < answered[names[k]] for k in range(24) for j in range(k - 2))
    assert 2 <= emu.peak_in_flight <= 3 + 1  # in parallel, never more than the pool (+1: a verdict read)


def test_a_slow_release_does_not_hold_back_the_next_batch(emu: KubeEmulatorExt, kubeconfig: Path) -> None:
    cluster(emu, *NODES)
    names = backlog(emu, 12)
    # The oldest pod's PATCH is answered only once the other worker has reached the third batch: with a barrier
    # at the end of each batch it never would (the hook would give up after 10 s and the test fail). The client
    # waits longer than that for an answer: a timed-out PATCH would end the batch too.
    overtaken = threading.Event()

    def slow(e: KubeEmulator) -> None:
        if wait_until(lambda: any(r.path.endswith(f"/{names[8]}") for r in patches(e)), 10):
            overtaken.set()

    emu.before("PATCH", f"/api/v1/namespaces/default/pods/{names[0]}", slow)
    patient = build_api_client(ClientSettings(kubeconfig=str(kubeconfig), timeout=(0.5, 30.0)))
    try:
        with running(patient, concurrency=2, batch_size=4) as gk:
            assert wait_until(lambda: released(emu, names) == names, 20)
            assert overtaken.is_set()
            assert wait_until(lambda: metric(gk, "release_batches_total") == 3, 5)
    finally:
        patient.close()
    order = [r.path.rsplit("/", 1)[1] for r in patches(emu)]
    assert order.index(names[0]) >= 8 and sorted(order) == sorted(names)  # each pod patched once


def roll_back_during(emu: KubeEmulatorExt, names: list[str], at: int, gk: list[Observed]) -> list[int]:
    """While ``names[at]`` is being released, a node rolls back; that PATCH, and any of a younger pod, is
    answered only once the gatekeeper has learned it (its Node watch delivered the change). The list gets how
    many PATCHes were answered by then (``at``: the older pods): what is answered after it was in flight when
    the change was delivered."""
    answered: list[int] = []
    learned = threading.Event()

    def roll_back(e: KubeEmulator) -> None:
        seen = gk[0].node_events
        node_state(e, "cp-2", False)
        if wait_until(lambda: gk[0].node_events > seen, 10):
            answered.append(len(patches(e)))
        learned.set()

    emu.before("PATCH", f"/api/v1/namespaces/default/pods/{names[at]}", roll_back)
    for name in names[at + 1:]:
        emu.before("PATCH", f"/api/v1/namespaces/default/pods/{name}", lambda _: learned.wait(10))
    return answered


def assert_stopped_with_the_pool(emu: KubeEmulator, names: list[str], at: int, answered: list[int],
                                 pool: int) -> None:
    """Released: the oldest pods up to and past ``names[at]``; after the delivery, at most ``pool`` (the
    releases in flight), though the batch goes on further (and the younger pods' PATCHes were held until the
    delivery, so the workers could not have run ahead of it); nothing patched that stayed gated."""
    assert answered, "the watch did not deliver the change"
    done = released(emu, names)
    assert done == names[:len(done)] and names[at] in done  # oldest first: every pod taken was released
    assert len(done) - answered[0] <= pool
    assert len(patches(emu)) == len(done)


def test_a_verdict_that_turns_not_ready_mid_drain_stops_it_with_only_the_releases_in_flight(
        emu: KubeEmulatorExt, api: Api) -> None:
    cluster(emu, *NODES)
    names = backlog(emu, 40)
    keeper: list[Observed] = []
    answered = roll_back_during(emu, names, 5, keeper)  # in the first batch of twelve
    with running(api, concurrency=3, batch_size=12) as gk:
        keeper.append(gk)
        assert wait_until(lambda: metric(gk, "release_batches_total") > 0, 10)  # counted when the drain ends
        assert gk.verdict is not None and not gk.verdict.ready
        assert_stopped_with_the_pool(emu, names, 5, answered, 3)
        node_state(emu, "cp-2", True)
        assert wait_until(lambda: released(emu, names) == names, 10)


def test_a_429_pauses_the_whole_pool_for_retry_after_and_the_pod_is_sent_again(emu: KubeEmulatorExt,
                                                                               api: Api) -> None:
    cluster(emu, *NODES)
    names = backlog(emu, 6)
    emu.fail("PATCH", None, 429, retry_after=7)  # API Priority and Fairness: the queue is full, come back in 7 s
    slept: list[float] = []
    now = [1000.0]
    lock = threading.Lock()

    def sleep(seconds: float) -> None:  # no real sleep: a fake clock, and a record of what the pool waited
        with lock:
            slept.append(seconds)
            now[0] += seconds

    throttle = Throttle(1000.0, 4, clock=lambda: now[0], sleep=sleep)
    with running(api, concurrency=2, throttle=throttle) as gk:
        assert wait_until(lambda: released(emu, names) == names, 10)
        assert metric(gk, "throttled_total") == 1
    assert sum(slept) >= 7.0  # the one 429 (counted just above) held the pool for its Retry-After
    statuses = [r.status for r in patches(emu)]
    assert statuses.count(429) == 1 and statuses.count(200) == 6
    assert metric(gk, "pods_released_total") == 6


def test_release_gate_raises_too_many_requests_after_riding_out_max_throttled(emu: KubeEmulatorExt,
                                                                               api: Api) -> None:
    emu.create(make_pod("p", gates=[GATE]))
    path = "/api/v1/namespaces/default/pods/p"
    emu.fail("PATCH", path, 429, times=MAX_THROTTLED + 1, retry_after=0)
    with pytest.raises(TooManyRequests, match=r"^cannot release pod default/p: HTTP 429") as info:
        release_gate(api, stored(emu, "p"), GATE, attempts=3)
    assert info.value.retry_after == 0.0
    assert len(emu.requests("PATCH", path)) == MAX_THROTTLED + 1 and gates(emu, "p") == [GATE]
    assert release_gate(api, stored(emu, "p"), GATE, attempts=3).outcome is GateOutcome.RELEASED


def test_the_cache_keeps_a_slim_view_of_each_gated_pod(emu: KubeEmulatorExt, api: Api) -> None:
    cluster(emu, "cp-1")
    pod = make_pod("fat", gates=["example.com/a", GATE], created=CREATED)
    pod["spec"]["containers"][0]["env"] = [{"name": f"V{i}", "value": "x" * 100} for i in range(50)]
    stored_pod = emu.create(pod)
    emu.create(make_pod("bound", gates=[GATE]) | {"spec": {"nodeName": "w-1", "containers": [],
                                                           "schedulingGates": [{"name": GATE}]}})
    with running(api) as gk:
        assert wait_until(lambda: len(gk.waiting()) == 1, 5)
        assert gk.waiting() == [GatedPod("default", "fat", stored_pod["metadata"]["uid"], CREATED,
                                         ("example.com/a", GATE), True)]


def test_a_pod_whose_gate_another_controller_removed_leaves_the_cache(emu: KubeEmulatorExt,
                                                                      api: Api) -> None:
    cluster(emu, "cp-1")  # not Ready: the gatekeeper itself releases nothing
    emu.create(make_pod("mine", gates=["example.com/a", GATE], created=CREATED))
    emu.create(make_pod("other", gates=["example.com/a"], created=CREATED))
    with running(api) as gk:
        assert [p.name for p in gk.waiting()] == ["mine"]
        emu.mutate("pods", "mine", lambda p: p["spec"].update(schedulingGates=[{"name": "example.com/a"}]),
                   "default")
        assert wait_until(lambda: gk.waiting() == [], 5)
        # ... and comes back when the gate does (the full decode of a line that carries it)
        emu.mutate("pods", "mine", lambda p: p["spec"].update(schedulingGates=[{"name": GATE}]), "default")
        assert wait_until(lambda: [(p.name, p.gates) for p in gk.waiting()] == [("mine", (GATE,))], 5)
    assert not patches(emu)


@pytest.mark.parametrize(("argv", "problem"), [
    (["--renew-deadline", "20s"], "--retry-period 2s, --renew-period 10s, --renew-deadline 20s, --lease-duration "
                                  "15s: leader election needs 0 < retry period <= renew period < renew deadline < "
                                  "lease duration"),
    (["--renew-period", "1s"], "--retry-period 2s, --renew-period 1s, --renew-deadline 10s, --lease-duration 15s: "
                               "leader election needs 0 < retry period <= renew period < renew deadline < lease "
                               "duration"),
    (["--renew-period", "10s"], "--retry-period 2s, --renew-period 10s, --renew-deadline 10s, --lease-duration 15s: "
                                "leader election needs 0 < retry period <= renew period < renew deadline < lease "
                                "duration"),
    (["--webhook-listen", ":8443"], "--webhook-listen needs --webhook-cert and --webhook-key"),
    (["--webhook-verdict-configmap", "ns/"], "--webhook-verdict-configmap: no name in 'ns/'"),
    (["--gate-name", ""], "--gate-name: the gate name must not be empty"),
])
def test_flags_that_cannot_work_together_are_a_usage_error(argv: list[str], problem: str, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    gatekeeper.add_arguments(parser)
    args = parser.parse_args(["--kubeconfig", str(tmp_path / "never-read"), *argv])
    assert gatekeeper.usage_problems(args) == [problem]
    assert gatekeeper.run(args, threading.Event()) == 64  # before any client is built: the kubeconfig is not read


# --- the verdict between two batches: read again only when a watch says it may have changed ---------------


@contextmanager
def stepped(api: Api, pods: int, index_backoff: Backoff | None = None, **kw: Any) -> Iterator[Observed]:
    """A gatekeeper with its scheduler index, every watch behind the verdict open and ``pods`` gated pods
    cached; no loop: the test calls ``step()`` (one pass, the whole drain) on its own thread. The verdict's
    reads are counted by the emulator (``verdict_reads``)."""
    keeper: list[Gatekeeper] = []
    index = SchedulerIndex(api, on_change=lambda: keeper[0].schedulers_changed() if keeper else None,
                           backoff=index_backoff or Backoff(0.05, 0.2))
    gk = Observed(api, verdict_fn=lambda: collect(api, index=index), backoff=Backoff(0.05, 0.2),
                  scheduler_index=index, **kw)
    keeper.append(gk)
    gk.start()
    try:
        assert gk.wait_synced(5)
        assert wait_until(lambda: gk.verdict_watches()[0] and len(gk.waiting()) == pods, 5)
        yield gk
    finally:
        gk.stop()


def test_a_drain_without_watch_events_reads_the_verdict_once(emu: KubeEmulatorExt, api: Api) -> None:
    cluster(emu, *NODES)
    names = backlog(emu, 24)
    with stepped(api, 24, concurrency=2, batch_size=4) as gk:
        gk.step()
        assert released(emu, names) == names
        assert metric(gk, "release_batches_total") == 6
        assert verdict_reads(emu) == 1  # six batches, the one read at the start of the pass
        assert gk.verdict is not None and gk.verdict.ready


def test_a_change_delivered_mid_drain_that_turns_it_not_ready_stops_it_with_only_the_releases_in_flight(
        emu: KubeEmulatorExt, api: Api) -> None:
    cluster(emu, *NODES)
    names = backlog(emu, 24)
    with stepped(api, 24, concurrency=3, batch_size=12) as gk:
        answered = roll_back_during(emu, names, 5, [gk])
        gk.step()
        assert_stopped_with_the_pool(emu, names, 5, answered, 3)
        assert verdict_reads(emu) == 2  # the start of the pass, and before the first pod after the delivery
        assert gk.verdict is not None and not gk.verdict.ready
        assert metric(gk, "release_batches_total") == 1


def test_a_watch_that_drops_mid_drain_makes_the_next_batch_read_the_verdict_again(emu: KubeEmulatorExt,
                                                                                  api: Api) -> None:
    cluster(emu, *NODES)
    names = backlog(emu, 24)
    with stepped(api, 24, concurrency=2, batch_size=4) as gk:
        drops = gk.verdict_watches()[1]

        def drop(e: KubeEmulator) -> None:  # the second batch: every watch is cut, then resumes
            e.drop_watches()
            assert wait_until(lambda: gk.verdict_watches()[1] > drops and gk.verdict_watches()[0], 5)

        emu.before("PATCH", f"/api/v1/namespaces/default/pods/{names[5]}", drop)
        gk.step()
        assert released(emu, names) == names  # nothing changed: the verdict read again is still Ready
        # The drop forced a read before the third batch; a watch that relisted (its events may be lost) or was
        # still down at the next batches forces more. Without the drop: one read (the test above).
        assert verdict_reads(emu) >= 2


def test_a_watch_that_is_down_makes_every_batch_read_the_verdict(emu: KubeEmulatorExt, api: Api) -> None:
    cluster(emu, *NODES)
    names = backlog(emu, 24)
    # The scheduler index waits a minute before it watches again: it stays down through the whole drain.
    with stepped(api, 24, concurrency=2, batch_size=4, index_backoff=Backoff(60.0, 60.0)) as gk:
        emu.drop_watches()
        assert wait_until(lambda: not gk.verdict_watches()[0], 5)
        gk.step()
        assert released(emu, names) == names
        assert not gk.verdict_watches()[0]
        assert verdict_reads(emu) == 6  # no watch to tell: a read before every batch, as without the watches


def test_a_resync_that_comes_due_mid_drain_reads_the_verdict_again(emu: KubeEmulatorExt, api: Api) -> None:
    cluster(emu, *NODES)
    names = backlog(emu, 24)
    now = [1000.0]
    emu.before("PATCH", f"/api/v1/namespaces/default/pods/{names[5]}", lambda e: now.__setitem__(0, 1000.0 + 61))
    with stepped(api, 24, concurrency=2, batch_size=4, resync_interval=60.0, clock=lambda: now[0]) as gk:
        gk.step()
        assert released(emu, names) == names
        assert verdict_reads(emu) == 2  # the start of the pass, and the resync that came due during the second batch
