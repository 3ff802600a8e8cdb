"""``lifecycle.step``'s transition table, one test per row: event type × the phase, turn and wait it meets,
and the exact actions it returns. Pure: no files, no API, no clock (``now`` is data).

The rows follow ``patcher/core/lifecycle.py`` function by function; a new branch there needs its row here. The
stop rows (``Stop``) are tested with the stop protocol.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from patcher.core import lifecycle as lc
from patcher.core.restart import Verdict
from patcher.core.settings import Lifecycle
from patcher.core.state import LastGood, State
from patcher.core.status import NodeState

H1, H2 = "1" * 64, "2" * 64
SRC = "s" * 64
PATCHED = "p" * 64
OPTS = Lifecycle(restart_timeout=60.0, check_extenders=False)
COORD = replace(OPTS, coordinated=True)
CHECKS = replace(OPTS, check_extenders=True, probe_retry=2.0, probe_retry_max=5.0)
READY_CONFIG: dict[str, object] = {"config_hash": H1, "config_file": "config-111111111111.yaml",
                                   "files": ("config-111111111111.yaml",), "patched_sha256": PATCHED,
                                   "source_hash": SRC}
LAST_GOOD = LastGood(config_hash=H1, config_file="config-111111111111.yaml", files=("config-111111111111.yaml",),
                     source_hash=SRC)


def node(phase: NodeState | None = None, message: str | None = None, /, **fields: object) -> lc.Node:
    """A node in ``phase``; ``fields`` go to the record, except the Node's own (wait, turn, probing...)."""
    own = {k: fields.pop(k) for k in list(fields) if k in {f for f in lc.Node.__dataclass_fields__} - {"record"}}
    record = State(phase=phase.value if phase else "", message=message, **fields)  # type: ignore[arg-type]
    return lc.Node(record=record, **own)  # type: ignore[arg-type]


def waiting(*, turn: str = "none", probing: bool = False, checked: bool = False, deadline: float = 100.0,
            last_good: LastGood | None = None) -> lc.Node:
    return node(NodeState.WAITING_FOR_RESTART, **READY_CONFIG, manifest_mtime_ns=1_000, last_good=last_good,
                wait=lc.Wait(H1, 1_000, deadline, SRC, extenders_checked=checked, probing=probing), turn=turn)


def ready(**fields: object) -> lc.Node:
    return node(NodeState.READY, **{**READY_CONFIG, "last_good": LAST_GOOD, **fields})


def pending(config_hash: str = H1, *, manifest_change: bool = True) -> lc.Planned:
    return lc.Planned(5.0, "pending", config_hash=config_hash, config_file=f"config-{config_hash[:12]}.yaml",
                      source_hash=SRC, manifest_change=manifest_change)


def up_to_date(config_hash: str = H1) -> lc.Planned:
    return lc.Planned(5.0, "up-to-date", config_hash=config_hash, config_file=f"config-{config_hash[:12]}.yaml",
                      api_version="kubescheduler.config.k8s.io/v1", files=(f"config-{config_hash[:12]}.yaml",),
                      source_hash=SRC, current_sha256=PATCHED, unpatched_sha256="u" * 64, mtime_ns=2_000)


# -- the gates -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("event", [lc.Resumed(1.0), pending(), lc.Observed(1.0, 0, Verdict.READY, "r"),
                                   lc.ProbeDue(), lc.StateFolderFailed("x"), lc.StateFolderOk()])
def test_after_a_stop_every_event_but_stop_is_ignored(event: lc.Event) -> None:
    n = replace(waiting(), stopping=True)
    assert lc.step(n, event, OPTS) == (n, [])


@pytest.mark.parametrize("event", [lc.Resumed(1.0), pending(), up_to_date(), lc.Wrote(1.0, State(), True),
                                   lc.WriteFailed("x", False), lc.Observed(1.0, 0, Verdict.READY, "r"),
                                   lc.TurnChanged(held=True, refused_bad=False), lc.Probed(H1),
                                   lc.ProbeDue(), lc.RollbackDone("r", SRC, State(), "t"),
                                   lc.RollbackDone("r", SRC, error="m")])
def test_while_the_state_folder_refuses_the_record_only_its_own_events_pass(event: lc.Event) -> None:
    n = replace(waiting(), fault=lc.Fault("state folder unusable: x", 1, "WaitingForRestart", None))
    assert lc.step(n, event, OPTS) == (n, [])


# -- Resumed ---------------------------------------------------------------------------------------------------


def test_resumed_waiting_for_restart_adopts_the_wait() -> None:
    n = node(NodeState.WAITING_FOR_RESTART, **READY_CONFIG, manifest_mtime_ns=1_000)
    after, acts = lc.step(n, lc.Resumed(10.0), OPTS)
    assert after.wait == lc.Wait(H1, 1_000, 70.0, SRC, adopted=True) and after.turn == "none"
    assert acts == [lc.Watch()]  # the phase was already WaitingForRestart: nothing new to publish


def test_resumed_waiting_for_restart_coordinated_takes_the_turn_again() -> None:
    n = node(NodeState.WAITING_FOR_RESTART, **READY_CONFIG, manifest_mtime_ns=1_000)
    after, acts = lc.step(n, lc.Resumed(10.0), COORD)
    assert after.turn == "asked" and acts == [lc.TakeTurn(""), lc.Watch()]


def test_resumed_waiting_without_a_patch_forgets_the_phase() -> None:
    n = node(NodeState.WAITING_FOR_RESTART, config_hash=H1)
    after, acts = lc.step(n, lc.Resumed(10.0), OPTS)
    assert after.record.phase == "" and after.wait is None and acts == []


@pytest.mark.parametrize("phase", [NodeState.READY, NodeState.ROLLED_BACK, NodeState.FAILED])
def test_resumed_ready_rolled_back_or_failed_stands(phase: NodeState) -> None:
    n = node(phase, "why" if phase != NodeState.READY else None, **READY_CONFIG)
    assert lc.step(n, lc.Resumed(10.0), OPTS) == (n, [])


@pytest.mark.parametrize("phase", [None, NodeState.PENDING, NodeState.RESTORED])
def test_resumed_anything_else_starts_without_a_phase(phase: NodeState | None) -> None:
    after, acts = lc.step(node(phase), lc.Resumed(10.0), OPTS)
    assert after.record.phase == "" and acts == []


# -- Planned ---------------------------------------------------------------------------------------------------


def test_planned_known_bad_only_logs() -> None:
    n = ready()
    assert lc.step(n, lc.Planned(5.0, "known-bad", message="m"), OPTS) == (
        n, [lc.Count("reconciled"), lc.Log("info", "not retrying a config that was rolled back: m")])


def test_planned_refused_not_waiting_fails() -> None:
    after, acts = lc.step(ready(), lc.Planned(5.0, "refused", message="bad", error_kind="config"), OPTS)
    assert after.phase == NodeState.FAILED and after.record.message == "bad; nothing was changed"
    assert acts == [lc.Count("reconciled"), lc.Error("config"), lc.Log("error", "bad"), lc.Publish(None)]


def test_planned_refused_while_waiting_leaves_the_wait() -> None:
    n = waiting()
    assert lc.step(n, lc.Planned(5.0, "refused", message="bad", error_kind="manifest"), OPTS) == (
        n, [lc.Count("reconciled"), lc.Error("manifest"), lc.Log("error", "bad")])


@pytest.mark.parametrize("n", [ready(), waiting(), node(NodeState.ROLLED_BACK, "r", **READY_CONFIG)])
def test_planned_up_to_date_in_a_settled_phase_or_waiting_changes_nothing(n: lc.Node) -> None:
    assert lc.step(n, up_to_date(), OPTS) == (n, [lc.Count("reconciled")])


def test_planned_up_to_date_with_a_config_that_was_ready_here_is_ready_at_once() -> None:
    n = node(NodeState.FAILED, "typo; nothing was changed", last_good=LAST_GOOD)
    after, acts = lc.step(n, up_to_date(), OPTS)
    assert after.phase == NodeState.READY and after.record.message is None and after.wait is None
    assert after.record.patched_sha256 == PATCHED and after.record.config_hash == H1
    assert acts == [lc.Count("reconciled"), lc.Log("info", f"manifest carries config {H1[:12]}, which was Ready "
                                                           "before; back to Ready"), lc.Publish(None)]


@pytest.mark.parametrize("phase", [None, NodeState.PENDING, NodeState.FAILED])
def test_planned_up_to_date_otherwise_adopts_the_patch_and_waits(phase: NodeState | None) -> None:
    after, acts = lc.step(node(phase), up_to_date(H2), OPTS)
    assert after.wait == lc.Wait(H2, 2_000, 65.0, SRC, adopted=True)
    assert after.phase == NodeState.WAITING_FOR_RESTART and after.record.manifest_mtime_ns == 2_000
    assert acts == [lc.Count("reconciled"), lc.Log("info", f"manifest already patched with config {H2[:12]}; "
                                                           "adopting it without a write"),
                    lc.Publish("SchedulerAdopted"), lc.Watch()]


def test_planned_pending_with_the_pre_flight_probes_first() -> None:
    after, acts = lc.step(node(), pending(), CHECKS)
    assert after.probing == H1 and after.phase == NodeState.PENDING
    assert acts == [lc.Count("reconciled"), lc.Probe(H1), lc.Publish(None)]


def test_planned_pending_while_its_probe_runs_waits_for_the_answer() -> None:
    n = node(NodeState.PENDING, probing=H1)
    assert lc.step(n, pending(), CHECKS) == (n, [lc.Count("reconciled")])


def test_planned_pending_coordinated_asks_for_the_turn() -> None:
    after, acts = lc.step(node(), pending(), COORD)
    assert after.turn == "asked" and after.phase == NodeState.PENDING
    assert acts == [lc.Count("reconciled"), lc.TakeTurn(SRC), lc.Publish(None)]


def test_planned_pending_coordinated_holding_the_turn_writes() -> None:
    after, acts = lc.step(node(turn="held"), pending(), COORD)
    assert after.phase == NodeState.PENDING and acts == [lc.Count("reconciled"), lc.Publish(None), lc.Apply()]


def test_planned_pending_back_to_the_last_ready_config_needs_no_turn() -> None:
    n = node(NodeState.ROLLED_BACK, "r", last_good=LAST_GOOD)
    after, acts = lc.step(n, pending(H1), COORD)
    assert after.turn == "none" and acts == [lc.Count("reconciled"), lc.Publish(None), lc.Apply()]


def test_planned_pending_config_files_only_writes_without_a_phase_change() -> None:
    n = ready()
    assert lc.step(n, pending(manifest_change=False), COORD) == (n, [lc.Count("reconciled"), lc.Apply()])


def test_planned_pending_already_pending_writes_without_publishing_again() -> None:
    n = node(NodeState.PENDING)
    assert lc.step(n, pending(), OPTS) == (n, [lc.Count("reconciled"), lc.Apply()])


# -- TurnChanged -----------------------------------------------------------------------------------------------


def test_turn_held_plans_again() -> None:
    after, acts = lc.step(node(NodeState.PENDING, turn="asked"), lc.TurnChanged(held=True, refused_bad=False), COORD)
    assert after.turn == "held" and acts == [lc.Replan()]


def test_turn_refused_for_a_source_rolled_back_elsewhere_marks_the_config_once() -> None:
    n = ready(turn="asked")
    after, acts = lc.step(n, lc.TurnChanged(held=False, refused_bad=True, config_hash=H2), COORD)
    assert after.turn == "none" and after.record.bad_hashes == (H2,) and after.phase == NodeState.READY
    log = lc.Log("warning", f"this source was rolled back on another node; not trying config {H2[:12]} here")
    assert acts == [log, lc.Note("PatchSkipped", f"config {H2[:12]} was rolled back on another node; this node "
                                                 "keeps its current config", warning=True)]
    again, acts = lc.step(replace(after, turn="asked"), lc.TurnChanged(held=False, refused_bad=True,
                                                                              config_hash=H2), COORD)
    assert acts == [log] and again.record.bad_hashes == (H2,)


@pytest.mark.parametrize("event", [lc.TurnChanged(held=False, refused_bad=False, config_hash=H2),
                                   lc.TurnChanged(held=False, refused_bad=True)])
def test_turn_not_held_and_nothing_refused_changes_nothing(event: lc.TurnChanged) -> None:
    n = node(NodeState.PENDING, turn="asked")
    assert lc.step(n, event, COORD) == (n, [])


# -- Wrote -----------------------------------------------------------------------------------------------------


def test_wrote_the_manifest_waits_for_the_restart() -> None:
    record = State(phase="Pending", **READY_CONFIG, manifest_mtime_ns=3_000, restarted_at_ns=7)  # type: ignore[arg-type]
    after, acts = lc.step(node(NodeState.PENDING, turn="held"), lc.Wrote(10.0, record, manifest_change=True), COORD)
    assert after.wait == lc.Wait(H1, 3_000, 70.0, SRC) and after.phase == NodeState.WAITING_FOR_RESTART
    assert after.record.restarted_at_ns is None and after.turn == "held"
    assert acts == [lc.Count("wrote"), lc.Publish(None), lc.Watch()]


def test_wrote_config_files_only_keeps_the_phase() -> None:
    n = ready()
    record = replace(n.record, written=("config-111111111111.yaml",))
    after, acts = lc.step(n, lc.Wrote(10.0, record, manifest_change=False), OPTS)
    assert after.record == record and after.wait is None and acts == [lc.Count("wrote")]


# -- WriteFailed -----------------------------------------------------------------------------------------------


def test_write_failed_because_the_manifest_changed_underneath_plans_again() -> None:
    after, acts = lc.step(node(NodeState.PENDING, turn="held"), lc.WriteFailed("m", changed_underneath=True), COORD)
    assert after.turn == "none" and after.phase == NodeState.PENDING
    assert acts == [lc.ReleaseTurn(None), lc.Log("info", "m; planning again"), lc.Replan()]


def test_write_failed_not_waiting_fails() -> None:
    after, acts = lc.step(node(NodeState.PENDING, turn="held"), lc.WriteFailed("m", changed_underneath=False), COORD)
    assert after.phase == NodeState.FAILED and after.record.message == "m; nothing was changed"
    assert acts == [lc.ReleaseTurn(None), lc.Error("write"), lc.Log("error", "m"), lc.Publish(None)]


def test_write_failed_while_waiting_keeps_the_wait() -> None:
    after, acts = lc.step(waiting(), lc.WriteFailed("m", changed_underneath=False), OPTS)
    assert after == waiting() and acts == [lc.Error("write"), lc.Log("error", "m")]


# -- Observed --------------------------------------------------------------------------------------------------


def test_observed_without_a_wait_is_ignored() -> None:
    n = ready()
    assert lc.step(n, lc.Observed(1.0, 0, Verdict.READY, "r"), OPTS) == (n, [])


def test_observed_ready_with_the_extender_check_probes_once_more() -> None:
    after, acts = lc.step(waiting(), lc.Observed(1.0, 0, Verdict.READY, "r"), CHECKS)
    assert after.wait is not None and after.wait.probing and after.phase == NodeState.WAITING_FOR_RESTART
    assert acts == [lc.Log("info", f"kube-scheduler runs config {H1[:12]}; probing its extenders again before "
                                   "the rollout moves on"), lc.Probe(H1)]


def test_observed_ready_while_that_probe_runs_waits_for_it() -> None:
    n = waiting(probing=True)
    assert lc.step(n, lc.Observed(1.0, 0, Verdict.READY, "r"), CHECKS) == (n, [])


@pytest.mark.parametrize("opts,checked", [(OPTS, False), (CHECKS, True)])
def test_observed_ready_is_ready_prunes_and_passes_the_turn(opts: Lifecycle, checked: bool) -> None:
    after, acts = lc.step(waiting(turn="held", checked=checked), lc.Observed(1.0, 3_001_000, Verdict.READY, "seen"),
                          replace(opts, coordinated=True))
    assert after.phase == NodeState.READY and after.wait is None and after.turn == "none"
    assert after.record.last_good == LastGood(H1, "config-111111111111.yaml", ("config-111111111111.yaml",), SRC)
    assert after.record.restarted_at_ns == 3_001_000
    assert acts == [lc.RestartSeen(0.003), lc.Prune(), lc.Log("info", f"kube-scheduler runs config "
                                                                              f"{H1[:12]}: seen"),
                    lc.Publish(None), lc.ReleaseTurn(None)]


def test_observed_ready_unverified_has_no_duration() -> None:
    _, acts = lc.step(waiting(), lc.Observed(1.0, 5_000, Verdict.READY, lc.UNVERIFIED), OPTS)
    assert acts == [lc.Prune(), lc.Log("info", f"kube-scheduler runs config {H1[:12]}: {lc.UNVERIFIED}"),
                    lc.Publish(None)]


def test_pruned_records_the_remaining_files_and_nothing_else() -> None:
    """The prune's report is a transition of its own (the executor saves it once, like any other); before,
    the prune changed the record behind the step and the Ready transition saved it a second time."""
    n = ready()
    record = replace(n.record, files=("config-111111111111.yaml",))
    assert lc.step(n, lc.Pruned(record), OPTS) == (replace(n, record=record), [])


def test_observed_crash_loop_checks_the_last_ready_config_to_roll_back_to() -> None:
    earlier = replace(LAST_GOOD, config_hash=H2, config_file="config-222222222222.yaml")
    n = waiting(turn="held", last_good=earlier)
    after, acts = lc.step(n, lc.Observed(1.0, 0, Verdict.CRASH_LOOPING, "exit 1"), COORD)
    assert after.wait is None and after.record.bad_hashes == (H1,) and after.turn == "held"
    assert acts == [lc.Count("rolled_back"), lc.CheckLastGood(f"kube-scheduler crash-loops with config "
                                                              f"{H1[:12]} (exit 1)", SRC, earlier)]


def test_observed_crash_loop_of_the_last_ready_config_itself_rolls_back_to_the_original() -> None:
    _, acts = lc.step(waiting(last_good=LAST_GOOD), lc.Observed(1.0, 0, Verdict.CRASH_LOOPING, "exit 1"), OPTS)
    assert acts == [lc.Count("rolled_back"), lc.RollBack(f"kube-scheduler crash-loops with config {H1[:12]} "
                                                         "(exit 1)", SRC, LAST_GOOD, target="original")]


# -- LastGoodChecked: the step chooses the rollback's target ---------------------------------------------------


def test_last_good_that_fits_is_the_rollback_target() -> None:
    check = lc.CheckLastGood("why", SRC, LAST_GOOD)
    n = node(turn="held")
    assert lc.step(n, lc.LastGoodChecked(check, True), COORD) == (
        n, [lc.RollBack("why", SRC, LAST_GOOD, target="last-good")])


def test_last_good_that_does_not_fit_makes_the_original_the_target_and_says_why() -> None:
    check = lc.CheckLastGood("why", SRC, LAST_GOOD)
    n = node(turn="held")
    assert lc.step(n, lc.LastGoodChecked(check, False, "the manifest changed since config x was Ready"), COORD) == (
        n, [lc.Log("warning", "the manifest changed since config x was Ready; rolling back to the original"),
            lc.RollBack("why", SRC, LAST_GOOD, target="original")])


def test_observed_crash_loop_with_rollback_disabled_fails_and_passes_the_turn_with_the_source() -> None:
    after, acts = lc.step(waiting(turn="held"), lc.Observed(1.0, 0, Verdict.CRASH_LOOPING, "exit 1"),
                          replace(COORD, rollback_on_failure=False))
    reason = f"kube-scheduler crash-loops with config {H1[:12]} (exit 1)"
    assert after.phase == NodeState.FAILED and after.record.message == reason and after.turn == "none"
    assert acts == [lc.Count("rolled_back"), lc.Log("error", f"{reason}; rollback disabled"), lc.Publish(None),
                    lc.ReleaseTurn(SRC)]


def test_observed_past_the_deadline_rolls_back() -> None:
    _, acts = lc.step(waiting(), lc.Observed(100.0, 0, Verdict.WAITING, "not yet"), OPTS)
    assert acts == [lc.Count("rolled_back"), lc.RollBack(f"kube-scheduler did not come back Ready with config "
                                                         f"{H1[:12]} within 60s (not yet)", SRC, None)]


@pytest.mark.parametrize("now,blind", [(50.0, False), (50.0, True), (100.0, True), (159.9, True)])
def test_observed_waiting_before_the_deadline_or_blind_within_one_more_timeout_waits(now: float, blind: bool) -> None:
    assert lc.step(waiting(), lc.Observed(now, 0, Verdict.WAITING, "not yet", blind=blind), OPTS) == (waiting(), [])


# -- RollbackDone ----------------------------------------------------------------------------------------------


def test_rollback_done_is_rolled_back_and_passes_the_turn_with_the_source() -> None:
    record = State(phase="WaitingForRestart", config_hash=H2, bad_hashes=(H1,))
    after, acts = lc.step(node(turn="held"), lc.RollbackDone("why", SRC, record, "the original manifest"), COORD)
    message = "why; rolled back to the original manifest"
    assert after.phase == NodeState.ROLLED_BACK and after.record == replace(record, phase="RolledBack",
                                                                           message=message)
    assert acts == [lc.Log("error", message), lc.Publish(None), lc.ReleaseTurn(SRC)]


def test_rollback_failed_is_failed_and_passes_the_turn_with_the_source() -> None:
    after, acts = lc.step(node(turn="held"), lc.RollbackDone("why", SRC, error="disk"), COORD)
    assert after.phase == NodeState.FAILED and after.record.message == "why; rollback failed: disk"
    assert acts == [lc.Error("rollback"), lc.Log("error", "rollback failed: disk"), lc.Publish(None),
                    lc.ReleaseTurn(SRC)]


# -- Probed ----------------------------------------------------------------------------------------------------

DOWN = "extender http://x/filter does not answer: connection refused"


def test_probed_after_the_restart_failing_rolls_back_like_a_crash_loop() -> None:
    _, acts = lc.step(waiting(probing=True), lc.Probed(H1, blocking=DOWN), CHECKS)
    assert acts == [lc.Count("rolled_back"), lc.RollBack(f"{DOWN} after kube-scheduler restarted with config "
                                                         f"{H1[:12]}", SRC, None)]


def test_probed_after_the_restart_answering_lets_the_next_check_make_it_ready() -> None:
    after, acts = lc.step(waiting(probing=True), lc.Probed(H1), CHECKS)
    assert after.wait == lc.Wait(H1, 1_000, 100.0, SRC, extenders_checked=True) and acts == []


def test_probed_after_the_restart_with_an_ignorable_one_down_warns_and_keeps() -> None:
    after, acts = lc.step(waiting(probing=True), lc.Probed(H1, ignored=DOWN), CHECKS)
    warning = f"{DOWN} after kube-scheduler restarted with config {H1[:12]}; ignorable, kept"
    assert after.wait is not None and after.wait.extenders_checked
    assert acts == [lc.Log("warning", warning), lc.Note("ExtenderUnreachable", warning, warning=True)]


def test_probed_for_a_config_no_longer_wanted_is_ignored() -> None:
    n = node(NodeState.PENDING, probing=H2)
    assert lc.step(n, lc.Probed(H1), CHECKS) == (n, [])


def test_probed_while_ready_an_extender_that_stopped_answering_keeps_ready_with_a_message() -> None:
    after, acts = lc.step(ready(probing=H1, periodic=True), lc.Probed(H1, blocking=DOWN), CHECKS)
    message = f"{lc.STOPPED_ANSWERING}: {DOWN}"
    assert after.phase == NodeState.READY and after.record.message == message and after.probing == ""
    assert acts == [lc.Error("extender"), lc.Log("warning", message),
                    lc.Note("ExtenderUnreachable", message, warning=True), lc.Publish(None)]
    again, acts = lc.step(replace(after, probing=H1, periodic=True), lc.Probed(H1, blocking=DOWN),
                         CHECKS)
    assert again.record == after.record and acts == [lc.Error("extender")]  # the same: no Event spam
    back, acts = lc.step(replace(after, probing=H1, periodic=True), lc.Probed(H1), CHECKS)
    assert back.record.message is None and acts == [lc.Log("info", "the extenders answer again"), lc.Publish(None)]


def test_probed_while_ready_answering_as_before_says_nothing() -> None:
    after, acts = lc.step(ready(probing=H1, periodic=True), lc.Probed(H1), CHECKS)
    assert after == ready() and acts == []


def test_probed_pre_flight_blocked_stays_pending_and_retries_later() -> None:
    after, acts = lc.step(node(probing=H2), lc.Probed(H2, blocking=DOWN), CHECKS)
    message = f"{DOWN}; config {H2[:12]} not written"
    assert after.phase == NodeState.PENDING and after.record.message == message
    assert (after.probe_failures, after.failed_probe, after.probing) == (1, H2, "")
    assert acts == [lc.Error("extender"), lc.Log("warning", f"{message}; probing again in 2s"),
                    lc.Note("ExtenderUnreachable", message, warning=True), lc.Publish(None), lc.RetryLater(2.0)]


def test_probed_pre_flight_answering_plans_again_and_clears_the_sentence() -> None:
    n = node(NodeState.PENDING, "old sentence", probing=H2, probe_failures=2, failed_probe=H2)
    after, acts = lc.step(n, lc.Probed(H2), CHECKS)
    assert after.probed == H2 and after.probe_failures == 0 and after.record.message is None
    assert acts == [lc.Log("info", f"the extenders of config {H2[:12]} answer now; patching"), lc.Publish(None),
                    lc.Replan()]


def test_probed_pre_flight_with_an_ignorable_one_down_writes_with_a_warning() -> None:
    after, acts = lc.step(node(probing=H2), lc.Probed(H2, ignored=DOWN), CHECKS)
    warning = f"{DOWN}; ignorable, so config {H2[:12]} is written anyway"
    assert after.record.extender_warning == warning and after.probed == H2
    assert acts == [lc.Log("warning", warning), lc.Note("ExtenderUnreachable", warning, warning=True), lc.Replan()]


# -- ProbeDue --------------------------------------------------------------------------------------------------


def test_probe_due_while_ready_probes_the_running_config() -> None:
    after, acts = lc.step(ready(), lc.ProbeDue(), CHECKS)
    assert after.probing == H1 and acts == [lc.Probe(H1)]


@pytest.mark.parametrize("n,opts", [(ready(), OPTS), (waiting(), CHECKS), (ready(probing=H2), CHECKS),
                                    (node(NodeState.FAILED, "x", **READY_CONFIG), CHECKS),
                                    (node(NodeState.READY), CHECKS)])
def test_probe_due_otherwise_does_nothing(n: lc.Node, opts: Lifecycle) -> None:
    assert lc.step(n, lc.ProbeDue(), opts) == (n, [])


# -- StateFolderFailed / StateFolderOk -------------------------------------------------------------------------

ROFS = "state folder unusable: /var/lib/scheduler-patcher: cannot write in this folder: Read-only file system"
FULL = "state folder unusable: /var/lib/scheduler-patcher/state.json: write failed: No space left on device"


def test_state_folder_failed_fails_names_the_folder_passes_an_unused_turn_and_retries() -> None:
    n = node(NodeState.PENDING, turn="held", probing=H2)
    after, acts = lc.step(n, lc.StateFolderFailed(ROFS), COORD)
    message = f"{ROFS}; {lc.STATE_FOLDER_WAIT}"
    assert after.phase == NodeState.FAILED and after.record.message == message
    assert after.fault == lc.Fault(ROFS, 1, "Pending", None) and after.turn == "none" and after.probing == ""
    assert acts == [lc.Error("state"), lc.Log("error", f"{ROFS}; trying again in 2s"),
                    lc.Note("StateFolderFailed", message, warning=True), lc.ReleaseTurn(None), lc.Publish(None),
                    lc.RetryLater(2.0, "state-folder")]


def test_state_folder_failed_while_waiting_keeps_the_wait_and_the_turn() -> None:
    after, acts = lc.step(waiting(turn="held"), lc.StateFolderFailed(FULL), COORD)
    assert after.wait == waiting().wait and after.turn == "held" and after.phase == NodeState.FAILED
    assert after.fault == lc.Fault(FULL, 1, "WaitingForRestart", None)
    assert lc.ReleaseTurn(None) not in acts and acts[-1] == lc.RetryLater(2.0, "state-folder")


def test_state_folder_failed_again_doubles_the_delay_up_to_the_cap_without_saying_it_again() -> None:
    opts = replace(OPTS, state_retry=2.0, state_retry_max=60.0)
    n, _ = lc.step(ready(), lc.StateFolderFailed(ROFS), opts)
    delays = []
    for _ in range(6):
        n, acts = lc.step(n, lc.StateFolderFailed(ROFS), opts)
        assert [type(a).__name__ for a in acts] == ["Error", "Log", "RetryLater"]  # no Note, no Publish
        delays.append(acts[-1])
    assert delays == [lc.RetryLater(d, "state-folder") for d in (4.0, 8.0, 16.0, 32.0, 60.0, 60.0)]
    assert n.fault == lc.Fault(ROFS, 7, "Ready", None)  # what it said before the first failure


def test_state_folder_failed_with_another_error_says_so() -> None:
    n, _ = lc.step(ready(), lc.StateFolderFailed(ROFS), OPTS)
    after, acts = lc.step(n, lc.StateFolderFailed(FULL), OPTS)
    message = f"{FULL}; {lc.STATE_FOLDER_WAIT}"
    assert after.record.message == message and after.fault == lc.Fault(FULL, 2, "Ready", None)
    assert acts == [lc.Error("state"), lc.Log("error", f"{FULL}; trying again in 4s"),
                    lc.Note("StateFolderFailed", message, warning=True), lc.Publish(None),
                    lc.RetryLater(4.0, "state-folder")]


def test_state_folder_ok_says_again_what_the_node_said_and_plans_again() -> None:
    n, _ = lc.step(ready(), lc.StateFolderFailed(ROFS), OPTS)
    n, _ = lc.step(n, lc.StateFolderFailed(ROFS), OPTS)
    after, acts = lc.step(n, lc.StateFolderOk(), OPTS)
    assert after == ready()
    assert acts == [lc.Log("info", "the state folder takes the record again after 2 failed attempts; the node is "
                                   "Ready"), lc.Publish(None), lc.Replan()]


def test_state_folder_ok_for_a_node_that_had_said_nothing_yet_is_pending() -> None:
    n, _ = lc.step(node(), lc.StateFolderFailed(ROFS), OPTS)
    after, acts = lc.step(n, lc.StateFolderOk(), OPTS)
    assert after.phase == NodeState.PENDING and after.record.message is None and after.fault is None
    assert acts == [lc.Log("info", "the state folder takes the record again after 1 failed attempt; the node is "
                                   "Pending"), lc.Publish(None), lc.Replan()]


def test_state_folder_ok_without_a_fault_changes_nothing() -> None:
    assert lc.step(ready(), lc.StateFolderOk(), OPTS) == (ready(), [])
