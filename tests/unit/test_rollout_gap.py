"""bench/rollout_gap.py's arithmetic on the prober's lines: a pod's wait, the pods still unbound, the idle p99 and
the wait beyond it, and the kube-scheduler Lease's leader changes in a window."""

from __future__ import annotations

from typing import Any

from bench.rollout_gap import Prober, figures, percentile, probe_pod


def fed(*events: dict[str, Any]) -> Prober:
    prober = Prober()
    for ev in events:
        prober.record(ev)
    return prober


def test_a_wait_is_bound_minus_created_and_an_unbound_pod_waits_until_the_window_ends() -> None:
    prober = fed({"kind": "created", "name": "a", "t": 10.0}, {"kind": "bound", "name": "a", "t": 10.5},
                 {"kind": "created", "name": "b", "t": 11.0}, {"kind": "bound", "name": "b", "t": 25.0},
                 {"kind": "created", "name": "c", "t": 12.0},
                 {"kind": "created", "name": "early", "t": 9.0}, {"kind": "bound", "name": "early", "t": 30.0})
    waits, unbound = prober.waits(10.0, 20.0)
    assert sorted(waits) == [0.5, 8.0, 14.0]  # b bound after the window: its whole wait; c: until the end
    assert unbound == 2
    assert prober.waits(20.0, 30.0) == ([], 0)  # created before: not this window's


def test_the_figures_count_the_wait_beyond_the_idle_p99_never_below_zero() -> None:
    prober = fed({"kind": "created", "name": "a", "t": 0.0}, {"kind": "bound", "name": "a", "t": 3.0},
                 {"kind": "create_failed", "name": "x", "t": 1.0})
    got = figures(prober, 0.0, 5.0, idle_p99=0.5)
    assert (got["max_wait_s"], got["longest_wait_s"], got["pods"], got["unbound"], got["create_failures"]) == (
        2.5, 3.0, 1, 0, 1)
    assert figures(prober, 0.0, 5.0, idle_p99=4.0)["max_wait_s"] == 0.0


def test_percentile_is_the_nearest_rank() -> None:
    assert percentile([], 0.99) == 0.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0
    assert percentile([1.0, 5.0], 0.5) in (1.0, 5.0)


def test_leader_changes_count_new_holders_after_the_one_before_the_window_and_the_transitions_moved() -> None:
    prober = fed({"kind": "lease", "t": 1.0, "holder": "a_1", "transitions": 3},
                 {"kind": "lease", "t": 5.0, "holder": "", "transitions": 3},  # released on a clean stop
                 {"kind": "lease", "t": 6.0, "holder": "b_1", "transitions": 4},
                 {"kind": "lease", "t": 8.0, "holder": "b_1", "transitions": 4},
                 {"kind": "lease", "t": 20.0, "holder": "b_2", "transitions": 5})  # b restarted, took it again
    assert prober.leader_changes(4.0, 10.0) == (1, 1)
    assert prober.leader_changes(4.0, 30.0) == (2, 2)
    assert prober.leader_changes(9.0, 10.0) == (0, 0)
    assert fed({"kind": "lease", "t": 1.0, "holder": "a_1", "transitions": 0}).leader_changes(0.0, 2.0) == (0, 0)


def test_a_probe_pod_needs_only_binding() -> None:
    """No node name, the control-plane taint tolerated, no token, and a volume the kubelet waits for forever."""
    spec = probe_pod("p")["spec"]
    assert "nodeName" not in spec and spec["automountServiceAccountToken"] is False
    assert spec["tolerations"][0]["key"] == "node-role.kubernetes.io/control-plane"
    assert spec["volumes"][0]["secret"]["secretName"].endswith("-absent")


def test_the_config_journey_changes_only_the_extenders_weight() -> None:
    """A new scheduler config (the agents patch again), the same extenders, and the way's own values kept."""
    from bench.rollout_gap import way_values, with_weight

    base: dict[str, Any] = {"image": {"tag": "t"},
                            "extenders": [{"urlPrefix": "http://x", "weight": 1, "ignorable": True}],
                            "extraEnv": [{"name": "A", "value": "1"}]}
    got = with_weight(way_values(base, "order_only"), 2)
    assert got["extenders"] == [{"urlPrefix": "http://x", "weight": 2, "ignorable": True}]
    assert [e["name"] for e in got["extraEnv"]] == ["A", "PATCHER_LEADER_WAIT"]
    assert base["extenders"][0]["weight"] == 1  # the install's values are not changed under it
