"""The stop (``patcher.services.stopping`` and ``Agent.shutdown``): the restored content, wherever the stop lands
in the loop, and what the executor reports back to the step about the API. Real files on tmp folders."""

from __future__ import annotations

import importlib
import logging
import os
import queue
import signal
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from patcher.adapters import signals
from patcher.adapters.kube.client import ClientSettings, build_api_client
from patcher.core import lifecycle
from patcher.core.errors import PatcherError
from patcher.core.lifecycle import LoopEvent
from patcher.core.settings import Files
from patcher.core.status import NodeState
from patcher.services import nodefiles, process
from patcher.services.agent import Agent
from patcher.services.ports import NoPods
from patcher.services.record import state_store
from patcher.services.rollout import RolloutLease
from patcher.services.stopping import Stopping
from tests.conftest import corpus_manifests, fixture_manifests
from tests.harness import helpers
from tests.harness.emu.kubeemu_ext import KubeEmulatorExt
from tests.harness.helpers import MANIFEST
from tests.harness.settings import build_settings


class SlowLease:
    """A Lease actor whose answer to the stop's request comes after the confirm wait, while the restore runs
    (``late=True``), or never (``late=False``: the API black-holed)."""

    def __init__(self, *, late: bool) -> None:
        self.late = late
        self.held = False
        self.refused_bad = False
        self.current_holder: str | None = None
        self.api_answered: bool | None = None
        self.denied: str | None = None
        self.asked = 0
        self._reads = 0

    @property
    def unanswered(self) -> bool:
        self._reads += 1
        if self.late and self._reads > 1:  # answered by the time the restore is done
            self.api_answered = True
            return False
        return self.asked > 0

    def acquire(self, source_hash: str = "") -> bool:
        self.asked += 1
        return False

    def release(self, *, bad_hash: str | None = None) -> None:
        self.held = False

    def settle(self, timeout: float) -> bool:
        return False  # no answer within the confirm wait

    def wait_held(self, timeout: float) -> bool:
        return False

    def close(self, timeout: float) -> None:
        pass


def patched(tmp_path: Path) -> tuple[Files, Stopping]:
    root, src = helpers.node_folders(tmp_path)
    files = Files(source=src, host_root=root)
    nodefiles.apply(files, nodefiles.plan_apply(files), state_store(files).load())
    return files, Stopping(files, state_store(files), log_extra={})


def test_a_lease_answer_that_comes_late_is_a_slow_api_not_a_silent_one(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Under load the Lease's answer can take longer than the confirm wait: the restore goes ahead without it
    (it must follow SIGTERM within a second), but the API did answer: not silent, so a restore that ends
    past the stop's answers deadline still gives the final report ``FINAL_REPORT``."""
    files, stopper = patched(tmp_path)
    action = lifecycle.Restore(confirm_wait=0.0, turn_until=0.0, restored_until=0.0)
    with caplog.at_level(logging.WARNING):
        done = stopper.restore(action, state_store(files).load(), SlowLease(late=True), NoPods())
    assert done.ok and not done.api_silent
    assert (tmp_path / "node" / helpers.MANIFEST).read_bytes() == helpers.KUBEADM
    assert any("restoring without the rollout lease" in r.getMessage() for r in caplog.records)


def test_a_lease_request_never_answered_is_a_silent_api(tmp_path: Path) -> None:
    files, stopper = patched(tmp_path)
    action = lifecycle.Restore(confirm_wait=0.0, turn_until=0.0, restored_until=0.0)
    done = stopper.restore(action, state_store(files).load(), SlowLease(late=False), NoPods())
    assert done.ok and done.api_silent


class StalePods:
    """A mirror pod view that lost the API server (its watch does not follow it any more)."""

    fresh, pod_name = False, "kube-scheduler-cp-1"

    def latest(self) -> dict[str, object] | None:
        return None


def test_holding_the_turn_with_a_stale_pod_view_is_a_silent_api(tmp_path: Path) -> None:
    """The node held the turn (its own write waited for the restart) when the API went black: the restore does
    not ask for the turn, and the mirror pod's view is stale, so the API is silent, whatever an earlier round
    trip of the Lease actor said (its ``api_answered`` is from before the black hole). The final report then
    gets nothing past the stop's answers deadline (the exit took 21 s in bench_black_hole(uninstall=True))."""
    files, stopper = patched(tmp_path)
    lease = SlowLease(late=False)
    lease.held, lease.api_answered = True, True
    action = lifecycle.Restore(confirm_wait=0.0, turn_until=0.0, restored_until=1e12)
    done = stopper.restore(action, state_store(files).load(), lease, StalePods())
    assert done.ok and done.api_silent


# -- the restored content, wherever the stop lands ----------------------------------------------------------

CONFIG = "extenders:\n- urlPrefix: http://127.0.0.1:8889\n  filterVerb: filter\n"
TEXTS = sorted(fixture_manifests().items()) + [(p.name, p.read_bytes().decode("utf-8")) for p in corpus_manifests()]
#: What may happen to the patched manifest before the stop.
CHANGES = ("nothing", "edited, our items kept", "rewritten without our items")


def node(tmp: Path, text: str) -> Files:
    root = tmp / "node"
    (root / MANIFEST).parent.mkdir(parents=True)
    (root / MANIFEST).write_bytes(text.encode("utf-8"))
    (tmp / "src").mkdir()
    (tmp / "src" / "extenders.yaml").write_text(CONFIG)
    return Files(source=tmp / "src", host_root=root, on_foreign="replace")


def ready_agent(tmp: Path, text: str, events: queue.SimpleQueue[LoopEvent] | None = None) -> Agent:
    """An agent without the API, started (so patched and Ready), its loop not running: no watcher reacts."""
    agent = Agent(build_settings(check_extenders=False, files=node(tmp, text)), events=events)
    assert agent.start() and agent.node.phase == NodeState.READY
    return agent


def change(path: Path, what: str, original: str) -> None:
    if what == "edited, our items kept":
        path.write_bytes(b"# edited by an upgrade\n" + path.read_bytes())
    elif what == "rewritten without our items":
        path.write_bytes(original.encode("utf-8"))


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(TEXTS), st.sampled_from(CHANGES))
def test_the_stop_restores_exactly_what_we_added_whatever_happened_since(item: tuple[str, str], what: str) -> None:
    """Every manifest of the fixtures and the corpus, patched by the agent, then changed or not: the stop
    removes exactly our items (the original bytes when nothing else changed) and leaves nothing beside the
    manifest, no config file, no record."""
    _, text = item
    with tempfile.TemporaryDirectory() as t:
        try:
            agent = ready_agent(Path(t), text)
        except (PatcherError, AssertionError):
            reject()  # refused by rule (a shell-wrapped scheduler, say): nothing patched, nothing to restore
        path = agent.files.host_root / MANIFEST
        change(path, what, text)
        assert agent.shutdown() == 0 and agent.node.phase == NodeState.RESTORED
        if what == "edited, our items kept":
            assert path.read_bytes() == b"# edited by an upgrade\n" + text.encode("utf-8")
        else:
            assert path.read_bytes() == text.encode("utf-8")
        assert os.listdir(path.parent) == ["kube-scheduler.yaml"]
        assert not os.listdir(nodefiles.host_fs(agent.files).local(agent.files.host_config_dir))
        assert not state_store(agent.files).present()


LOOP_EVENTS = (LoopEvent.SOURCE, LoopEvent.MANIFEST, LoopEvent.CONFIG, LoopEvent.REPLAN, LoopEvent.POD, LoopEvent.STOP)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(LOOP_EVENTS), max_size=6), st.sampled_from(["weight: 1", "weight: 5"]))
def test_a_stop_anywhere_among_the_loops_events_restores(before: list[LoopEvent], weight: str) -> None:
    """The stop lands anywhere in the loop's queue (after a source change it has not seen yet, a re-plan, a
    pod update, another stop): the loop ends at it and the node is restored, byte for byte."""
    text = fixture_manifests()["kubeadm.yaml"]
    with tempfile.TemporaryDirectory() as t:
        events: queue.SimpleQueue[LoopEvent] = queue.SimpleQueue()
        agent = ready_agent(Path(t), text, events)
        (agent.files.source / "extenders.yaml").write_text(CONFIG + f"  {weight}\n")
        for event in [*before, LoopEvent.STOP]:  # the last one: the stop request's own event (``request_stop``)
            events.put(event)
        agent.loop()  # handles each event before the stop as it comes, then ends at the first stop
        assert agent.shutdown() == 0
        assert (agent.files.host_root / MANIFEST).read_bytes() == text.encode()
        assert agent.node.phase == NodeState.RESTORED


def test_a_manifest_upgraded_since_the_patch_keeps_the_upgrade(tmp_path: Path) -> None:
    text = fixture_manifests()["kubeadm.yaml"]
    agent = ready_agent(tmp_path, text)
    path = agent.files.host_root / MANIFEST
    path.write_text(path.read_text().replace("v1.31.2", "v1.32.0"))  # kubeadm upgrade, our items kept
    assert agent.shutdown() == 0
    assert path.read_text() == text.replace("v1.31.2", "v1.32.0")  # only our items went, the upgrade stays
    assert agent.node.phase == NodeState.RESTORED


def test_the_signal_is_said_once_and_the_stop_restores(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The handler runs on the loop's thread and only requests the stop (no log line, no write there); the
    stop says the signal once, then restores; a second signal is ignored, said as such."""
    text = fixture_manifests()["kubeadm.yaml"]
    agent = ready_agent(tmp_path, text)
    before = {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS}  # the test process's, put back after
    importlib.reload(signals)  # no signal received, no listener
    try:
        process.install_signal_handlers(agent)
        with caplog.at_level(logging.INFO, logger="patcher.services.agent"):
            signals._handler(signal.SIGTERM, None)  # what the interpreter runs on the main thread
            assert "received SIGTERM" not in caplog.text
            assert (agent.files.host_root / MANIFEST).read_bytes() != text.encode()  # nothing written there
            signals._handler(signal.SIGINT, None)
            assert agent.shutdown() == 0
    finally:
        importlib.reload(signals)
        for sig, handler in before.items():
            signal.signal(sig, handler)
    said = [r.getMessage() for r in caplog.records]
    assert said.count("received SIGTERM") == 1 and "received SIGINT" not in said
    assert "second stop signal ignored: the restore is running and must finish" in said
    assert said.index("received SIGTERM") < said.index(f"wrote /{MANIFEST} (stopping)")
    assert (agent.files.host_root / MANIFEST).read_bytes() == text.encode()


class Recording:
    """A reporter and a Lease actor in one, of an API that never answers: records the time each wait of the
    stop is given."""

    def __init__(self) -> None:
        self.waits: list[tuple[str, float]] = []
        self.held, self.refused_bad = False, False
        self.current_holder: str | None = None
        self.api_answered: bool | None = None
        self.denied: str | None = None

    def publish(self, status: object, *, reason: str | None = None, message: str | None = None) -> None:
        pass

    def note(self, reason: str, message: str, *, warning: bool = False) -> None:
        pass

    def flush(self, timeout: float) -> bool:
        self.waits.append(("flush", timeout))
        return False  # a black-holed API: nothing delivered

    def close(self, timeout: float) -> None:
        self.waits.append(("close", timeout))

    @property
    def unanswered(self) -> bool:
        return True  # the Lease request never answered

    def acquire(self, source_hash: str = "") -> bool:
        return False

    def release(self, *, bad_hash: str | None = None) -> None:
        pass

    def settle(self, timeout: float) -> bool:
        self.waits.append(("settle", timeout))
        return False

    def wait_held(self, timeout: float) -> bool:
        self.waits.append(("wait_held", timeout))
        return False


@pytest.mark.parametrize("grace", [25.0, 300.0])
def test_the_stops_release_and_report_are_given_no_more_than_its_answers_deadline(tmp_path: Path,
                                                                                  grace: float) -> None:
    """What the stop hands the API's adapters to wait for (the Lease's release, the final report) ends by the
    ``Finish`` the step computed, ``STOP_ANSWERS`` after the stop, whatever the grace period: the report waited
    for the rest of it (20 s of 25) when nothing had told the stop that the API was silent."""
    agent = ready_agent(tmp_path, fixture_manifests()["kubeadm.yaml"])
    fake = Recording()
    agent.world.reporter = fake
    agent.world.coordinator = fake
    agent.rules = replace(agent.rules, grace_period=grace)
    t0 = time.monotonic()
    assert agent.shutdown() == 0
    assert [name for name, _ in fake.waits] == ["settle", "close", "flush"]
    assert all(0 <= wait <= lifecycle.STOP_ANSWERS for _, wait in fake.waits), fake.waits
    assert agent.node.stop_until - t0 <= lifecycle.STOP_ANSWERS + (time.monotonic() - t0)


def test_a_lease_request_refused_by_rbac_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """`helm uninstall` deletes the agents' RoleBinding and ServiceAccount with the DaemonSet: the stop's Lease
    request is answered 403 (or 401). The restore goes ahead at once, and the log names the refusal, not an API
    server that does not answer."""
    files, stopper = patched(tmp_path)
    with KubeEmulatorExt() as emu:
        api = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / "kc"))))
        path = "/apis/coordination.k8s.io/v1/namespaces/scheduler-patcher/leases/scheduler-patcher-rollout"
        emu.fail("GET", path, 403, times=100)
        rollout = RolloutLease(api, "scheduler-patcher", "scheduler-patcher-rollout", "cp-1")
        action = lifecycle.Restore(confirm_wait=5.0, turn_until=time.monotonic() + 5, restored_until=0.0)
        with caplog.at_level(logging.WARNING):
            done = stopper.restore(action, state_store(files).load(), rollout, NoPods())
        rollout.close(1)
    assert done.ok
    assert (tmp_path / "node" / helpers.MANIFEST).read_bytes() == helpers.KUBEADM
    said = [r.getMessage() for r in caplog.records if "restoring without the rollout lease" in r.getMessage()]
    assert len(said) == 1 and "refused it" in said[0] and "403" in said[0], said


class Views:
    """The leader-aware view as the watch would show it, changed by the test (a ``LeaderSource``)."""

    def __init__(self, first: lifecycle.Schedulers) -> None:
        self.current = first

    def view(self) -> lifecycle.Schedulers:
        return self.current


LEADS = lifecycle.Schedulers(True, "cp-1", True, (lifecycle.Peer("cp-2", NodeState.READY.value, "", True),))
PEER_DONE = replace(LEADS, peers=(lifecycle.Peer("cp-2", NodeState.RESTORED.value, "", True),))


def test_the_leading_node_lets_its_peer_restore_first_when_every_agent_leaves(tmp_path: Path) -> None:
    """The uninstall: both agents stop at once; the one whose scheduler leads does not keep the free Lease while
    its peer still has a patch to restore, and restores once the peer says Restored (the lead then moves once)."""
    import threading

    files, stopper = patched(tmp_path)
    manifest = tmp_path / "node" / helpers.MANIFEST
    leaders = Views(LEADS)
    with KubeEmulatorExt() as emu:
        api = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / "kc"))))
        ours = RolloutLease(api, "scheduler-patcher", "scheduler-patcher-rollout", "cp-1")
        peer = RolloutLease(api, "scheduler-patcher", "scheduler-patcher-rollout", "cp-2")
        action = lifecycle.Restore(confirm_wait=5.0, turn_until=time.monotonic() + 120,
                                   restored_until=0.0, leader_last=True)
        done: list[lifecycle.RestoreDone] = []
        stop = threading.Thread(target=lambda: done.append(
            stopper.restore(action, state_store(files).load(), ours, NoPods(), leaders)))
        stop.start()
        try:
            end = time.monotonic() + 60
            while not peer.held and time.monotonic() < end:  # the peer asks as a stopping agent does
                peer.acquire()
                peer.wait_held(0.25)
            assert peer.held, "the peer never got the turn: the leader kept it"
            assert manifest.read_bytes() != helpers.KUBEADM and not done  # the leader has not restored
            leaders.current = PEER_DONE
            peer.release()
        finally:
            stop.join(60)
            peer.close(1)
            ours.close(1)
    assert done and done[0].ok and done[0].held and not done[0].api_silent
    assert manifest.read_bytes() == helpers.KUBEADM


def test_a_leading_node_waiting_for_its_peers_restores_at_once_when_the_api_goes_silent(tmp_path: Path) -> None:
    """Letting the peers go first is a wait on an answering API only: each ask must still be answered within
    the confirm wait, else the restore goes ahead at once (SIGTERM -> restored, whatever the API does)."""
    files, stopper = patched(tmp_path)
    with KubeEmulatorExt() as emu:
        api = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / "kc"))))
        ours = RolloutLease(api, "scheduler-patcher", "scheduler-patcher-rollout", "cp-1")
        emu.go_down("refuse")
        action = lifecycle.Restore(confirm_wait=0.5, turn_until=time.monotonic() + 600,
                                   restored_until=0.0, leader_last=True)
        done = stopper.restore(action, state_store(files).load(), ours, NoPods(), Views(LEADS))
        ours.close(0.5)
    assert done.ok and not done.held
    assert (tmp_path / "node" / helpers.MANIFEST).read_bytes() == helpers.KUBEADM


def test_a_slow_answer_after_an_answered_ask_is_waited_for_not_taken_for_silence(tmp_path: Path) -> None:
    """The uninstall on three real nodes: two stopping agents wait for a third's turn, their asks answered "held by
    another"; when it ends, the next ask of ours is answered slowly (the control plane busy with the restarted
    scheduler). Once the API has answered this stop, an ask gets ``answered_wait``, not ``confirm_wait``: we take
    the turn instead of restoring beside the node that took it first (two schedulers down at once)."""
    import threading

    files, stopper = patched(tmp_path)
    path = "/apis/coordination.k8s.io/v1/namespaces/scheduler-patcher/leases/scheduler-patcher-rollout"
    with KubeEmulatorExt() as emu:
        api = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / "kc"))))
        ours = RolloutLease(api, "scheduler-patcher", "scheduler-patcher-rollout", "cp-1")
        peer = RolloutLease(api, "scheduler-patcher", "scheduler-patcher-rollout", "cp-2")
        peer.acquire()
        assert peer.settle(5) and peer.held
        action = lifecycle.Restore(confirm_wait=0.3, turn_until=time.monotonic() + 60, restored_until=0.0,
                                   answered_wait=5.0)
        done: list[lifecycle.RestoreDone] = []
        stop = threading.Thread(target=lambda: done.append(
            stopper.restore(action, state_store(files).load(), ours, NoPods())))
        stop.start()
        try:
            end, tick = time.monotonic() + 30, threading.Event()
            while not (ours.current_holder == "cp-2" and ours.api_answered) and time.monotonic() < end:
                tick.wait(0.02)  # our stop asked and was answered: held by the peer
            assert ours.current_holder == "cp-2" and ours.api_answered and not done
            slow = threading.Event()
            # every read of the Lease from now on answered 1 s late (more than confirm_wait, less than answered_wait)
            emu.before("GET", path, lambda _: slow.wait(1.0), times=1000)
            peer.release()
        finally:
            stop.join(60)
            peer.close(1)
            ours.close(1)
    assert done and done[0].ok and done[0].held and not done[0].api_silent, done
    assert (tmp_path / "node" / helpers.MANIFEST).read_bytes() == helpers.KUBEADM


@pytest.mark.parametrize("everyone_leaves", [True, False], ids=["uninstall", "lone-stop"])
def test_an_uninstalls_first_ask_answered_slowly_takes_the_turn(tmp_path: Path, everyone_leaves: bool) -> None:
    """Three real nodes' uninstall under load: every agent asked for the turn at the same moment, the answers took
    longer than ``LEASE_CONFIRM_WAIT``, and each took the silence for a dead API: all three schedulers restarted at
    once. The step's ``Restore`` when every agent leaves gives the first ask ``LEASE_ANSWERED_WAIT``: answered in
    0.6 s, the stop holds the turn. A lone stop keeps the short first ask (nothing restores beside it)."""
    from patcher.core.settings import Lifecycle
    from patcher.core.state import State

    files, stopper = patched(tmp_path)
    path = "/apis/coordination.k8s.io/v1/namespaces/scheduler-patcher/leases/scheduler-patcher-rollout"
    view = lifecycle.DaemonSetView(known=True, name="scheduler-patcher",  # gone: every agent leaves
                                   exists=not everyone_leaves, selects=not everyone_leaves)
    node = lifecycle.Node(record=State(phase="Ready", config_hash="c" * 64, patched_sha256="p" * 64))
    opts = Lifecycle(coordinated=True, grace_period=25.0, check_extenders=False, restore_on_exit="always")
    _, acts = lifecycle.step(node, lifecycle.Stop(time.monotonic(), "signal", view), opts)
    action = next(a for a in acts if isinstance(a, lifecycle.Restore))
    with KubeEmulatorExt() as emu:
        api = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / "kc"))))
        ours = RolloutLease(api, "scheduler-patcher", "scheduler-patcher-rollout", "cp-1")
        # A loaded control plane: each read answered 0.6 s late (twice the lone stop's wait, under a third of 2 s).
        emu.before("GET", path, lambda _: time.sleep(0.6), times=1000)
        try:
            done = stopper.restore(action, state_store(files).load(), ours, NoPods())
        finally:
            ours.close(3)
    assert done.ok and (tmp_path / "node" / helpers.MANIFEST).read_bytes() == helpers.KUBEADM
    assert (done.held, done.api_silent) == ((True, False) if everyone_leaves else (False, True)), done
