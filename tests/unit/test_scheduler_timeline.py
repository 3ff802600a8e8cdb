"""The kubeadm cluster test's reading of the scheduler mirror pods' watch (tests/harness/real/kubeadm_cluster.py's
`SchedulerTimeline`): which schedulers were down for a new manifest at once. The real test asserts "never two"
with it, so what it counts must be right: a replaced mirror pod (deleted, or on another config hash until ready on
it) counts, a not-ready pod of the same hash (a crash, a lost leader election) does not."""

from __future__ import annotations

from typing import Any

from tests.harness.real.kubeadm_cluster import SchedulerTimeline


def event(kind: str, node: str, config: str, ready: bool) -> dict[str, Any]:
    return {"type": kind, "object": {
        "metadata": {"name": f"kube-scheduler-{node}", "annotations": {"kubernetes.io/config.hash": config}},
        "spec": {"nodeName": node},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}}


def timeline(*events: tuple[float, str, str, str, bool]) -> SchedulerTimeline:
    recorded = SchedulerTimeline()
    for stamp, kind, node, config, ready in events:
        recorded.record(stamp, event(kind, node, config, ready))
    return recorded


def test_one_node_at_a_time_is_one_and_the_nodes_replaced_are_named() -> None:
    t = timeline((0, "ADDED", "a", "h1", True), (0, "ADDED", "b", "h1", True),
                 (10, "DELETED", "a", "h1", False), (11, "ADDED", "a", "h2", False), (15, "MODIFIED", "a", "h2", True),
                 (20, "DELETED", "b", "h1", False), (21, "ADDED", "b", "h2", False), (24, "MODIFIED", "b", "h2", True))
    window = t.replacements(5, 30)
    assert max(len(down) for _, _, down in window) == 1
    assert sorted({n for _, _, down in window for n in down}) == ["a", "b"]
    assert t.down_for(5, 30, 1) == 9.0  # a 10-15, b 20-24
    assert t.down_for(5, 30, 2) == 0.0


def test_two_replaced_at_once_is_two_and_a_same_hash_not_ready_is_not_counted() -> None:
    t = timeline((0, "ADDED", "a", "h1", True), (0, "ADDED", "b", "h1", True), (0, "ADDED", "c", "h1", True),
                 (10, "MODIFIED", "c", "h1", False),  # the same pod not ready: not the agents' doing
                 (11, "MODIFIED", "c", "h1", True),
                 (12, "DELETED", "a", "h1", False), (13, "DELETED", "b", "h1", False),
                 (14, "ADDED", "a", "h1", False),  # back to the hash it ran before: still down until ready
                 (16, "MODIFIED", "a", "h1", True), (18, "ADDED", "b", "h1", True))
    window = t.replacements(5, 30)
    assert max(len(down) for _, _, down in window) == 2
    assert sorted({n for _, _, down in window for n in down}) == ["a", "b"]
    assert t.down_for(5, 30, 2) == 3.0  # 13-16
    assert t.down_for(14, 15, 2) == 1.0  # clipped to the window


def test_events_before_the_window_set_the_state_it_starts_from() -> None:
    t = timeline((0, "ADDED", "a", "h1", True), (0, "ADDED", "b", "h1", True),
                 (3, "DELETED", "a", "h1", False), (8, "DELETED", "b", "h1", False), (9, "ADDED", "a", "h2", True))
    window = t.replacements(5, 30)
    assert [(stamp, sorted(down)) for stamp, _, down in window] == [(8, ["a", "b"]), (9, ["b"])]
    assert t.down_for(5, 30, 2) == 1.0  # 8-9
    assert t.down_for(5, 30, 1) == 25.0  # a from 3 (clipped to 5) on, then b to the end



def test_an_error_event_is_no_pods_state() -> None:
    """kubectl's watch passes the API server's ERROR event on (a Status, whose `status` is a string) before it
    ends; reading it as a pod ended the reading thread."""
    t = timeline((0, "ADDED", "a", "h1", True))
    t.record(5, {"type": "ERROR", "object": {"kind": "Status", "status": "Failure", "code": 410,
                                             "message": "too old resource version: 1 (2)"}})
    assert t.replacements(0, 10) == [(0, "a", frozenset())]
