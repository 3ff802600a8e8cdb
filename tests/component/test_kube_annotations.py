"""NodeReporter against the emulator: one merge patch per change, outages absorbed, latest state wins, events."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from patcher.adapters.kube.backoff import DENIED_QUICK_RETRIES, Backoff
from patcher.adapters.kube.publish import MAX_CONFLICTS, NodeReporter
from patcher.adapters.kube.transport import Api
from patcher.core.status import NodeState, NodeStatus, annotation_snapshot, desired_annotations
from tests.harness.emu.kubeemu import KubeEmulator, merge_patch, wait_until
from tests.harness.emu.kubeemu_ext import KubeEmulatorExt
from tests.harness.helpers import NODE, P

NS = 1_000_000_000
HASH = "0123456789ab" + "cd" * 26
MTIME = 1795304401 * NS + 123456789
NODE_PATH = f"/api/v1/nodes/{NODE}"


def fast() -> Backoff:
    return Backoff(initial=0.05, maximum=0.3)


@pytest.fixture
def emu() -> Iterator[KubeEmulatorExt]:
    with KubeEmulatorExt() as e:
        e.add_node(NODE, annotations={"kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd.sock",
                                      P + "message": "left over from an earlier run"})
        yield e


def ours(emu: KubeEmulator) -> dict[str, str]:
    return {k: v for k, v in emu.node_annotations(NODE).items() if k.startswith(P)}


def successful_patches(emu: KubeEmulator) -> list[dict[str, str | None]]:
    return [r.json()["metadata"]["annotations"] for r in emu.requests("PATCH", NODE_PATH) if r.status == 200]


def test_one_merge_patch_per_change_and_none_when_unchanged(emu: KubeEmulator, api: Api) -> None:
    with NodeReporter(api, NODE, backoff=fast()) as rep:
        waiting = NodeStatus(NodeState.WAITING_FOR_RESTART, HASH, MTIME)
        rep.publish(waiting)
        assert rep.flush(5)
        for _ in range(3):
            rep.publish(waiting)
        assert rep.flush(5)  # a redundant patch would also show below, before the next state's (len == 2)
        patches = emu.requests("PATCH", NODE_PATH)
        assert len(patches) == 1
        assert patches[0].headers["content-type"] == "application/merge-patch+json"
        assert patches[0].json() == {"metadata": {"annotations": {
            P + "state": "WaitingForRestart",
            P + "config-hash": HASH,
            P + "source-hash": None,
            P + "manifest-mtime": "2026-11-21T23:40:01.123456789Z",
            P + "restarted-at": None,
            P + "message": None,  # clears the leftover
        }}}
        assert ours(emu) == {P + "state": "WaitingForRestart", P + "config-hash": HASH,
                             P + "manifest-mtime": "2026-11-21T23:40:01.123456789Z"}
        assert "kubeadm.alpha.kubernetes.io/cri-socket" in emu.node_annotations(NODE)  # others untouched

        rep.publish(NodeStatus(NodeState.READY, HASH, MTIME, restarted_at_ns=MTIME + 3 * NS))
        assert rep.flush(5)
        assert len(emu.requests("PATCH", NODE_PATH)) == 2
        assert ours(emu)[P + "restarted-at"] == "2026-11-21T23:40:04.123456789Z"
        assert annotation_snapshot(emu.get("nodes", NODE) or {})["state"] == "Ready"


def test_message_only_in_the_states_that_keep_one(emu: KubeEmulator, api: Api) -> None:
    with NodeReporter(api, NODE, backoff=fast()) as rep:
        rep.publish(NodeStatus(NodeState.ROLLED_BACK, None, MTIME, message="config 0123456789ab crash-looped"))
        assert rep.flush(5)
        assert ours(emu)[P + "message"] == "config 0123456789ab crash-looped"
        rep.publish(NodeStatus(NodeState.RESTORED, HASH, MTIME, message="ignored in this state"))
        assert rep.flush(5)
        assert P + "message" not in ours(emu)
        assert successful_patches(emu)[-1][P + "message"] is None


def test_api_down_never_blocks_and_the_latest_state_wins(emu: KubeEmulator, api: Api) -> None:
    errors: list[str] = []
    with NodeReporter(api, NODE, backoff=fast(), on_error=lambda kind, exc: errors.append(kind)) as rep:
        rep.publish(NodeStatus(NodeState.PENDING, HASH))
        assert rep.flush(5)
        with emu.outage("refuse"):
            states = [
                NodeStatus(NodeState.WAITING_FOR_RESTART, HASH, MTIME),
                NodeStatus(NodeState.READY, HASH, MTIME, restarted_at_ns=MTIME + NS),
                NodeStatus(NodeState.WAITING_FOR_RESTART, "fe" * 32, MTIME + 60 * NS),
            ]
            for status in states:
                rep.publish(status)
            assert wait_until(lambda: len(errors) >= 3, 5)
            assert not rep.flush(0.3)  # the deadline is honoured while the API is down
            tried = len(errors)
            assert wait_until(lambda: len(errors) >= tried + 3, 10)  # it goes on trying while the API is down
        assert rep.flush(5)
        # Only the newest state was sent after the outage; the intermediate ones never reached the server.
        after = successful_patches(emu)
        assert len(after) == 2
        assert after[-1][P + "config-hash"] == "fe" * 32
        assert ours(emu)[P + "state"] == "WaitingForRestart"
        assert ours(emu)[P + "manifest-mtime"] == "2026-11-21T23:41:01.123456789Z"
        assert P + "restarted-at" not in ours(emu)
        # ... while every transition still became an event, in order.
        assert [e["reason"] for e in emu.events("default")] == [
            "PatchPending", "SchedulerPatched", "SchedulerRestarted", "SchedulerPatched"]
        assert set(errors) == {"annotations"}


def test_publish_is_a_hand_over_that_sends_nothing_on_the_callers_thread(emu: KubeEmulator,
                                                                           api: Api) -> None:
    rep = NodeReporter(api, NODE, backoff=fast())  # not started: no worker thread to send anything
    before = len(emu.requests())
    rep.publish(NodeStatus(NodeState.WAITING_FOR_RESTART, HASH, MTIME))
    rep.publish(NodeStatus(NodeState.READY, HASH, MTIME, restarted_at_ns=MTIME + NS))
    assert len(emu.requests()) == before
    rep.start()
    assert rep.flush(30)
    rep.close()
    assert ours(emu)[P + "state"] == "Ready"
    assert len(emu.events("default")) == 2  # both handed-over transitions were kept for the worker


def test_503_is_retried_like_a_refused_connection(emu: KubeEmulator, api: Api) -> None:
    rep = NodeReporter(api, NODE, backoff=fast())
    with emu.outage("503"):
        rep.start()
        rep.publish(NodeStatus(NodeState.WAITING_FOR_RESTART, HASH, MTIME))
        assert wait_until(lambda: len(emu.requests("PATCH", NODE_PATH)) >= 2, 5)
        assert rep.flush(0.2) is False  # nothing is claimed as delivered while the API refuses it
        assert all(r.status == 503 for r in emu.requests("PATCH", NODE_PATH))
    assert rep.flush(5)
    rep.close()
    assert ours(emu)[P + "state"] == "WaitingForRestart"


def test_an_event_per_transition_about_the_node(emu: KubeEmulator, api: Api) -> None:
    uid = (emu.get("nodes", NODE) or {})["metadata"]["uid"]
    with NodeReporter(api, NODE, backoff=fast()) as rep:
        rep.publish(NodeStatus(NodeState.PENDING, HASH))
        rep.publish(NodeStatus(NodeState.WAITING_FOR_RESTART, HASH, MTIME))
        rep.publish(NodeStatus(NodeState.WAITING_FOR_RESTART, HASH, MTIME))  # no transition, no event
        rep.publish(NodeStatus(NodeState.ROLLED_BACK, None, MTIME, message="kube-scheduler crash-looped"))
        rep.publish(NodeStatus(NodeState.RESTORED), reason="SchedulerRestored", message="Agent stopped.")
        assert rep.flush(5)
    events = emu.events("default")
    assert [(e["reason"], e["type"]) for e in events] == [
        ("PatchPending", "Normal"), ("SchedulerPatched", "Normal"),
        ("PatchRolledBack", "Warning"), ("SchedulerRestored", "Normal")]
    assert events[2]["message"] == "kube-scheduler crash-looped"
    assert events[3]["message"] == "Agent stopped."
    for event in events:
        assert event["involvedObject"]["kind"] == "Node" and event["involvedObject"]["name"] == NODE
        assert event["metadata"]["namespace"] == "default"
        assert event["source"] == {"component": "scheduler-patcher", "host": NODE}
    # The uid is learned from the first patch's answer, which comes before any event is sent.
    assert {e["involvedObject"]["uid"] for e in events} == {uid}
    assert all(r.path == "/api/v1/namespaces/default/events" for r in emu.requests("POST"))


def test_a_retried_event_that_already_exists_is_not_duplicated(emu: KubeEmulator, api: Api) -> None:
    at = MTIME
    # As if an earlier attempt had been stored but its answer lost.
    emu.create({"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{NODE}.{at:x}", "namespace": "default"}, "reason": "SchedulerPatched"})
    with NodeReporter(api, NODE, backoff=fast(), clock_ns=lambda: at) as rep:
        rep.publish(NodeStatus(NodeState.WAITING_FOR_RESTART, HASH, MTIME))
        assert rep.flush(5)  # delivered: the 409 counts as the event being there
    assert [r.status for r in emu.requests("POST")] == [409]  # and it is not sent again, not even at close
    assert len(emu.events("default")) == 1


def test_flush_delivers_the_final_state_within_its_deadline(emu: KubeEmulator, api: Api) -> None:
    slow = Backoff(initial=60.0, maximum=120.0)  # after one failure the next regular retry is a minute away
    with NodeReporter(api, NODE, backoff=slow) as rep:
        with emu.outage("refuse"):
            rep.publish(NodeStatus(NodeState.READY, HASH, MTIME))
            assert wait_until(lambda: slow.failures >= 1, 5)
        rep.publish(NodeStatus(NodeState.RESTORED))
        assert rep.flush(20.0)  # retries at once: the regular retry (>= 30 s away) would miss this deadline
        assert ours(emu)[P + "state"] == "Restored"
        assert [e["reason"] for e in emu.events("default")] == ["SchedulerRestarted", "SchedulerRestored"]


def test_flush_gives_up_at_the_deadline_and_close_returns(emu: KubeEmulator, api: Api) -> None:
    rep = NodeReporter(api, NODE, backoff=fast())
    rep.start()
    emu.go_down("refuse")
    try:
        rep.publish(NodeStatus(NodeState.RESTORED))
        started = time.monotonic()
        assert rep.flush(0.5) is False
        assert time.monotonic() - started >= 0.5  # it waited for its deadline (a slow machine only adds)
        rep.close(timeout=2.0)
    finally:
        emu.come_up()
    assert emu.events("default") == []  # the event was never delivered, and nothing sends it after close


# --- failures by what they mean (the classes of kube/errors.py) ------------------------------------------


def test_a_conflict_on_the_node_reads_it_and_patches_again_at_once(emu: KubeEmulatorExt, api: Api) -> None:
    slow = Backoff(initial=60.0, maximum=120.0)  # a conflict taken for an outage would wait a minute
    errors: list[str] = []
    emu.fail("PATCH", NODE_PATH, 409)
    with NodeReporter(api, NODE, backoff=slow, on_error=lambda kind, exc: errors.append(kind)) as rep:
        rep.publish(NodeStatus(NodeState.WAITING_FOR_RESTART, HASH, MTIME))
        assert rep.flush(20)
    assert [(r.method, r.status) for r in emu.requests() if r.path == NODE_PATH] == [
        ("PATCH", 409), ("GET", 200), ("PATCH", 200)]
    assert ours(emu)[P + "state"] == "WaitingForRestart"
    assert errors == [] and slow.failures == 0  # a busy Node is not an API failure


def test_a_conflict_after_which_the_node_already_carries_the_state_is_not_patched_again(
        emu: KubeEmulatorExt, api: Api) -> None:
    status = NodeStatus(NodeState.WAITING_FOR_RESTART, HASH, MTIME)
    wanted = desired_annotations(status, P)
    # As if the patch had been stored and only its answer lost: the Node carries it when read again.
    emu.fail("PATCH", NODE_PATH, 409)
    emu.before("GET", NODE_PATH, lambda e: e.mutate(
        "nodes", NODE, lambda n: merge_patch(n, {"metadata": {"annotations": wanted}})))
    with NodeReporter(api, NODE, backoff=Backoff(initial=60.0, maximum=120.0)) as rep:
        rep.publish(status)  # a transition from nothing: its event is sent once the state is delivered
        assert rep.flush(20)
    assert [r.status for r in emu.requests("PATCH", NODE_PATH)] == [409]
    # The uid, learned from the read (no patch was answered), names the Node in the event.
    uid = (emu.get("nodes", NODE) or {})["metadata"]["uid"]
    assert [e["involvedObject"]["uid"] for e in emu.events("default")] == [uid]
    assert ours(emu) == {k: v for k, v in wanted.items() if v is not None}


def test_a_node_that_keeps_conflicting_is_retried_with_backoff(emu: KubeEmulatorExt, api: Api) -> None:
    errors: list[str] = []
    emu.fail("PATCH", NODE_PATH, 409, times=MAX_CONFLICTS)
    with NodeReporter(api, NODE, backoff=fast(), on_error=lambda kind, exc: errors.append(kind)) as rep:
        rep.publish(NodeStatus(NodeState.READY, HASH, MTIME))
        assert rep.flush(20)
    assert [r.status for r in emu.requests("PATCH", NODE_PATH)] == [409] * MAX_CONFLICTS + [200]
    assert len(emu.requests("GET", NODE_PATH)) == MAX_CONFLICTS
    assert errors == ["annotations"]  # one failed attempt: the series of conflicts, then the backoff


def test_forbidden_is_logged_once_and_not_retried_hot(emu: KubeEmulatorExt, api: Api,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="patcher.adapters.kube.publish")
    quick = Backoff(initial=0.01, maximum=600.0)  # any other failure would be retried within 10 ms
    emu.fail("PATCH", NODE_PATH, 403, times=100)
    with NodeReporter(api, NODE, backoff=quick) as rep:
        rep.publish(NodeStatus(NodeState.READY, HASH, MTIME))
        # A few ordinary retries (a restarting API server denies for a moment), then the longest delay: no
        # more attempts (at the ordinary 10 ms pace there would be dozens in half a second).
        def patches() -> int:
            return len(emu.requests("PATCH", NODE_PATH))

        assert wait_until(lambda: patches() == DENIED_QUICK_RETRIES + 1, 5)
        assert not wait_until(lambda: patches() > DENIED_QUICK_RETRIES + 1, 0.5)
        assert rep.flush(0.3) is False  # a flush tries once more at once, then waits again
        assert wait_until(lambda: patches() == DENIED_QUICK_RETRIES + 2, 5)
        assert not wait_until(lambda: patches() > DENIED_QUICK_RETRIES + 2, 0.5)
    denied = [r for r in caplog.records if "not allowed" in r.getMessage()]
    assert [r.levelno for r in denied] == [logging.ERROR] + [logging.DEBUG] * (DENIED_QUICK_RETRIES + 1)
    assert "HTTP 403" in denied[0].getMessage()


def test_a_passing_denial_heals_at_the_ordinary_pace(emu: KubeEmulatorExt, api: Api) -> None:
    """kube-apiserver answers 403 to requests that reach it before its RBAC caches synced (a restart,
    tests/real/test_real_nodes.py): the next short retry delivers, the longest delay is not waited."""
    emu.fail("PATCH", NODE_PATH, 403, times=2)
    with NodeReporter(api, NODE, backoff=Backoff(initial=0.01, maximum=600.0)) as rep:
        rep.publish(NodeStatus(NodeState.READY, HASH, MTIME))
        assert wait_until(lambda: ours(emu).get(P + "state") == "Ready", 5)
    assert [r.status for r in emu.requests("PATCH", NODE_PATH)] == [403, 403, 200]


def test_a_refused_connection_backs_off_and_recovers(emu: KubeEmulatorExt, api: Api) -> None:
    backoff = Backoff(initial=0.05, maximum=600.0)
    with NodeReporter(api, NODE, backoff=backoff) as rep:
        with emu.outage("refuse"):
            rep.publish(NodeStatus(NodeState.READY, HASH, MTIME))
            # retried, each time a little later, at the ordinary pace (the denied one would wait 600 s)
            assert wait_until(lambda: backoff.failures >= 3, 10)
        assert rep.flush(20)
        assert backoff.failures == 0
    assert ours(emu)[P + "state"] == "Ready"
