"""The restore prepared while Ready (the SIGTERM path) against the restore planned when it happens.

Invariant: whatever happened to the manifest between the preparation and the stop, the agent's way (write the
prepared bytes while the manifest is still what we wrote, else plan again from what is there) leaves the node
exactly as the cold restore from the same state does. Real files on tmp folders (atomic writes, the lock).
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from patcher.adapters import fsio, signals
from patcher.core import lifecycle
from patcher.core.errors import PatcherError
from patcher.core.settings import Files, Lifecycle, RestoreOnExit, Settings
from patcher.core.status import NodeState
from patcher.services import engine, process, stopping
from patcher.services.agent import Agent
from tests.conftest import corpus_manifests, fixture_manifests
from tests.harness.helpers import MANIFEST

CONFIG = "extenders:\n- urlPrefix: http://127.0.0.1:8889\n  filterVerb: filter\n"
TEXTS = sorted(fixture_manifests().items()) + [(p.name, p.read_bytes().decode("utf-8")) for p in corpus_manifests()]

# What may happen to the patched manifest after the restore was prepared.
CHANGES = ("nothing", "edited, our items kept", "rewritten without our items")


def node(tmp: Path, text: str) -> Files:
    root = tmp / "node"
    (root / MANIFEST).parent.mkdir(parents=True)
    (root / MANIFEST).write_bytes(text.encode("utf-8"))
    (tmp / "src").mkdir()
    (tmp / "src" / "extenders.yaml").write_text(CONFIG)
    return Files(source=tmp / "src", host_root=root, on_foreign="replace")


def patched(tmp: Path, text: str) -> Files:
    opts = node(tmp, text)
    engine.apply(opts, engine.plan_apply(opts))
    return opts


def change(opts: Files, what: str, original: str) -> None:
    path = opts.host_root / MANIFEST
    if what == "edited, our items kept":
        path.write_bytes(b"# edited by an upgrade\n" + path.read_bytes())
    elif what == "rewritten without our items":
        path.write_bytes(original.encode("utf-8"))


def on_disk(opts: Files) -> tuple[bytes, list[str], list[str]]:
    root = opts.host_root
    files = [str(p.relative_to(root)) for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"]
    return (root / MANIFEST).read_bytes(), files, sorted(os.listdir(root / "etc/kubernetes/manifests"))


def agent_way(opts: Files, prepared: engine.PreparedRestore) -> None:
    """What ``Stopping.restore`` does with a prepared restore."""
    try:
        engine.restore_prepared(opts, prepared)
        engine.finish_restore(opts, prepared)
    except fsio.ChangedUnderneath:
        engine.restore(opts, engine.plan_restore(opts))


@settings(max_examples=80)
@given(st.sampled_from(TEXTS), st.sampled_from(CHANGES), st.booleans())
def test_the_prepared_restore_leaves_what_the_cold_one_leaves(item: tuple[str, str], what: str, staged: bool) -> None:
    _, text = item
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        try:
            fast, cold = patched(Path(a), text), patched(Path(b), text)
        except PatcherError:
            reject()  # refused by rule (a shell-wrapped scheduler, say): nothing to restore
        prepared = engine.prepare_restore(fast, stage=staged)
        assert prepared is not None and (prepared.staged is not None) == staged
        change(fast, what, text)
        change(cold, what, text)
        agent_way(fast, prepared)
        engine.restore(cold, engine.plan_restore(cold))
        assert on_disk(fast) == on_disk(cold)
        if what != "edited, our items kept":
            assert (fast.host_root / MANIFEST).read_bytes() == text.encode("utf-8")


def ready_agent(tmp: Path, text: str) -> Agent:
    """An agent without the API, started (so patched and Ready), its loop not running: no watcher reacts."""
    agent = Agent(Settings.build(check_extenders=False, files=node(tmp, text)))
    assert agent.start() and agent.phase == NodeState.READY
    return agent


def test_sigterm_while_ready_writes_the_prepared_restore_without_planning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = fixture_manifests()["kubeadm.yaml"]
    agent = ready_agent(tmp_path, text)
    planned: list[Files] = []
    real = engine.plan_restore

    def counted(opts: Files) -> engine.RestorePlan:
        planned.append(opts)
        return real(opts)

    monkeypatch.setattr(engine, "plan_restore", counted)
    assert agent.stopper.prepared is not None
    staged = agent.stopper.prepared[1].staged
    assert staged is not None and staged.name.startswith(".kube-scheduler.yaml.")  # hidden from the kubelet
    inode = staged.stat().st_ino
    assert agent.shutdown() == 0
    assert planned == []  # everything was known while Ready
    assert (agent.files.host_root / MANIFEST).read_bytes() == text.encode()
    assert (agent.files.host_root / MANIFEST).stat().st_ino == inode  # the staged file, renamed in place
    assert os.listdir(agent.files.host_root / "etc/kubernetes/manifests") == ["kube-scheduler.yaml"]
    assert agent.phase == NodeState.RESTORED
    assert not os.listdir(engine.host_fs(agent.files).local(agent.files.host_config_dir))


def test_a_manifest_upgraded_since_the_restore_was_prepared_is_planned_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    text = fixture_manifests()["kubeadm.yaml"]
    agent = ready_agent(tmp_path, text)
    path = agent.files.host_root / MANIFEST
    upgraded = path.read_text().replace("v1.31.2", "v1.32.0")  # kubeadm upgrade, our items kept
    path.write_text(upgraded)
    with caplog.at_level(logging.INFO, logger="patcher.services.agent"):
        assert agent.shutdown() == 0
    assert "planning it again" in caplog.text
    assert path.read_text() == text.replace("v1.31.2", "v1.32.0")  # only our items went, the upgrade stays
    assert agent.phase == NodeState.RESTORED


def test_a_staged_restore_someone_changed_is_not_written(tmp_path: Path) -> None:
    text = fixture_manifests()["kubeadm.yaml"]
    agent = ready_agent(tmp_path, text)
    assert agent.stopper.prepared is not None and agent.stopper.prepared[1].staged is not None
    agent.stopper.prepared[1].staged.write_bytes(b"not what was staged\n")
    assert agent.shutdown() == 0
    assert (agent.files.host_root / MANIFEST).read_bytes() == text.encode()
    assert os.listdir(agent.files.host_root / "etc/kubernetes/manifests") == ["kube-scheduler.yaml"]


def test_the_staged_file_is_kept_while_the_restore_is_the_same_and_removed_when_there_is_none(
        tmp_path: Path) -> None:
    agent = ready_agent(tmp_path, fixture_manifests()["kubeadm.yaml"])
    assert agent.stopper.prepared is not None
    first = agent.stopper.prepared[1].staged
    agent._prepare_restore()  # another transition of the record, the same manifest: nothing written again
    assert agent.stopper.prepared is not None and agent.stopper.prepared[1].staged == first
    agent.rules = replace(agent.rules, restore_on_exit="never")
    agent._prepare_restore()
    assert agent.stopper.prepared is None and first is not None and not first.exists()


# -- issue 26: nothing before the prepared restore's write but what decides it --------------------------------


def test_the_signal_is_logged_once_the_manifest_is_back_not_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The handler runs on the loop's thread: a log line written there came before the restore (a quarter of a
    millisecond of SIGTERM -> restored). The line is still said, once, first among the stop's lines."""
    text = fixture_manifests()["kubeadm.yaml"]
    agent = ready_agent(tmp_path, text)
    monkeypatch.setattr(signals, "installed_at", 0.0)  # the test process keeps its own handlers
    signals.reset()
    try:
        process.install_signal_handlers(agent)
        with caplog.at_level(logging.INFO, logger="patcher.services.agent"):
            signals._handler(signal.SIGTERM, None)  # what the interpreter runs on the main thread
            assert "received SIGTERM" not in caplog.text
            assert agent.shutdown() == 0
    finally:
        signals.reset()
    said = [r.getMessage() for r in caplog.records]
    assert said.count("received SIGTERM") == 1
    assert said.index("received SIGTERM") < said.index(f"wrote /{MANIFEST} (stopping)")
    assert (agent.files.host_root / MANIFEST).read_bytes() == text.encode()


@pytest.mark.parametrize("mode, coordinated, first", [
    ("auto", False, True),  # no API read decides it (no pod identity here), no rollout turn: the write first
    ("always", False, True),
    ("auto", True, False),  # the rollout turn is taken before a write: the Restore action does both, in order
    ("never", False, False),  # kept: nothing is written at all
])
def test_a_stop_writes_the_prepared_restore_before_its_transition_when_nothing_else_must_come_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: RestoreOnExit, coordinated: bool,
        first: bool) -> None:
    text = fixture_manifests()["kubeadm.yaml"]
    agent = ready_agent(tmp_path, text)
    agent.rules = replace(agent.rules, restore_on_exit=mode, coordinated=coordinated)
    path = agent.files.host_root / MANIFEST
    restored_at_step: list[bool] = []
    real = lifecycle.step

    def step(node: lifecycle.Node, event: lifecycle.Event, opts: Lifecycle,
             **kw: str) -> lifecycle.Step:
        if isinstance(event, lifecycle.Stop):
            restored_at_step.append(path.read_bytes() == text.encode())
        return real(node, event, opts, **kw)

    monkeypatch.setattr(lifecycle, "step", step)
    agent.request_stop()
    assert agent.shutdown() == 0
    assert restored_at_step == [first]
    assert (path.read_bytes() == text.encode()) == (mode != "never")
    assert sorted(os.listdir(path.parent)) == ["kube-scheduler.yaml"]


def test_a_refusal_of_the_write_that_comes_first_is_the_restore_actions_own(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The manifest upgraded since the preparation: the early write refuses (nothing written), and the
    Restore action meets the same refusal and plans again, as it did before the write came first."""
    text = fixture_manifests()["kubeadm.yaml"]
    agent = ready_agent(tmp_path, text)
    path = agent.files.host_root / MANIFEST
    path.write_text(path.read_text().replace("v1.31.2", "v1.32.0"))
    with caplog.at_level(logging.INFO, logger="patcher.services.agent"):
        assert agent.shutdown() == 0
    assert caplog.text.count("planning it again") == 1
    assert path.read_text() == text.replace("v1.31.2", "v1.32.0")
    assert agent.phase == NodeState.RESTORED


def test_a_writer_holding_the_lock_does_not_enter_it_again_for_the_prepared_restore(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent holds the writer lock for its life; re-entering it (two context managers, a path built, a
    guard taken) cost more than the rename itself on the SIGTERM path (issue 26)."""
    text = fixture_manifests()["kubeadm.yaml"]
    opts = patched(tmp_path, text)
    prepared = engine.prepare_restore(opts, stage=True)
    assert prepared is not None
    with engine.writer_lock(opts):
        entered: list[Path] = []
        real = fsio.writer_lock

        def counted(folder: Path, *a: object, **kw: object) -> object:
            entered.append(folder)
            return real(folder, *a, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(fsio, "writer_lock", counted)
        assert engine.restore_prepared(opts, prepared) == [f"wrote /{MANIFEST}"]
        assert entered == []
    monkeypatch.undo()
    engine.finish_restore(opts, prepared)
    assert (opts.host_root / MANIFEST).read_bytes() == text.encode()


# -- issue 26: the restore's files settle while Ready; a signal during the loop's wait writes at once -----------


def test_the_prepared_restore_keeps_both_identities_once_both_files_have_settled(tmp_path: Path) -> None:
    text = fixture_manifests()["kubeadm.yaml"]
    agent = ready_agent(tmp_path, text)
    path = agent.files.host_root / MANIFEST
    assert agent.stopper.prepared is not None and agent.stopper.prepared[1].seen is None  # both just written
    newest = max(path.stat().st_ctime_ns, agent.stopper.prepared[1].staged.stat().st_ctime_ns)  # type: ignore[union-attr]
    agent.stopper.clock_ns = lambda: newest
    assert agent.stopper.settle() == pytest.approx(fsio.SETTLED_NS / 1e9)  # the loop asks again then
    agent.stopper.clock_ns = lambda: newest + fsio.SETTLED_NS
    assert agent.stopper.settle() is None and agent.stopper.prepared[1].seen is not None
    assert agent.stopper.settle() is None  # nothing left to settle
    assert agent.shutdown() == 0
    assert path.read_bytes() == text.encode()
    assert sorted(os.listdir(path.parent)) == ["kube-scheduler.yaml"]


@pytest.mark.parametrize("what", ["manifest upgraded", "staged file changed"])
def test_a_file_changed_after_it_settled_is_compared_in_full_and_not_overwritten(tmp_path: Path, what: str) -> None:
    text = fixture_manifests()["kubeadm.yaml"]
    agent = ready_agent(tmp_path, text)
    path = agent.files.host_root / MANIFEST
    agent.stopper.clock_ns = lambda: 2**62  # long after both files' last change
    assert agent.stopper.settle() is None and agent.stopper.prepared is not None
    prepared = agent.stopper.prepared[1]
    assert prepared.seen is not None and prepared.staged is not None
    if what == "manifest upgraded":
        path.write_text(path.read_text().replace("v1.31.2", "v1.32.0"))
    else:
        # Another size: the staged file was written a moment ago, and before Linux 6.13 a same-size write in
        # the same timestamp tick keeps its ctime (what ``settle``'s 50 ms wait rules out in the agent).
        prepared.staged.write_bytes(prepared.staged.read_bytes().replace(b"v1.31.2", b"v1.31.10"))
    with pytest.raises(fsio.ChangedUnderneath):
        engine.restore_prepared(agent.files, prepared)
    assert agent.shutdown() == 0  # planned again from what is there
    want = text.replace("v1.31.2", "v1.32.0") if what == "manifest upgraded" else text
    assert path.read_text() == want
    assert sorted(os.listdir(path.parent)) == ["kube-scheduler.yaml"]


def test_a_preparation_that_no_longer_holds_is_not_asked_again(tmp_path: Path) -> None:
    agent = ready_agent(tmp_path, fixture_manifests()["kubeadm.yaml"])
    path = agent.files.host_root / MANIFEST
    path.write_bytes(path.read_bytes() + b"# edited\n")
    assert agent.stopper.settle() is None  # not what was prepared: no identities, and no wake-ups for it
    assert agent.stopper.prepared is not None and agent.stopper.prepared[1].seen is None
    agent.stopper.clock_ns = lambda: pytest.fail("asked again")
    assert agent.stopper.settle() is None


@pytest.mark.parametrize("waiting", [True, False], ids=["the loop waits", "the loop is busy"])
def test_a_stop_signal_while_the_loop_waits_writes_the_prepared_restore_in_the_handler(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, waiting: bool) -> None:
    """The handler runs on the loop's thread between two bytecodes: only in the loop's wait is nothing of
    ours half done, so only there does it write; anywhere else the shutdown writes first, as before."""
    text = fixture_manifests()["kubeadm.yaml"]
    agent = ready_agent(tmp_path, text)
    path = agent.files.host_root / MANIFEST
    monkeypatch.setattr(signals, "installed_at", 0.0)  # the test process keeps its own handlers
    signals.reset()
    try:
        process.install_signal_handlers(agent)
        agent._idle_thread = threading.get_ident() if waiting else None
        signals._handler(signal.SIGTERM, None)  # what the interpreter runs on the main thread
        assert (path.read_bytes() == text.encode()) == waiting
        assert agent.events.get_nowait() == "stop"
        assert agent.shutdown() == 0
    finally:
        signals.reset()
    assert path.read_bytes() == text.encode()
    assert sorted(os.listdir(path.parent)) == ["kube-scheduler.yaml"]
    assert agent.phase == NodeState.RESTORED


def test_a_handler_on_another_thread_than_the_waiting_loop_writes_nothing(tmp_path: Path) -> None:
    text = fixture_manifests()["kubeadm.yaml"]
    agent = ready_agent(tmp_path, text)
    path = agent.files.host_root / MANIFEST
    agent._idle_thread = threading.get_ident() + 1  # the loop waits on a thread the handler does not run on
    agent.write_at_signal()
    assert path.read_bytes() != text.encode() and agent.stopper.written_first is None


def test_a_second_signal_during_the_handlers_write_only_requests_the_stop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A nested handler (SIGINT during the SIGTERM handler's write) must not start a second write: two
    interleaved exchanges would swap the manifest back and forth."""
    text = fixture_manifests()["kubeadm.yaml"]
    agent = ready_agent(tmp_path, text)
    path = agent.files.host_root / MANIFEST
    writes: list[str] = []
    real = engine.restore_prepared

    def nested(opts: Files, prepared: engine.PreparedRestore) -> list[str]:
        writes.append("write")
        if len(writes) == 1:
            signals._handler(signal.SIGINT, None)  # the second signal, in the middle of the first write
        return real(opts, prepared)

    monkeypatch.setattr(engine, "restore_prepared", nested)
    monkeypatch.setattr(signals, "installed_at", 0.0)
    signals.reset()
    try:
        process.install_signal_handlers(agent)
        agent._idle_thread = threading.get_ident()
        signals._handler(signal.SIGTERM, None)
    finally:
        signals.reset()
    assert writes == ["write"] and path.read_bytes() == text.encode()
    assert agent.shutdown() == 0
    assert writes == ["write"]
    assert sorted(os.listdir(path.parent)) == ["kube-scheduler.yaml"]
    assert agent.phase == NodeState.RESTORED


class Successor:
    """The owner watch as it answers once the API adapters are attached: the DaemonSet still wants a pod here."""

    def view(self) -> lifecycle.DaemonSetView:
        return lifecycle.DaemonSetView(known=True, exists=True, selects=True, name="scheduler-patcher")

    def confirm(self, timeout: float) -> lifecycle.DaemonSetView:
        return self.view()


def test_the_stop_goes_on_from_the_view_the_handlers_write_was_decided_by(tmp_path: Path) -> None:
    """``auto``: the handler restored while it could not know the DaemonSet (the API adapters not attached);
    they attach before the shutdown, whose own view would keep. The stop must not keep what is put back."""
    text = fixture_manifests()["kubeadm.yaml"]
    agent = ready_agent(tmp_path, text)
    path = agent.files.host_root / MANIFEST
    assert agent.rules.restore_on_exit == "auto" and agent.world.owner is None
    agent._idle_thread = threading.get_ident()
    agent.write_at_signal()
    agent.request_stop()
    assert path.read_bytes() == text.encode()
    agent.world.owner = Successor()  # attached meanwhile
    assert agent.shutdown() == 0
    assert path.read_bytes() == text.encode()
    assert sorted(os.listdir(path.parent)) == ["kube-scheduler.yaml"]
    assert agent.phase == NodeState.RESTORED


def test_settle_stops_asking_about_files_that_keep_changing(tmp_path: Path) -> None:
    """Touched again and again with the same bytes, the files never settle: after a few asks that find them
    changed, the loop is no longer woken for them, and the restore compares them in full. Asks that find them
    as they were (the loop woken by other events) do not count."""
    agent = ready_agent(tmp_path, fixture_manifests()["kubeadm.yaml"])
    assert agent.stopper.prepared is not None and agent.stopper.prepared[1].staged is not None
    staged = agent.stopper.prepared[1].staged
    agent.stopper.clock_ns = lambda: staged.stat().st_ctime_ns  # always just changed
    assert all(agent.stopper.settle() is not None for _ in range(stopping.SETTLE_ASKS + 2))  # unchanged: waits
    answers = []
    for i in range(stopping.SETTLE_ASKS):
        os.utime(staged, ns=(10**9 * (i + 1), 10**9 * (i + 1)))  # touched, the same bytes
        answers.append(agent.stopper.settle())
    assert all(a is not None for a in answers[:-1]) and answers[-1] is None
    assert agent.stopper.settle() is None and agent.stopper.prepared[1].seen is None
