"""The extender pre-flight as protocol (``patcher.core.lifecycle``): pure steps, no I/O.

Nothing is written and no turn is asked for before the extenders answer; a failure keeps the node Pending with
the message, one Warning per distinct failure, retries with a doubling delay; an answer re-plans, and the write
then goes ahead through the usual path.
"""

from __future__ import annotations

from dataclasses import replace

from patcher.core import lifecycle as lc
from patcher.core.settings import Lifecycle
from patcher.core.status import NodeState, NodeStatus, desired_annotations

H1, H2 = "a" * 64, "b" * 64
OPTS = Lifecycle(coordinated=True, check_extenders=True, probe_retry=2.0, probe_retry_max=5.0)
DOWN = "extender http://x/filter does not answer: connection refused"


def pending(config_hash: str = H1) -> lc.Planned:
    return lc.Planned(0.0, "pending", config_hash=config_hash, source_hash="s" + config_hash[:3],
                      manifest_change=True)


def kinds(actions: list[lc.Action]) -> list[str]:
    return [type(a).__name__ for a in actions]


def test_a_pending_write_is_probed_first_and_asks_for_nothing_else() -> None:
    node, acts = lc.step(lc.Node(), pending(), OPTS)
    assert node.phase == NodeState.PENDING and node.probing == H1 and node.turn == "none"
    assert lc.Probe(H1) in acts and "TakeTurn" not in kinds(acts) and "Apply" not in kinds(acts)
    again, acts = lc.step(node, pending(), OPTS)  # a resync while the probe runs: no second probe
    assert again == node and kinds(acts) == ["Count"]
    # without the option, the write asks for its turn at once, as before
    _, acts = lc.step(lc.Node(), pending(), replace(OPTS, check_extenders=False))
    assert "TakeTurn" in kinds(acts) and "Probe" not in kinds(acts)


def test_a_failed_probe_holds_the_write_back_and_retries_with_a_doubling_delay() -> None:
    node, _ = lc.step(lc.Node(), pending(), OPTS)
    node, acts = lc.step(node, lc.Probed(H1, blocking=DOWN), OPTS)
    message = f"{DOWN}; config {H1[:12]} not written"
    assert node.phase == NodeState.PENDING and node.record.message == message and node.probing == ""
    assert lc.Note("ExtenderUnreachable", message, warning=True) in acts and lc.Error("extender") in acts
    assert acts[-1] == lc.RetryLater(2.0) and "TakeTurn" not in kinds(acts) and "Apply" not in kinds(acts)
    delays = []
    for _ in range(3):
        node, _ = lc.step(node, pending(), OPTS)
        node, acts = lc.step(node, lc.Probed(H1, blocking=DOWN), OPTS)
        assert "Note" not in kinds(acts) and "Publish" not in kinds(acts)  # the same failure: no Event spam
        delays.append(acts[-1])
    assert delays == [lc.RetryLater(4.0), lc.RetryLater(5.0), lc.RetryLater(5.0)]
    # a new config starts its own backoff
    node, _ = lc.step(node, pending(H2), OPTS)
    _, acts = lc.step(node, lc.Probed(H2, blocking=DOWN), OPTS)
    assert acts[-1] == lc.RetryLater(2.0)


def test_an_answer_replans_clears_the_message_and_the_write_takes_its_turn() -> None:
    node, _ = lc.step(lc.Node(), pending(), OPTS)
    node, _ = lc.step(node, lc.Probed(H1, blocking=DOWN), OPTS)
    node, _ = lc.step(node, pending(), OPTS)
    node, acts = lc.step(node, lc.Probed(H1), OPTS)
    assert node.probed == H1 and node.record.message is None and node.probe_failures == 0
    assert acts[-1] == lc.Replan() and "Publish" in kinds(acts)  # the stale sentence leaves the annotations
    node, acts = lc.step(node, pending(), OPTS)
    assert lc.TakeTurn("s" + H1[:3]) in acts and "Probe" not in kinds(acts)
    node, acts = lc.step(node, lc.TurnChanged(held=True, refused_bad=False), OPTS)
    node, acts = lc.step(node, pending(), OPTS)  # holding the turn: write, no second probe
    assert kinds(acts) == ["Count", "Apply"]


def test_ignorable_failures_write_anyway_with_a_warning_and_stale_probes_are_ignored() -> None:
    node, _ = lc.step(lc.Node(), pending(), OPTS)
    stale, acts = lc.step(node, lc.Probed(H2, blocking=DOWN), OPTS)
    assert stale == node and acts == []
    node, acts = lc.step(node, lc.Probed(H1, ignored=DOWN), OPTS)
    warning = f"{DOWN}; ignorable, so config {H1[:12]} is written anyway"
    assert lc.Note("ExtenderUnreachable", warning, warning=True) in acts and acts[-1] == lc.Replan()
    assert node.record.extender_warning == warning
    stopped, _ = lc.step(node, lc.Stop(), OPTS)
    assert lc.step(stopped, lc.Probed(H1, blocking=DOWN), OPTS) == (stopped, [])


def test_pending_keeps_its_message_annotation() -> None:
    ann = desired_annotations(NodeStatus(NodeState.PENDING, message="extender x does not answer"))
    assert ann["scheduler-patcher.io/message"] == "extender x does not answer"
    assert desired_annotations(NodeStatus(NodeState.PENDING))["scheduler-patcher.io/message"] is None


def waiting(opts: Lifecycle = OPTS) -> lc.Node:
    """A node that wrote config H1 and waits for the scheduler (pre-flight passed, turn held)."""
    from patcher.core.state import LastGood, State

    good = LastGood(config_hash=H2, config_file="config-b.yaml", source_hash="sb")
    node = lc.Node(record=State(config_hash=H1, patched_sha256="p", manifest_mtime_ns=5, last_good=good),
                   turn="held", probed=H1)
    node, acts = lc.step(node, lc.Wrote(0.0, node.record, manifest_change=True), opts)
    assert node.wait is not None and "Watch" in kinds(acts)
    return node


def ready(now: float = 1.0) -> lc.Observed:
    from patcher.core.restart import Verdict

    return lc.Observed(now, 2_000_000_000, Verdict.READY, "restarted")


def test_after_the_restart_the_extenders_are_probed_again_before_the_turn_passes_on() -> None:
    node = waiting()
    node, acts = lc.step(node, ready(), OPTS)
    assert node.phase == NodeState.WAITING_FOR_RESTART and node.turn == "held"  # not Ready yet, Lease kept
    assert acts[-1] == lc.Probe(H1) and node.wait is not None and node.wait.probing
    again, acts = lc.step(node, ready(1.5), OPTS)
    assert again == node and acts == []  # the restart checks go on while the probe runs
    node, acts = lc.step(node, lc.Probed(H1), OPTS)
    assert node.wait is not None and node.wait.extenders_checked and acts == []
    node, acts = lc.step(node, ready(2.1), OPTS)
    assert node.phase == NodeState.READY and lc.ReleaseTurn(None) in acts and node.turn == "none"


def test_an_extender_that_stops_answering_after_the_restart_rolls_back_like_a_crash_loop() -> None:
    node, _ = lc.step(waiting(), ready(), OPTS)
    node, acts = lc.step(node, lc.Probed(H1, blocking=DOWN), OPTS)
    assert H1 in node.record.bad_hashes and node.wait is None
    [rollback] = [a for a in acts if isinstance(a, lc.CheckLastGood)]
    assert rollback.reason == f"{DOWN} after kube-scheduler restarted with config {H1[:12]}"
    assert rollback.last_good is not None and rollback.last_good.config_hash == H2
    # without the option the restart alone makes the node Ready, as before
    plain = replace(OPTS, check_extenders=False)
    node, acts = lc.step(waiting(plain), ready(), plain)
    assert node.phase == NodeState.READY


def ready_node(opts: Lifecycle = OPTS) -> lc.Node:
    node, _ = lc.step(waiting(opts), ready(), opts)
    node, _ = lc.step(node, lc.Probed(H1), opts)
    node, _ = lc.step(node, ready(2.1), opts)
    assert node.phase == NodeState.READY
    return node


def test_while_ready_a_periodic_probe_failure_says_so_without_touching_anything() -> None:
    node = ready_node()
    node, acts = lc.step(node, lc.ProbeDue(), OPTS)
    assert acts == [lc.Probe(H1)]
    assert lc.step(node, lc.ProbeDue(), OPTS) == (node, [])  # one at a time
    node, acts = lc.step(node, lc.Probed(H1, blocking=DOWN), OPTS)
    message = f"extenders stopped answering: {DOWN}"
    assert node.phase == NodeState.READY and node.record.message == message and node.record.config_hash == H1
    assert lc.Note("ExtenderUnreachable", message, warning=True) in acts and "Publish" in kinds(acts)
    assert not {"Apply", "RollBack", "TakeTurn", "RestoreAll"} & set(kinds(acts))  # the manifest stays
    ann = desired_annotations(NodeStatus(NodeState.READY, H1, message=node.record.message))
    assert ann["scheduler-patcher.io/message"] == message  # the verdict reads it: NotReady
    node, _ = lc.step(node, lc.ProbeDue(), OPTS)
    node, acts = lc.step(node, lc.Probed(H1, blocking=DOWN), OPTS)
    assert acts == [lc.Error("extender")]  # still down: no second Warning, no re-publish
    node, _ = lc.step(node, lc.ProbeDue(), OPTS)
    node, acts = lc.step(node, lc.Probed(H1), OPTS)
    assert node.record.message is None and "Publish" in kinds(acts)
    # not Ready, or the option off: no periodic probe
    assert lc.step(waiting(), lc.ProbeDue(), OPTS)[1] == []
    plain = replace(OPTS, check_extenders=False)
    assert lc.step(ready_node(plain), lc.ProbeDue(), plain)[1] == []


def test_a_ready_node_whose_manifest_lost_the_patch_writes_it_again_after_the_pre_flight() -> None:
    # kubeadm rewrote the manifest with the patch gone while the node was held: the hold's release re-reads the
    # record (Ready) and plans the config the node runs; that pre-flight's answer is no periodic probe's, it leads
    # to the write (it was taken for the periodic probe, and the manifest was never patched again)
    ready = ready_node()
    node, _ = lc.step(ready, lc.HoldChanged("kubeadm upgrade"), OPTS)
    node, acts = lc.step(node, lc.HoldChanged(None), OPTS)
    assert acts[-1] == lc.Reclaim()
    node, acts = lc.step(node, lc.Reclaimed(6.1, ready.record), OPTS)
    assert acts[-1] == lc.Replan() and node.phase == NodeState.READY
    node, acts = lc.step(node, pending(), OPTS)
    assert acts[-1] == lc.Probe(H1) and node.phase == NodeState.READY
    node, acts = lc.step(node, lc.Probed(H1), OPTS)
    assert acts[-1] == lc.Replan() and node.probed == H1
    _, acts = lc.step(node, pending(), OPTS)
    assert "TakeTurn" in kinds(acts) or "Apply" in kinds(acts)
    # a pre-flight planned while the periodic probe of the same config runs: that answer is the pre-flight's
    node, _ = lc.step(ready_node(), lc.ProbeDue(), OPTS)
    node, acts = lc.step(node, pending(), OPTS)
    assert "Probe" not in kinds(acts)
    _, acts = lc.step(node, lc.Probed(H1), OPTS)
    assert acts[-1] == lc.Replan()


def test_a_pre_flight_of_the_next_config_does_not_lose_the_canary_probe() -> None:
    # A ConfigMap change while the canary probe runs: both probes are in flight, each answer finds its place.
    node, _ = lc.step(waiting(), ready(), OPTS)
    node, acts = lc.step(node, replace(pending(H2), now=1.2), OPTS)
    assert lc.Probe(H2) in acts and node.probing == H2
    node, acts = lc.step(node, lc.Probed(H1), OPTS)  # the canary's answer
    assert node.wait is not None and node.wait.extenders_checked and node.probing == H2
    node, acts = lc.step(node, ready(1.6), OPTS)
    assert node.phase == NodeState.READY
    node, acts = lc.step(node, lc.Probed(H2), OPTS)  # the pre-flight's answer
    assert node.probed == H2 and acts[-1] == lc.Replan()
