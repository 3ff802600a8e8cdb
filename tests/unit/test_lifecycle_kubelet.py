"""A dead kubelet on the node: no write while it is known down, and a restart timeout during its outage is no
verdict on the config (bounded: one more timeout, then a rollback that marks nothing bad and tells the Lease
nothing)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from patcher.core import lifecycle
from patcher.core.restart import Verdict
from patcher.core.settings import Lifecycle
from patcher.core.state import LastGood, State
from patcher.core.status import NodeState

HASH = "ab" * 32
SOURCE = "5e" * 32
OPTS = Lifecycle(restart_timeout=60.0, check_extenders=False, coordinated=True)
DOWN = "http://127.0.0.1:10248/healthz refused the connection"


def waiting() -> lifecycle.Node:
    record = State(phase=NodeState.WAITING_FOR_RESTART.value, config_hash=HASH, patched_sha256="cd" * 32,
                   source_hash=SOURCE)
    return lifecycle.Node(record=record, turn="held",
                          wait=lifecycle.Wait(HASH, written_ns=1, deadline=100.0, source_hash=SOURCE))


def observe(node: lifecycle.Node, now: float, kubelet_down: str = "", *, verdict: Verdict = Verdict.WAITING,
            opts: Lifecycle = OPTS) -> tuple[lifecycle.Node, list[lifecycle.Action]]:
    return lifecycle.step(node, lifecycle.Observed(now, 0, verdict, "not restarted yet", kubelet_down=kubelet_down),
                          opts)


def rollbacks(actions: list[lifecycle.Action]) -> list[lifecycle.RollBack | lifecycle.CheckLastGood]:
    return [a for a in actions if isinstance(a, (lifecycle.RollBack, lifecycle.CheckLastGood))]


# -- the restart timeout ------------------------------------------------------------------------------------


def test_a_timeout_with_the_kubelet_up_rolls_back_and_marks_the_config_bad_as_before() -> None:
    node, actions = observe(waiting(), 100.0)
    [rb] = rollbacks(actions)
    assert HASH in node.record.bad_hashes and rb.bad_source == SOURCE and node.wait is None


def test_a_kubelet_down_at_the_deadline_waits_one_more_timeout_and_says_so_once() -> None:
    node, actions = observe(waiting(), 100.0, DOWN)
    assert node.wait is not None and node.wait.kubelet_down == DOWN and node.turn == "held"
    assert node.phase == NodeState.WAITING_FOR_RESTART and DOWN in (node.record.message or "")
    assert [a.reason for a in actions if isinstance(a, lifecycle.Note)] == ["KubeletNotHealthy"]
    assert any(isinstance(a, lifecycle.Publish) for a in actions)  # the Node's message says it
    assert not rollbacks(actions) and not any(isinstance(a, lifecycle.ReleaseTurn) for a in actions)
    again, more = observe(node, 130.0, DOWN)
    assert more == [] and again == node


def test_a_kubelet_still_down_at_the_bound_rolls_back_without_marking_anything_bad() -> None:
    node, _ = observe(waiting(), 100.0, DOWN)
    node, actions = observe(node, 160.0, DOWN)
    [rb] = rollbacks(actions)
    assert node.wait is None and HASH not in node.record.bad_hashes
    assert rb.bad_source == ""  # the Lease is released without a refusal: the rollout goes on elsewhere
    assert "not marked bad" in rb.reason and DOWN in rb.reason
    done, after = lifecycle.step(node, lifecycle.RollbackDone(rb.reason, rb.bad_source, node.record, "the "
                                                              "original manifest"), OPTS)
    assert lifecycle.ReleaseTurn(None) in after and done.turn == "none"
    assert done.phase == NodeState.ROLLED_BACK and HASH not in done.record.bad_hashes


def test_a_kubelet_that_comes_back_gets_the_rest_of_the_extra_time_for_the_restart() -> None:
    node, _ = observe(waiting(), 100.0, DOWN)
    node2, actions = observe(node, 120.0)  # healthy again, the scheduler not restarted yet
    assert actions == [] and node2 == node
    ready, acts = observe(node, 125.0, verdict=Verdict.READY)
    assert ready.phase == NodeState.READY and ready.record.message is None and ready.wait is None
    assert lifecycle.ReleaseTurn(None) in acts


def test_a_kubelet_that_came_back_but_no_restart_by_the_bound_marks_nothing_bad() -> None:
    node, _ = observe(waiting(), 100.0, DOWN)
    node, actions = observe(node, 160.0)
    [rb] = rollbacks(actions)
    assert rb.bad_source == "" and HASH not in node.record.bad_hashes


def test_a_crash_loop_after_the_kubelet_came_back_still_marks_the_config_bad() -> None:
    node, _ = observe(waiting(), 100.0, DOWN)
    node, actions = observe(node, 110.0, verdict=Verdict.CRASH_LOOPING)
    [rb] = rollbacks(actions)
    assert rb.bad_source == SOURCE and HASH in node.record.bad_hashes


def test_without_rollback_the_outage_fails_the_node_and_gives_the_turn_back_without_a_refusal() -> None:
    opts = replace(OPTS, rollback_on_failure=False)
    node, _ = observe(waiting(), 100.0, DOWN, opts=opts)
    node, actions = observe(node, 160.0, DOWN, opts=opts)
    assert node.phase == NodeState.FAILED and HASH not in node.record.bad_hashes
    assert lifecycle.ReleaseTurn(None) in actions


def test_an_outage_rolls_back_to_the_last_ready_config_without_telling_the_lease() -> None:
    good = LastGood(config_hash="ef" * 32, config_file="f.yaml")
    node = waiting()
    node = replace(node, record=replace(node.record, last_good=good))
    node, _ = observe(node, 100.0, DOWN)
    _, actions = observe(node, 160.0, DOWN)
    [check] = rollbacks(actions)
    assert isinstance(check, lifecycle.CheckLastGood) and check.bad_source == ""


@given(st.lists(st.tuples(st.floats(0.0, 400.0), st.booleans(), st.booleans()), max_size=12))
def test_a_timeout_while_the_kubelet_was_seen_down_never_marks_a_config_bad_and_never_holds_the_turn_forever(
        looks: list[tuple[float, bool, bool]]) -> None:
    """Any run of "not restarted yet" looks (in time order; kubelet down or not; view blind or not): the config
    is marked bad only when no look at or past the deadline saw the kubelet down, and no wait outlives
    the deadline plus one more timeout."""
    node, seen_down = waiting(), False
    for now, down, blind in sorted(looks):
        if node.wait is None:
            break
        seen_down |= down and now >= node.wait.deadline
        node, actions = lifecycle.step(node, lifecycle.Observed(now, 0, Verdict.WAITING, "not restarted yet",
                                                                blind=blind, kubelet_down=DOWN if down else ""),
                                       OPTS)
        if seen_down:
            assert HASH not in node.record.bad_hashes
            assert all(rb.bad_source == "" for rb in rollbacks(actions))
        if now >= 100.0 + OPTS.restart_timeout:
            assert node.wait is None  # the bound: the turn goes back with the rollback's report


# -- the write ----------------------------------------------------------------------------------------------


def pending(kubelet_down: str = "", now: float = 0.0) -> lifecycle.Planned:
    return lifecycle.Planned(now, "pending", config_hash=HASH, source_hash=SOURCE, manifest_change=True,
                             kubelet_down=kubelet_down)


def test_no_turn_and_no_write_while_the_kubelet_is_known_down() -> None:
    ready = lifecycle.Node(record=State(phase=NodeState.READY.value, config_hash="ef" * 32))
    node, actions = lifecycle.step(ready, pending(DOWN), OPTS)
    assert not any(isinstance(a, (lifecycle.Apply, lifecycle.TakeTurn)) for a in actions)
    assert node.phase == NodeState.READY and node.record == ready.record  # the state stays what it is
    assert lifecycle.Log("warning", f"kubelet on this node not healthy ({DOWN}): holding the write") in actions
    assert lifecycle.RetryLater(lifecycle.KUBELET_RETRY) in actions
    again, more = lifecycle.step(node, pending(DOWN, 5.0), OPTS)
    assert not any(isinstance(a, (lifecycle.Log, lifecycle.Note)) for a in more)  # said once
    back, acts = lifecycle.step(again, pending("", 10.0), OPTS)
    assert lifecycle.TakeTurn(SOURCE) in acts and back.kubelet_held == "" and back.turn == "asked"


def test_a_turn_that_came_while_the_kubelet_went_down_is_given_back() -> None:
    node = lifecycle.Node(record=State(phase=NodeState.PENDING.value), turn="held")
    node, actions = lifecycle.step(node, pending(DOWN), OPTS)
    assert node.turn == "none" and lifecycle.ReleaseTurn(None) in actions
    assert not any(isinstance(a, lifecycle.Apply) for a in actions)


def test_a_new_node_says_pending_while_its_write_is_held_for_the_kubelet() -> None:
    node, _ = lifecycle.step(lifecycle.Node(), pending(DOWN), OPTS)
    assert node.phase == NodeState.PENDING


def test_a_write_that_waits_for_its_restart_keeps_its_turn_while_the_next_is_held() -> None:
    node, actions = lifecycle.step(waiting(), replace(pending(DOWN), config_hash="99" * 32), OPTS)
    assert node.turn == "held" and node.wait == waiting().wait
    assert not any(isinstance(a, (lifecycle.Apply, lifecycle.ReleaseTurn)) for a in actions)


def test_a_hold_that_has_nothing_left_to_hold_is_forgotten_and_the_next_outage_is_said_again() -> None:
    ready = lifecycle.Node(record=State(phase=NodeState.READY.value, config_hash=HASH))
    held, _ = lifecycle.step(ready, pending(DOWN), OPTS)
    reverted, _ = lifecycle.step(held, lifecycle.Planned(5.0, "up-to-date", config_hash=HASH), OPTS)
    assert reverted.kubelet_held == ""
    _, actions = lifecycle.step(reverted, pending(DOWN, 10.0), OPTS)
    assert [a.reason for a in actions if isinstance(a, lifecycle.Note)] == ["KubeletNotHealthy"]
