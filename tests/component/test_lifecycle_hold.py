"""The operator's hold (``<prefix>/hold`` on the Node, as kured's lock): while it is there the agent leaves the
node as it is: no write, no turn, no prune, no restore on SIGTERM; once it is removed the agent takes the node back.

The decision is ``lifecycle.step`` (pure: a Hypothesis property over event sequences), the executor lets go of the
writer lock so a hand ``restore`` runs on the node (real files, another thread as the hand writer), and the watch of
the Node is ``adapters/kube/nodehold`` against the API emulator.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from patcher.adapters import fsio
from patcher.adapters.kube.nodehold import NodeHoldWatcher
from patcher.adapters.kube.transport import Api
from patcher.commands.cli import main as cli_main
from patcher.core import lifecycle
from patcher.core.lifecycle import (
    DaemonSetView,
    HoldChanged,
    LetGo,
    LoopEvent,
    Node,
    Publish,
    Reclaim,
    Reclaimed,
    ReleaseTurn,
    Restore,
    Stop,
)
from patcher.core.restart import Verdict
from patcher.core.settings import Files, Lifecycle
from patcher.core.state import LastGood, State
from patcher.core.status import NodeState
from patcher.services.agent import Agent
from patcher.services.observations import node_status
from patcher.services.record import writer_lock
from tests.component.test_agent_executor import SECOND
from tests.component.test_lifecycle_stateful import FakeKubelet
from tests.conftest import write_configmap
from tests.harness import helpers
from tests.harness.emu.kubeemu import wait_until
from tests.harness.emu.kubeemu_ext import KubeEmulatorExt
from tests.harness.settings import build_settings

H = "a" * 64
OPTS = Lifecycle(restart_timeout=600.0, coordinated=True, check_extenders=False, restore_on_exit="auto")
PATCHED = State(manifest="/m", config_hash=H, files=("/c/config-aaaaaaaaaaaa.yaml",), patched_sha256="p",
                original_sha256="o", manifest_mtime_ns=1, phase="WaitingForRestart", source_hash="s" * 64)


#: What a held node never gets: the writes (patch, rollback, prune, restore) and what leads to one (the turn, a
#: re-plan, the pre-flight and its retry, the rollback's check, the restart's watch).
NOT_WHILE_HELD: tuple[type, ...] = (lifecycle.Apply, lifecycle.TakeTurn, lifecycle.RollBack, lifecycle.Prune,
                                    lifecycle.Restore, lifecycle.Replan, lifecycle.Probe, lifecycle.RetryLater,
                                    lifecycle.CheckLastGood, lifecycle.Watch)


def writes(actions: list[lifecycle.Action]) -> list[lifecycle.Action]:
    return [a for a in actions if isinstance(a, NOT_WHILE_HELD)]


# -- the step --------------------------------------------------------------------------------------------


def test_a_hold_forgets_the_wait_gives_the_turn_back_and_lets_go() -> None:
    waiting = replace(Node(record=PATCHED), turn="held",
                      wait=lifecycle.Wait(H, 1, deadline=100.0, source_hash="s" * 64))
    node, acts = lifecycle.step(waiting, HoldChanged("alice: debugging"), OPTS)
    assert node.hold == "alice: debugging" and node.wait is None and node.turn == "none"
    assert node.record == PATCHED  # nothing of the record changes: the files stay what they are
    assert [type(a) for a in acts] == [lifecycle.Log, ReleaseTurn, LetGo, Publish]
    assert acts[-1] == Publish("NodeHeld")
    # a deadline that passes while held rolls nothing back: there is no wait any more, and events are dropped
    after, acts = lifecycle.step(node, lifecycle.Observed(700.0, 0, Verdict.CRASH_LOOPING, "crash"), OPTS)
    assert after == node and acts == []
    # a new value of the hold (who, why) is said again, without letting go twice
    node2, acts = lifecycle.step(node, HoldChanged("bob"), OPTS)
    assert node2.hold == "bob" and LetGo() not in acts and Publish("NodeHeld") in acts


@pytest.mark.parametrize("mode", ["auto", "always"])
def test_a_stop_while_held_keeps_the_node_as_it_is(mode: Literal["auto", "always"]) -> None:
    """An uninstall (the DaemonSet gone) or --restore-on-exit=always restore a node, but not a held one."""
    opts = replace(OPTS, restore_on_exit=mode)
    held = replace(Node(record=replace(PATCHED, phase="Ready")), hold="")
    gone = DaemonSetView(known=True, exists=False, name="scheduler-patcher")
    _, unheld = lifecycle.step(replace(held, hold=None), Stop(10.0, "signal", gone), opts)
    assert any(isinstance(a, Restore) for a in unheld)
    _, acts = lifecycle.step(held, Stop(10.0, "signal", gone), opts)
    assert not any(isinstance(a, Restore) for a in acts)
    (keep,) = [a for a in acts if isinstance(a, lifecycle.Note) and a.reason == "PatchKept"]
    assert "held" in keep.message and isinstance(acts[-1], lifecycle.Finish)


def test_the_hold_removed_takes_the_node_back_from_the_record_on_disk() -> None:
    held = replace(Node(record=PATCHED), hold="x")
    node, acts = lifecycle.step(held, HoldChanged(None), OPTS)
    assert node.hold is None and acts[-1] == Reclaim()
    # a hand restore cleared the record: the agent plans as a fresh one would (and re-patches through its turn)
    node2, acts = lifecycle.step(node, Reclaimed(6.0, State()), OPTS)
    assert node2.record == State() and node2.wait is None and acts == [lifecycle.Replan()]
    # the record still says a write waits for its restart: that wait is adopted again, with a full timeout
    node3, acts = lifecycle.step(node, Reclaimed(6.0, PATCHED), OPTS)
    assert node3.wait is not None and node3.wait.deadline == 606.0 and node3.turn == "asked"
    assert acts[-1] == lifecycle.Replan() and Publish("HoldReleased") in acts


def test_the_node_says_held_with_the_hold_in_its_message() -> None:
    status = node_status(replace(Node(record=replace(PATCHED, phase="Ready")), hold="alice: INC-42"))
    assert status.state == NodeState.HELD and status.config_hash == H
    assert status.message == lifecycle.HELD_MESSAGE + " (alice: INC-42)"
    assert node_status(replace(Node(), hold="")).message == lifecycle.HELD_MESSAGE  # also before any phase


# A Hypothesis property: whatever happens while the node is held, the step emits no write action.

HASHES = st.sampled_from([H, "b" * 64])
EVENTS = st.one_of(
    st.builds(lifecycle.Resumed, now=st.floats(0, 1000)),
    st.builds(lifecycle.Planned, now=st.floats(0, 1000),
              kind=st.sampled_from(["refused", "known-bad", "up-to-date", "pending"]), config_hash=HASHES,
              source_hash=HASHES, manifest_change=st.booleans()),
    st.builds(lifecycle.Wrote, now=st.floats(0, 1000), record=st.just(PATCHED), manifest_change=st.booleans()),
    st.builds(lifecycle.WriteFailed, message=st.just("boom"), changed_underneath=st.booleans()),
    st.builds(lifecycle.Observed, now=st.floats(0, 2000), wall_ns=st.just(0), verdict=st.sampled_from(list(Verdict)),
              reason=st.just("r")),
    st.builds(lifecycle.TurnChanged, held=st.booleans(), refused_bad=st.booleans(), config_hash=HASHES),
    st.builds(lifecycle.Pruned, record=st.just(PATCHED)),
    st.builds(lifecycle.Probed, config_hash=HASHES,
              blocking=st.sampled_from(["", "extender x does not answer"])),
    st.builds(lifecycle.ProbeDue),
    st.builds(lifecycle.LastGoodChecked, fits=st.booleans(), check=st.just(
        lifecycle.CheckLastGood("r", "s", LastGood(H, "/c/config-aaaaaaaaaaaa.yaml")))),
    st.builds(lifecycle.RollbackDone, record=st.just(PATCHED), target=st.just("the original manifest"),
              reason=st.just("r"), bad_source=st.just("s")),
    st.builds(lifecycle.RollbackDone, error=st.just("m"), reason=st.just("r"), bad_source=st.just("s")),
    st.builds(lifecycle.StateFolderFailed, message=st.just("read-only")),
    st.builds(lifecycle.StateFolderOk),
    st.builds(HoldChanged, hold=st.one_of(st.none(), st.sampled_from(["", "alice"]))),
    st.builds(Reclaimed, now=st.floats(0, 1000), record=st.sampled_from([State(), PATCHED])),
    st.builds(Stop, now=st.floats(0, 1000),
              daemonset=st.sampled_from([DaemonSetView(), DaemonSetView(True, False, name="ds")])),
)


@settings(max_examples=300, deadline=None)
@given(events=st.lists(EVENTS, max_size=30),
       mode=st.sampled_from(["auto", "always", "never"]), coordinated=st.booleans())
def test_while_held_no_write_action_is_ever_emitted(events: list[lifecycle.Event],
                                                    mode: Literal["auto", "always", "never"],
                                                    coordinated: bool) -> None:
    opts = replace(OPTS, restore_on_exit=mode, coordinated=coordinated)
    node = Node()
    for event in events:
        held_before, stopping = node.hold is not None, node.stopping
        try:
            node, acts = lifecycle.step(node, event, opts)
        except AssertionError:
            continue  # an event this state cannot take (the step refuses it): not a hold question
        if held_before or node.hold is not None:
            assert not writes(acts), (event, acts)
            assert node.turn == "none" and node.wait is None
        if held_before and isinstance(event, Stop) and not stopping:
            assert any(isinstance(a, lifecycle.Note) and a.reason == "PatchKept" for a in acts)


# -- the executor on real files ----------------------------------------------------------------------------


class Hold:
    """The HoldSource port: what the Node's watch says now."""

    def __init__(self) -> None:
        self.value: str | None = None

    def hold(self) -> str | None:
        return self.value

    def known(self) -> bool:
        return True


def lock_free(files: Files) -> bool:
    """Whether another writer (here: another thread) could take the node's writer lock right now."""
    result: list[bool] = []

    def take() -> None:
        try:
            with writer_lock(replace(files, lock_wait=0.0)):
                result.append(True)
        except fsio.LockBusy:
            result.append(False)

    t = threading.Thread(target=take)
    t.start()
    t.join(10)
    return result == [True]


@pytest.fixture
def node_agent(tmp_path: Path) -> Iterator[tuple[Agent, Path, Path, Hold]]:
    root, src = helpers.node_folders(tmp_path)
    kubelet = FakeKubelet(root)
    kubelet.sync()
    files = Files(source=src, host_root=root)
    agent = Agent(build_settings(files=files, node_name="cp-1", restart_timeout=3600.0, restart_settle=0.0,
                                 check_extenders=False), pods=kubelet)
    hold = Hold()
    agent.world.holds = hold
    with contextlib.ExitStack() as stack:
        assert agent.record.hold_for_life(stack, agent.metrics)  # as process.run does
        agent.start()
        kubelet.sync()
        agent.notify(LoopEvent.POD)  # what a mirror pod update does
        assert agent.turn() is LoopEvent.POD
        assert agent.node.phase == NodeState.READY
        yield agent, root, src, hold


def test_a_held_agent_lets_a_hand_restore_run_and_writes_nothing_until_released(
        node_agent: tuple[Agent, Path, Path, Hold]) -> None:
    agent, root, src, hold = node_agent
    manifest = root / helpers.MANIFEST
    assert not lock_free(agent.files)  # the agent holds the writer lock for its life: a hand writer would wait
    hold.value = "alice: INC-42"
    agent.notify(LoopEvent.HOLD)
    assert agent.turn() is LoopEvent.HOLD
    assert agent.node.hold == "alice: INC-42" and agent.metrics.collect()[-1].samples[0].value == 1.0
    assert lock_free(agent.files)
    # the operator restores the node by hand, with the agent running
    done: list[int] = []
    t = threading.Thread(target=lambda: done.append(cli_main(["restore", "--host-root", str(root)])))
    t.start()
    t.join(30)
    assert done == [0] and manifest.read_bytes() == helpers.KUBEADM
    # a config change, a resync, a SIGTERM of an uninstall: nothing is written while held
    write_configmap(src, {"extenders.yaml": SECOND})
    agent.notify(LoopEvent.SOURCE)
    assert agent.turn() is LoopEvent.SOURCE
    assert agent.turn() is None
    assert manifest.read_bytes() == helpers.KUBEADM
    # released: the lock is the agent's again, the record is read from disk, and it patches as a new agent would
    hold.value = None
    agent.notify(LoopEvent.HOLD)
    assert agent.turn() is LoopEvent.HOLD
    assert agent.node.hold is None and not lock_free(agent.files)
    assert agent.turn() is LoopEvent.REPLAN
    assert b"--config=" in manifest.read_bytes() and agent.node.phase == NodeState.WAITING_FOR_RESTART


def test_sigterm_while_held_leaves_the_patched_node_as_it_is(node_agent: tuple[Agent, Path, Path, Hold]) -> None:
    agent, root, _, hold = node_agent
    before = (root / helpers.MANIFEST).read_bytes()
    hold.value = ""
    agent.notify(LoopEvent.HOLD)
    assert agent.turn() is LoopEvent.HOLD
    assert agent.shutdown() == 0
    assert (root / helpers.MANIFEST).read_bytes() == before and b"--config=" in before
    assert not [p for p in (root / helpers.MANIFEST).parent.iterdir() if p.name.startswith(".")]  # no staged file


# -- the watch of the Node --------------------------------------------------------------------------------


@pytest.fixture
def emu() -> Iterator[KubeEmulatorExt]:
    with KubeEmulatorExt() as e:
        e.add_node("cp-1", labels={"node-role.kubernetes.io/control-plane": ""})
        e.add_node("cp-2", annotations={"example.com/hold": "not ours"})
        yield e


def test_the_hold_is_read_from_the_agents_own_node_by_a_watch(emu: KubeEmulatorExt, api: Api) -> None:
    changes = threading.Event()
    w = NodeHoldWatcher(api, "cp-1", "example.com", on_update=changes.set)
    assert not w.known()  # before its first list nothing is known: the agent writes nothing then
    w.start()
    try:
        # the first list answers once, held or not: an agent that waited for it goes on
        assert w.wait_synced(10) and w.hold() is None and w.known() and changes.is_set()
        changes.clear()
        emu.mutate("nodes", "cp-2", lambda n: n["metadata"]["annotations"].update({"example.com/hold": "x"}))
        emu.mutate("nodes", "cp-1", lambda n: n["metadata"]["annotations"].update({"example.com/hold": "bob"}))
        assert wait_until(lambda: w.hold() == "bob", 10) and changes.is_set()
        changes.clear()
        emu.mutate("nodes", "cp-1", lambda n: n["metadata"]["annotations"].pop("example.com/hold") and None)
        assert wait_until(lambda: changes.is_set() and w.hold() is None, 10)
    finally:
        w.stop()
    watches = [r.query for r in emu.requests("GET", "/api/v1/nodes") if r.query.get("watch")]
    assert watches and all(q.get("fieldSelector") == "metadata.name=cp-1" for q in watches)


def test_released_while_a_hand_writer_holds_the_lock_the_agent_reads_the_record_and_goes_on(tmp_path: Path) -> None:
    """The hold goes while the operator's `restore` still runs: the agent does not wait for it past ``lock_wait``; it
    reads the record as it is and each of its writes takes the lock itself until it holds it again."""
    root, src = helpers.node_folders(tmp_path)
    kubelet = FakeKubelet(root)
    kubelet.sync()
    files = Files(source=src, host_root=root, lock_wait=0.05)
    agent = Agent(build_settings(files=files, node_name="cp-1", restart_timeout=3600.0, restart_settle=0.0,
                                 check_extenders=False), pods=kubelet)
    hold = Hold()
    agent.world.holds = hold
    with contextlib.ExitStack() as stack:
        assert agent.record.hold_for_life(stack, agent.metrics)
        agent.start()
        hold.value = "x"
        agent.notify(LoopEvent.HOLD)
        assert agent.turn() is LoopEvent.HOLD
        taken, release = threading.Event(), threading.Event()

        def hand_writer() -> None:
            with writer_lock(replace(files, lock_wait=5.0)):
                taken.set()
                release.wait(10)

        t = threading.Thread(target=hand_writer)
        t.start()
        assert taken.wait(10)
        hold.value = None
        agent.notify(LoopEvent.HOLD)  # the lock is busy: reclaim reads the record without it
        assert agent.turn() is LoopEvent.HOLD
        assert agent.node.hold is None and agent.node.record.phase == "WaitingForRestart"
        release.set()
        t.join(10)
        assert lock_free(agent.files)  # not the agent's yet: its next save takes it back
        assert agent.turn() is LoopEvent.REPLAN  # the reclaim's
        kubelet.sync()
        agent.notify(LoopEvent.POD)  # what a mirror pod update does
        assert agent.turn() is LoopEvent.POD
        assert agent.node.phase == NodeState.READY and not lock_free(agent.files)


# -- the start: nothing is written before the hold is known --------------------------------------------------

PENDING = lifecycle.Planned(1.0, "pending", config_hash=H, source_hash="s" * 64, manifest_change=True)


def test_before_the_hold_is_known_a_plan_writes_nothing_and_says_nothing() -> None:
    start = Node(hold_known=False)
    node, acts = lifecycle.step(start, PENDING, OPTS)
    assert (node, acts) == (start, [])  # no turn asked, no Pending said, no Apply
    node, acts = lifecycle.step(node, HoldChanged(None), OPTS)  # the watch's first list: not held
    assert node.hold_known and node.hold is None
    assert [type(a) for a in acts] == [lifecycle.Log, lifecycle.Replan]  # what was held back is planned now
    _, acts = lifecycle.step(node, PENDING, OPTS)
    assert lifecycle.TakeTurn in [type(a) for a in acts]  # and it goes through the rollout Lease as always


def test_a_start_on_a_held_node_lets_go_and_says_held() -> None:
    node, acts = lifecycle.step(Node(record=PATCHED, hold_known=False), HoldChanged("alice"), OPTS)
    assert node.hold_known and node.hold == "alice"
    assert [type(a) for a in acts] == [lifecycle.Log, LetGo, Publish]
    assert node_status(node).state == NodeState.HELD


def test_a_start_that_cannot_learn_the_hold_goes_on_after_the_wait_and_says_so_once() -> None:
    node, acts = lifecycle.step(Node(hold_known=False), lifecycle.HoldUnknown(30.0), OPTS)
    assert node.hold_known and [type(a) for a in acts] == [lifecycle.Log, lifecycle.Replan]
    assert isinstance(acts[0], lifecycle.Log) and acts[0].level == "warning" and "30s" in acts[0].message
    assert lifecycle.step(node, lifecycle.HoldUnknown(30.0), OPTS) == (node, [])  # said once
    _, acts = lifecycle.step(node, HoldChanged(None), OPTS)  # the watch answers later: nothing to do
    assert acts == []
    node, acts = lifecycle.step(node, HoldChanged("bob"), OPTS)  # a hold seen later takes effect then
    assert node.hold == "bob" and any(isinstance(a, LetGo) for a in acts)


def test_a_restarted_agent_adopts_its_wait_but_judges_no_restart_before_the_hold_is_known() -> None:
    node, _ = lifecycle.step(Node(record=PATCHED, hold_known=False), lifecycle.Resumed(0.0), OPTS)
    assert node.wait is not None  # adopted, as always: no write in that
    crash = lifecycle.Observed(700.0, 0, Verdict.CRASH_LOOPING, "crash")
    assert lifecycle.step(node, crash, OPTS) == (node, [])  # a rollback would write: not before the hold is known
    node, _ = lifecycle.step(node, HoldChanged("alice"), OPTS)
    assert node.wait is None and node.hold == "alice"


#: What an agent that does not know the hold yet never does: the writes (patch, rollback, prune), and the
#: rollback's check that leads to one. (Its stop restores or keeps as always: ``Stop`` is not drawn.)
NOT_BEFORE_KNOWN: tuple[type, ...] = (lifecycle.Apply, lifecycle.RollBack, lifecycle.Prune, lifecycle.Restore,
                                      lifecycle.CheckLastGood)
UNKNOWN_EVENTS = EVENTS.filter(lambda e: not isinstance(e, (HoldChanged, Stop)))  # the watch has not answered


@settings(max_examples=300, deadline=None)
@given(events=st.lists(UNKNOWN_EVENTS, max_size=30), record=st.sampled_from([State(), PATCHED]),
       mode=st.sampled_from(["auto", "always", "never"]), coordinated=st.booleans(), check=st.booleans())
def test_while_the_hold_is_unknown_no_write_action_is_ever_emitted(events: list[lifecycle.Event], record: State,
                                                                   mode: Literal["auto", "always", "never"],
                                                                   coordinated: bool, check: bool) -> None:
    opts = replace(OPTS, restore_on_exit=mode, coordinated=coordinated, check_extenders=check)
    node = Node(record=record, hold_known=False)
    for event in events:
        try:
            node, acts = lifecycle.step(node, event, opts)
        except AssertionError:
            continue
        assert not [a for a in acts if isinstance(a, NOT_BEFORE_KNOWN)], (event, acts)
        assert node.hold is None and not node.hold_known  # never said Held, never known by itself
        assert not (isinstance(event, lifecycle.Planned) and acts)  # a plan is held back whole


class Unanswered(Hold):
    """A hold watch whose first list has not answered (the API is down or slow): ``answer`` makes it answer."""

    def __init__(self) -> None:
        super().__init__()
        self.answered = False

    def known(self) -> bool:
        return self.answered


@pytest.fixture
def starting_agent(tmp_path: Path) -> Iterator[tuple[Agent, Path, Unanswered]]:
    """An agent as ``run`` builds it with the API (``learns_hold``), on a node whose manifest needs the patch."""
    root, src = helpers.node_folders(tmp_path)
    kubelet = FakeKubelet(root)
    kubelet.sync()
    agent = Agent(build_settings(files=Files(source=src, host_root=root), node_name="cp-1", restart_timeout=3600.0,
                                 restart_settle=0.0, check_extenders=False), pods=kubelet, learns_hold=True)
    hold = Unanswered()
    agent.world.holds = hold
    with contextlib.ExitStack() as stack:
        assert agent.record.hold_for_life(stack, agent.metrics)
        agent.start()
        yield agent, root / helpers.MANIFEST, hold


def test_an_agent_whose_hold_watch_has_not_answered_writes_nothing_until_it_does(
        starting_agent: tuple[Agent, Path, Unanswered]) -> None:
    agent, manifest, hold = starting_agent
    assert manifest.read_bytes() == helpers.KUBEADM and not agent.node.hold_known and agent.node.phase is None
    agent.notify(LoopEvent.SOURCE)
    assert agent.turn() is LoopEvent.SOURCE
    agent.notify(LoopEvent.HOLD)  # a change the watch has not listed yet says nothing
    assert agent.turn() is LoopEvent.HOLD
    assert manifest.read_bytes() == helpers.KUBEADM and agent.node.hold is None
    hold.answered = True
    agent.notify(LoopEvent.HOLD)
    assert agent.turn() is LoopEvent.HOLD
    assert agent.node.hold_known and agent.timers.hold_wait_at is None  # the wait's timer is no longer needed
    assert agent.turn() is LoopEvent.REPLAN
    assert b"--config=" in manifest.read_bytes() and agent.node.phase == NodeState.WAITING_FOR_RESTART


def test_an_agent_whose_hold_watch_does_not_answer_goes_on_after_the_bound(
        starting_agent: tuple[Agent, Path, Unanswered], caplog: pytest.LogCaptureFixture) -> None:
    agent, manifest, _ = starting_agent
    assert agent.timers.hold_wait_at is not None
    assert agent.turn() is None  # the loop wakes before the bound (the heartbeat): still nothing
    assert manifest.read_bytes() == helpers.KUBEADM
    agent.timers.hold_wait_at -= agent.opts.hold_wait  # the bound has passed (the loop's timer, no sleep)
    with caplog.at_level("WARNING"):
        assert agent.turn() is None
    assert [r.getMessage() for r in caplog.records if "could not learn the node's hold" in r.getMessage()] == [
        "could not learn the node's hold within 30s (no answer from the API): going on as not held"]
    assert agent.node.hold_known and agent.turn() is LoopEvent.REPLAN
    assert b"--config=" in manifest.read_bytes() and agent.node.phase == NodeState.WAITING_FOR_RESTART


def test_an_agent_that_starts_on_a_held_node_writes_nothing_and_says_held(tmp_path: Path) -> None:
    """The operator held the node and restored it by hand; then the agent's pod restarts (a rolling update) and
    starts before its API client is built, as ``run`` does: it must not patch the node again."""
    with helpers.kubeadm_node(tmp_path) as node:
        node.emu.mutate("nodes", helpers.NODE, lambda n: n["metadata"].setdefault("annotations", {}).update(
            {helpers.P + "hold": "alice: INC-42"}) and None)
        agent = helpers.Running(node, deferred=True)
        try:
            assert wait_until(lambda: node.state() == "Held", 30)
            assert node.annotations().get("message", "").endswith("(alice: INC-42)")
            agent.agent.notify(LoopEvent.SOURCE)  # a reconcile after the hold is known writes nothing either
            assert wait_until(lambda: agent.agent.events.empty(), 10)
            assert node.manifest.read_bytes() == helpers.KUBEADM
            assert not [p for p in node.manifest.parent.iterdir() if p.name != node.manifest.name]
        finally:
            assert agent.stop() == 0
        assert node.manifest.read_bytes() == helpers.KUBEADM  # its stop kept the node as it is
