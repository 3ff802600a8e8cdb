"""The stop as a transition of the lifecycle: one test per row of the decision table
(mode x what the agent knows of its DaemonSet x state), the deadlines the step computes from the grace period,
and what follows the restore's report. Pure: no files, no API."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from patcher.core import lifecycle as lc
from patcher.core.settings import Lifecycle, RestoreOnExit
from patcher.core.state import State
from patcher.core.status import NodeState

NOW = 1000.0
OPTS = Lifecycle(coordinated=True, grace_period=25.0, check_extenders=False)
KEEPS = lc.DaemonSetView(known=True, exists=True, selects=True, name="scheduler-patcher")
GONE = lc.DaemonSetView(known=True, name="scheduler-patcher")
DELETING = replace(KEEPS, deleting=True)
ELSEWHERE = replace(KEEPS, selects=False, detail="nodeSelector role=master does not match the node's labels")
UNKNOWN = lc.DaemonSetView(detail="no answer about DaemonSet scheduler-patcher yet")

READY = lc.Node(record=State(phase="Ready", config_hash="c" * 64, patched_sha256="p" * 64))
WAITING = lc.Node(record=State(phase="WaitingForRestart", config_hash="c" * 64, patched_sha256="p" * 64),
                  wait=lc.Wait("c" * 64, 1, NOW + 600), turn="held")
PENDING = lc.Node(record=State(phase="Pending"), turn="asked")


def kinds(actions: list[lc.Action]) -> list[str]:
    return [type(a).__name__ for a in actions if not isinstance(a, lc.Log)]


def stop(node: lc.Node, mode: RestoreOnExit, view: lc.DaemonSetView) -> lc.Step:
    return lc.step(node, lc.Stop(NOW, "signal", view), replace(OPTS, restore_on_exit=mode))


# -- the decision table: restore or keep -------------------------------------------------------------------


@pytest.mark.parametrize("node", [READY, WAITING, PENDING], ids=["Ready", "WaitingForRestart", "Pending"])
@pytest.mark.parametrize("mode, view, restores", [
    ("auto", KEEPS, False),  # a rolling update, a pod deleted by hand, an eviction: a successor comes
    ("auto", GONE, True),  # uninstalled: the DaemonSet is gone (404)
    ("auto", DELETING, True),  # uninstall in progress (foreground deletion)
    ("auto", ELSEWHERE, True),  # the node was taken out of the DaemonSet's selection
    ("auto", UNKNOWN, True),  # no answer since start: cannot know that a successor comes
    ("always", KEEPS, True),
    ("always", UNKNOWN, True),
    ("never", GONE, False),
    ("never", UNKNOWN, False),
], ids=["auto-selects", "auto-gone", "auto-deleting", "auto-not-selected", "auto-unknown", "always-selects",
        "always-unknown", "never-gone", "never-unknown"])
def test_each_row_of_the_stop_table(node: lc.Node, mode: RestoreOnExit, view: lc.DaemonSetView,
                                    restores: bool) -> None:
    after, acts = stop(node, mode, view)
    assert after.stopping and after.wait is None
    assert any(isinstance(a, lc.Restore) for a in acts) == restores
    assert any(isinstance(a, lc.Note) and a.reason == "PatchKept" for a in acts) == (not restores)
    assert not any(isinstance(a, lc.Publish) for a in acts)  # a kept node's annotations stay as they are
    assert after.record.phase == node.record.phase  # Restored only once the restore is reported done
    if not restores:
        assert isinstance(acts[-1], lc.Finish) and acts[-1].code == 0


def test_the_restore_and_keep_say_why() -> None:
    _, acts = stop(READY, "auto", ELSEWHERE)
    assert any(isinstance(a, lc.Restore) for a in acts)
    said = next(a.message for a in acts if isinstance(a, lc.Log) and "restore on exit: " in a.message)
    assert said.endswith("restore on exit: DaemonSet scheduler-patcher no longer selects this node (nodeSelector "
                         "role=master does not match the node's labels)")
    _, acts = stop(READY, "auto", UNKNOWN)
    assert any(isinstance(a, lc.Restore) for a in acts)
    said = next(a.message for a in acts if isinstance(a, lc.Log) and "restore on exit: " in a.message)
    assert said.split("restore on exit: ", 1)[1].startswith(
        "cannot tell whether a successor comes (no answer about DaemonSet")
    _, acts = stop(READY, "auto", KEEPS)
    keep = next(a for a in acts if isinstance(a, lc.Note) and a.reason == "PatchKept")
    assert keep.message.startswith("DaemonSet scheduler-patcher still selects this node: the patch is kept")


# -- the rollout turn on a keep ------------------------------------------------------------------------------


def test_a_keep_while_a_write_waits_for_its_restart_leaves_the_turn_to_the_successor() -> None:
    after, acts = stop(WAITING, "auto", KEEPS)
    assert kinds(acts) == ["Note", "Finish"]  # no ReleaseTurn: the successor resumes the wait and renews it
    assert after.turn == "none"


@pytest.mark.parametrize("node", [PENDING, replace(READY, turn="held")], ids=["asked", "held"])
def test_a_keep_releases_a_turn_that_no_write_waits_on(node: lc.Node) -> None:
    after, acts = stop(node, "auto", KEEPS)
    assert kinds(acts) == ["Note", "ReleaseTurn", "Finish"] and after.turn == "none"


# -- the deadlines -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("grace", [25.0, 45.0, 1.0])
def test_the_restore_deadlines_come_from_the_grace_period(grace: float) -> None:
    _, acts = lc.step(READY, lc.Stop(NOW, "signal", UNKNOWN), replace(OPTS, grace_period=grace))
    r = next(a for a in acts if isinstance(a, lc.Restore))
    assert 0 < r.confirm_wait <= lc.LEASE_CONFIRM_WAIT and r.confirm_wait <= 0.4 * grace
    # a later ask, once the API answered: longer, never shorter than the first's, within the same share
    assert r.confirm_wait <= r.answered_wait <= min(lc.LEASE_LATER_WAIT, max(r.confirm_wait, 0.4 * grace))
    assert r.answered_wait == lc.LEASE_LATER_WAIT or grace < lc.LEASE_LATER_WAIT / 0.4
    assert r.turn_until == NOW + lc.TURN_SHARE * grace
    end = NOW + grace - min(5.0, 0.2 * grace)
    assert r.restored_until == min(NOW + lc.RESTORED_SHARE * grace, end - 2.0) and r.restored_until < end
    assert r.turn_until < r.restored_until or grace < 10


@pytest.mark.parametrize("view, mode, coordinated, leader_last", [
    (GONE, "auto", True, True), (DELETING, "auto", True, True),  # every agent leaves: the leader last
    (GONE, "always", True, True),
    (replace(UNKNOWN, exists=True, deleting=True), "auto", True, True),  # seen deleting, its Node not read yet
    (ELSEWHERE, "auto", True, False),  # only this node leaves: nobody to let go first
    (UNKNOWN, "auto", True, False), (KEEPS, "always", True, False),
    (GONE, "auto", False, False),  # no rollout Lease: no turns at all
], ids=["gone", "deleting", "always-gone", "deleting-node-unread", "not-selected", "unknown", "always-selects",
        "not-coordinated"])
def test_the_leader_restores_last_only_when_every_agent_leaves(view: lc.DaemonSetView, mode: RestoreOnExit,
                                                               coordinated: bool, leader_last: bool) -> None:
    _, acts = lc.step(READY, lc.Stop(NOW, "signal", view),
                      replace(OPTS, restore_on_exit=mode, coordinated=coordinated))
    r = next(a for a in acts if isinstance(a, lc.Restore))
    assert r.leader_last is leader_last
    # Every agent asks for the turn at the same moment: a slow first answer is a loaded control plane (three real
    # nodes' uninstall restarted all three schedulers at once when it was taken for silence after 0.3 s).
    assert r.confirm_wait == (lc.LEASE_ANSWERED_WAIT if leader_last else lc.LEASE_CONFIRM_WAIT)
    # a later ask, once the API answered: the schedulers' own timeout for a Lease request, whoever leaves
    assert r.answered_wait == lc.LEASE_LATER_WAIT


PEER_STATES = st.sampled_from(["", *[s.value for s in NodeState]])


@settings(max_examples=200, deadline=None)
@given(leads=st.booleans(), known=st.booleans(),
       peers=st.lists(st.tuples(PEER_STATES, st.booleans()), max_size=4))
def test_the_stop_order_holds_back_only_a_leader_with_peers_still_to_restore(
        leads: bool, known: bool, peers: list[tuple[str, bool]]) -> None:
    view = lc.Schedulers(known, "me" if leads else "other", leads,
                         tuple(lc.Peer(f"n{i}", state, "", ready) for i, (state, ready) in enumerate(peers)))
    why = lc.stop_order_wait(view)
    to_go = [f"n{i}" for i, (state, _) in enumerate(peers) if state not in ("", "Restored", "Held")]
    assert bool(why) == (known and leads and bool(to_go))
    assert all(n in why for n in to_go) if why else True


def test_after_a_stop_nothing_but_the_restore_report_moves_the_node() -> None:
    stopped, _ = stop(WAITING, "always", KEEPS)
    events: list[lc.Event] = [lc.Planned(NOW, "pending", config_hash="d" * 64, manifest_change=True),
                              lc.TurnChanged(held=True, refused_bad=False), lc.ProbeDue(),
                              lc.Stop(NOW, "signal", KEEPS)]
    for event in events:
        assert lc.step(stopped, event, OPTS) == (stopped, [])


# -- the restore's report ----------------------------------------------------------------------------------


def test_a_restore_done_is_restored_then_release_then_the_final_report() -> None:
    stopped, _ = stop(replace(READY, record=replace(READY.record, bad_hashes=("b" * 64,))), "always", KEEPS)
    after, acts = lc.step(stopped, lc.RestoreDone(True, held=True), OPTS)
    assert after.phase == NodeState.RESTORED and after.record.bad_hashes == ("b" * 64,)
    assert not after.record.patched and not after.record.config_hash
    assert kinds(acts) == ["Count", "Publish", "ReleaseTurn", "Finish"] and acts[0] == lc.Count("restored")
    finish = acts[-1]
    assert isinstance(finish, lc.Finish) and finish.until == NOW + lc.STOP_ANSWERS and finish.code == 0


def test_a_restore_without_the_turn_releases_nothing() -> None:
    stopped, _ = stop(READY, "always", KEEPS)
    _, acts = lc.step(stopped, lc.RestoreDone(True, held=False), OPTS)
    assert kinds(acts) == ["Count", "Publish", "Finish"]


def test_a_failed_restore_exits_1_and_keeps_the_record() -> None:
    stopped, _ = stop(READY, "always", KEEPS)
    after, acts = lc.step(stopped, lc.RestoreDone(False, "read-only file system", held=True), OPTS)
    assert after.record == READY.record
    assert kinds(acts) == ["Error", "ReleaseTurn", "Finish"]
    assert acts[0] == lc.Error("restore")
    assert isinstance(acts[-1], lc.Finish) and acts[-1].code == 1
    assert any(isinstance(a, lc.Log) and "read-only file system" in a.message for a in acts)


def test_a_restore_the_api_did_not_answer_ends_the_stop_soon() -> None:
    """The API did not answer the Lease request: the final report would not get through either, so the stop
    gives it nothing past the stop's answers deadline."""
    stopped, _ = stop(READY, "always", KEEPS)
    _, acts = lc.step(stopped, lc.RestoreDone(True, now=NOW + 0.5, api_silent=True), OPTS)
    assert isinstance(acts[-1], lc.Finish) and acts[-1].until == NOW + lc.STOP_ANSWERS


def test_a_restore_that_waited_on_an_answering_api_gives_the_report_a_short_share() -> None:
    """Another node held the turn for seconds (the API answered all along): the release and the report get
    ``FINAL_REPORT`` after the restore, not the rest of the grace period."""
    stopped, _ = stop(READY, "always", KEEPS)
    _, acts = lc.step(stopped, lc.RestoreDone(True, now=NOW + 8.0), OPTS)
    assert isinstance(acts[-1], lc.Finish) and acts[-1].until == NOW + 8.0 + lc.FINAL_REPORT


@settings(max_examples=300, deadline=None)
@given(grace=st.floats(1.0, 600.0), mode=st.sampled_from(["always", "never", "auto"]),
       view=st.sampled_from([KEEPS, GONE, DELETING, ELSEWHERE, UNKNOWN]),
       node=st.sampled_from([READY, WAITING, PENDING]), ok=st.booleans(), silent=st.booleans(),
       took=st.floats(0.0, 0.6))
def test_whatever_the_api_does_the_stop_waits_for_no_answer_past_its_deadline(
        grace: float, mode: RestoreOnExit, view: lc.DaemonSetView, node: lc.Node, ok: bool, silent: bool,
        took: float) -> None:
    """SIGTERM -> exit within a second whatever the API does (an uninstall's first Lease request excepted: its
    LEASE_ANSWERED_WAIT): a stop whose restore took no longer than its own waits for an answer (the DaemonSet
    read, the Lease request) finishes (the release and the final
    report, which wait for the API) by ``STOP_ANSWERS`` after the stop, whatever the grace period (the
    exit took 21 s of a 25 s grace period with the API black-holed: the report waited for the rest of it)."""
    opts = replace(OPTS, grace_period=grace, restore_on_exit=mode)
    stopped, acts = lc.step(node, lc.Stop(NOW, "signal", view), opts)
    if not any(isinstance(a, lc.Restore) for a in acts):
        finish = acts[-1]
    else:
        restore = next(a for a in acts if isinstance(a, lc.Restore))
        # A lone stop's first ask within the answers deadline; an uninstall's gets LEASE_ANSWERED_WAIT (above).
        assert restore.leader_last or restore.confirm_wait + lc.OWNER_LOOKUP <= lc.STOP_ANSWERS + 1e-9
        _, acts = lc.step(stopped, lc.RestoreDone(ok, "refused", now=NOW + min(took, lc.STOP_ANSWERS - 1e-6),
                                                  api_silent=silent), opts)
        finish = acts[-1]
    assert isinstance(finish, lc.Finish) and finish.until <= NOW + lc.STOP_ANSWERS
