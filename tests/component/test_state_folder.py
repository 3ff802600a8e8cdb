"""A state folder that cannot take the record (read-only, full, gone) keeps the agent up.

The node says ``Failed`` with the folder and the kernel's answer, ``/healthz`` stays 200 and ``/readyz`` 503,
nothing is written (a manifest write whose record cannot be saved could not be undone), the folder is tried
again with a doubling delay, and once it works the node goes on by the usual protocol, without a restart.

The tests run as root, for whom ``chmod`` makes nothing read-only. So: ``nodefiles`` on pyfakefs with the root
user switched off and a tiny mount for the full disk; the agent with the fault injected through the file
operations it is handed (``Hooked``: its ``create`` hook raises the kernel's ``OSError`` where a temp file would
be made in the state folder), and with a file where the folder's parent should be (``ENOTDIR``, real for root too).
"""

from __future__ import annotations

import errno
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyfakefs.fake_filesystem import FakeFilesystem, set_uid
from pyfakefs.fake_filesystem_unittest import Patcher

from patcher.adapters import fsio
from patcher.adapters.health import Health, HealthServer
from patcher.core.errors import StateFolderError
from patcher.core.lifecycle import LoopEvent
from patcher.core.settings import Files
from patcher.core.status import NodeStatus
from patcher.services import nodefiles
from patcher.services.agent import Agent
from patcher.services.record import state_store, writer_lock
from tests.component.test_lifecycle_stateful import FakeKubelet
from tests.harness import helpers
from tests.harness.childproc import Child
from tests.harness.fileops import Hooked
from tests.harness.helpers import KUBEADM, SCHEDULER_CONFIG, SCHEMAS, Node, Running, fake_node, node, wait_until
from tests.harness.settings import build_settings

__all__ = ["node"]  # the fixture, imported for the tests below

STATE_DIR = "/var/lib/scheduler-patcher"


# -- nodefiles: the fault is found before any file is in place ------------------------------------------------


@pytest.fixture
def fake() -> Iterator[FakeFilesystem]:
    """A node on pyfakefs where permissions hold (the tests run as root, who would pass every check)."""
    with Patcher(allow_root_user=False) as patcher:
        fs = patcher.fs
        assert fs is not None
        user = os.getuid()  # not root: pyfakefs says 1
        set_uid(0)  # the schemas are mapped in as root (their real folders are root's), all at once
        fs.add_real_directory(SCHEMAS, read_only=True, lazy_read=False)
        set_uid(user)
        fake_node(fs, schemas=False)
        yield fs


OPTS = Files(source=Path("/src"))


def snapshot() -> dict[str, bytes | None]:
    """The fake node, but the schemas and the writer lock (which an apply may make before it fails)."""
    return helpers.snapshot(skip=lambda path: path.startswith(str(SCHEMAS)) or path.endswith("/" + fsio.LOCK_NAME))


def test_a_full_state_folder_fails_the_apply_before_any_file_is_in_place(fake: FakeFilesystem) -> None:
    fake.create_dir(STATE_DIR)
    fake.add_mount_point(STATE_DIR, total_size=16)  # room for the lock, not for the record
    plan = nodefiles.plan_apply(OPTS)
    before = snapshot()
    with pytest.raises(StateFolderError) as exc:
        nodefiles.apply(OPTS, plan)
    assert str(exc.value) == f"{STATE_DIR}/original-manifest.yaml: write failed: No space left on device"
    assert snapshot() == before  # no config file, no manifest, no temp file left


def test_a_read_only_state_folder_fails_the_apply_before_any_file_is_in_place(fake: FakeFilesystem) -> None:
    fake.create_dir(STATE_DIR, perm_bits=0o555)
    plan = nodefiles.plan_apply(OPTS)
    before = snapshot()
    with pytest.raises(StateFolderError) as exc:
        nodefiles.apply(OPTS, plan)
    assert str(exc.value) == f"{STATE_DIR}: folder is not writable; nothing was written"
    assert snapshot() == before


def test_a_state_folder_that_cannot_be_made_fails_the_apply_and_the_lock(fake: FakeFilesystem) -> None:
    fake.create_file("/var/lib", contents="a file where a folder should be")
    plan = nodefiles.plan_apply(OPTS)
    before = snapshot()
    with pytest.raises(StateFolderError) as exc:
        nodefiles.apply(OPTS, plan)
    assert STATE_DIR in str(exc.value)
    assert snapshot() == before
    with pytest.raises(StateFolderError, match=r"Not a directory"), writer_lock(OPTS):
        pass


def test_a_state_folder_that_fills_up_on_the_record_leaves_the_config_files_alone(fake: FakeFilesystem) -> None:
    """Every temp file is written before any is renamed: the record's ENOSPC comes before the config files'
    renames, so even they are not in place (and the error is raised as the state folder's)."""
    nodefiles.apply(OPTS, nodefiles.plan_apply(OPTS))
    Path("/src/config.yaml").write_text(SCHEDULER_CONFIG + "percentageOfNodesToScore: 20\n")
    plan = nodefiles.plan_apply(OPTS)
    fake.add_mount_point(STATE_DIR, total_size=os.path.getsize(f"{STATE_DIR}/state.json") + 1)
    before = snapshot()
    with pytest.raises(StateFolderError, match="No space left on device"):
        nodefiles.apply(OPTS, plan)
    assert snapshot() == before


# -- the agent: up, Failed with the folder's error, retried, recovered ---------------------------------------


def refuse(point_path: Path, code: int) -> Callable[[str, Path], None]:
    """A ``Hooked`` file operations' hook: every file made in ``point_path`` (a folder) fails with ``code``."""
    def hook(point: str, path: Path) -> None:
        if point == "create" and path.parent == point_path:
            raise OSError(code, os.strerror(code), str(path))
    return hook


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def state_errors(agent: Running) -> float:
    """How often the state folder refused the record (each retry counts)."""
    lines = agent.metrics.render().decode().splitlines()
    return next((float(line.split()[-1]) for line in lines
                 if line.startswith('scheduler_patcher_errors_total{kind="state"}')), 0.0)


def failed_with(node: Node, *words: str) -> Callable[[], bool]:
    return lambda: node.state() == "Failed" and all(w in node.annotations().get("message", "") for w in words)


def test_a_read_only_state_folder_at_start_keeps_the_agent_up_and_recovers_without_a_restart(node: Node) -> None:
    """Once, the write failed (Failed, "nothing was changed") and was never tried again; a folder
    the lock could not be made in ended the agent with exit 1 (below)."""
    state_dir = node.root / STATE_DIR.lstrip("/")
    ops = Hooked()
    with ops.calling(refuse(state_dir, errno.EROFS)):
        agent = Running(node, state_retry=0.05, state_retry_max=0.2, file_ops=ops)
        server = HealthServer(agent.health, agent.metrics, "127.0.0.1:0")
        server.start()
        try:
            assert wait_until(failed_with(node, STATE_DIR, "Read-only file system"), 30), node.annotations()
            message = node.annotations()["message"]
            assert message.startswith(f"state folder unusable: {STATE_DIR}")
            assert node.manifest.read_bytes() == KUBEADM  # nothing written while it cannot be recorded
            assert http_status(server.url + "/healthz") == 200 and http_status(server.url + "/readyz") == 503
            assert agent.agent.node.phase is not None and agent.agent.node.phase.value == "Failed"  # health = the phase
            assert agent.thread.is_alive()
            # the retry keeps trying (a doubling delay, capped): a few more failures, still one Warning
            assert wait_until(lambda: state_errors(agent) >= 4, 30)
            warnings = [e for e in node.emu.events() if e["reason"] == "StateFolderFailed"]
            assert len(warnings) == 1 and warnings[0]["type"] == "Warning" and warnings[0]["message"] == message
        except BaseException:
            agent.stop()
            server.stop()
            raise
    try:
        # the folder is writable again: the next retry saves the record and the usual protocol patches
        assert wait_until(lambda: node.state() == "Ready", 30), node.annotations()
        assert b"--config=" in node.manifest.read_bytes() and "message" not in node.annotations()
        assert http_status(server.url + "/readyz") == 200
    finally:
        assert agent.stop() == 0
        server.stop()
    assert node.manifest.read_bytes() == KUBEADM


def test_a_ready_node_whose_state_folder_is_read_only_at_start_fails_and_recovers_without_a_write(
        node: Node) -> None:
    """The record loads (a Ready node: the agent was upgraded), the start's save fails: Failed, since this agent
    could record nothing it does. Once the folder is writable the node is Ready again without a write and
    without a scheduler restart."""
    first = Running(node, restore_on_exit="never")
    try:
        assert wait_until(lambda: node.state() == "Ready", 30), node.annotations()
    finally:
        assert first.stop() == 0
    patched, restarts = node.manifest.read_bytes(), len(node.kubelet.restarts)
    state_dir = node.root / STATE_DIR.lstrip("/")
    ops = Hooked()
    with ops.calling(refuse(state_dir, errno.EROFS)):
        agent = Running(node, state_retry=0.05, state_retry_max=0.2, file_ops=ops)
        try:
            assert wait_until(failed_with(node, STATE_DIR, "Read-only file system"), 30), node.annotations()
            assert agent.agent.node.record.config_hash == node.annotations()["config-hash"]  # the record did load
        except BaseException:
            agent.stop()
            raise
    try:
        assert wait_until(lambda: node.state() == "Ready", 30), node.annotations()
        assert node.manifest.read_bytes() == patched and len(node.kubelet.restarts) == restarts
    finally:
        assert agent.stop() == 0
    assert node.manifest.read_bytes() == KUBEADM


def test_a_state_folder_that_fills_up_while_ready_holds_the_next_change_back(node: Node) -> None:
    ops = Hooked()
    agent = Running(node, state_retry=0.05, state_retry_max=0.2, file_ops=ops)
    try:
        assert wait_until(lambda: node.state() == "Ready", 30), node.annotations()
        ready_manifest, ready_hash = node.manifest.read_bytes(), node.annotations()["config-hash"]
        state_dir = node.root / STATE_DIR.lstrip("/")
        with ops.calling(refuse(state_dir, errno.ENOSPC)):
            node.set_source(node.src.joinpath("extenders.yaml").read_text().replace("weight: 1", "weight: 3"))
            assert wait_until(failed_with(node, STATE_DIR, "No space left on device"), 30), node.annotations()
            assert node.manifest.read_bytes() == ready_manifest  # the scheduler keeps its Ready config
            assert node.annotations()["config-hash"] == ready_hash
            assert not agent.health.ready() and agent.health.alive()
        assert wait_until(lambda: node.state() == "Ready" and node.annotations()["config-hash"] != ready_hash, 30), \
            node.annotations()
        assert b"weight: 3" in b"".join(p.read_bytes() for p in (node.root / "etc/kubernetes/scheduler-patcher")
                                        .iterdir())
    finally:
        assert agent.stop() == 0
    assert node.manifest.read_bytes() == KUBEADM


def test_a_transition_whose_save_fails_is_held_and_said_again_once_the_folder_works(node: Node) -> None:
    """The record is saved with the write (before the manifest); the folder fails right after, so the
    transition to Ready cannot be saved: Failed, and Ready once the folder takes the record."""
    state_dir = node.root / STATE_DIR.lstrip("/")
    broken = {"on": False}
    eio = refuse(state_dir, errno.EIO)

    def hook(point: str, path: Path) -> None:
        if point == "before-rename" and path == node.manifest:
            broken["on"] = True  # the record is in place; every later save fails
        if broken["on"]:
            eio(point, path)

    ops = Hooked()
    with ops.calling(hook):
        agent = Running(node, state_retry=0.05, state_retry_max=0.2, file_ops=ops)
        try:
            assert wait_until(failed_with(node, STATE_DIR, "Input/output error"), 30), node.annotations()
            assert b"--config=" in node.manifest.read_bytes()  # the write itself was recorded
            assert wait_until(lambda: len(node.kubelet.restarts) == 2, 30)  # the scheduler restarted on it
        except BaseException:
            agent.stop()
            raise
        broken["on"] = False
        try:
            assert wait_until(lambda: node.state() == "Ready", 30), node.annotations()
        finally:
            assert agent.stop() == 0
    assert node.manifest.read_bytes() == KUBEADM


def test_a_state_folder_that_cannot_be_made_does_not_end_the_agent(node: Node) -> None:
    """A file where the folder's parent should be: ENOTDIR for root too. Once, ``run`` raised out of
    the writer lock (the process exited 1)."""
    blocker = node.root / "var/lib"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a folder")
    agent = Running(node, state_retry=0.05, state_retry_max=0.2)
    try:
        assert wait_until(failed_with(node, STATE_DIR, "Not a directory"), 30), node.annotations()
        assert agent.thread.is_alive() and agent.health.alive() and not agent.health.ready()
        assert node.manifest.read_bytes() == KUBEADM
        blocker.unlink()
        assert wait_until(lambda: node.state() == "Ready", 30), node.annotations()
        assert (node.root / STATE_DIR.lstrip("/") / "state.json").is_file()
    finally:
        assert agent.stop() == 0
    assert node.manifest.read_bytes() == KUBEADM


def test_the_agent_process_with_an_unmakeable_state_folder_stays_up_serves_probes_and_recovers(
        tmp_path: Path) -> None:
    """The process as the DaemonSet runs it (``run``, here without an API). Once, it exited 1 at once:
    ``<state-dir>: folder is not writable (cannot create the writer lock .lock: Not a directory)``."""
    root, src = helpers.node_folders(tmp_path)
    blocker = root / "var/lib"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a folder")
    child = Child("run", "--no-api", "--check-extenders=false", "--host-root", str(root), "--source", str(src),
                  "--listen", "127.0.0.1:0")
    try:
        child.wait_line(r"state folder unusable: /var/lib/scheduler-patcher: .*Not a directory")
        assert wait_until(lambda: child.get("/healthz") == 200, 60), child.output  # the loop beats (after start)
        assert child.get("/readyz") == 503
        assert child.proc.poll() is None and (root / helpers.MANIFEST).read_bytes() == KUBEADM
        blocker.unlink()
        child.wait_line(r"the state folder takes the record again")
        assert wait_until(lambda: child.get("/readyz") == 200, 60), child.output  # no API: Ready once written
        assert b"--config=" in (root / helpers.MANIFEST).read_bytes()
    finally:
        code = child.terminate()
    assert code == 0, child.output
    assert (root / helpers.MANIFEST).read_bytes() == KUBEADM


# -- the order: a phase the record could not take is never said ------------------------------------------------


class SaidHealth(Health):
    """Health that keeps every state it was told (what ``/readyz`` answered, in order)."""

    def __init__(self) -> None:
        super().__init__()
        self.said: list[str] = []

    def set_state(self, state: str) -> None:
        self.said.append(str(state))
        super().set_state(state)


class SaidReporter:
    """A Node reporter that keeps every state published (the annotations and transition Events)."""

    def __init__(self) -> None:
        self.published: list[str] = []

    def publish(self, status: NodeStatus, *, reason: str | None = None, message: str | None = None) -> None:
        self.published.append(status.state.value)

    def note(self, reason: str, message: str, *, warning: bool = False) -> None:
        pass

    def flush(self, timeout: float) -> bool:
        return True


def test_ready_whose_record_cannot_be_saved_is_never_said_on_readyz_or_the_node(tmp_path: Path) -> None:
    """The scheduler comes back on the new config just as the state folder turns read-only: the transition
    to Ready cannot be recorded, so neither ``/readyz`` nor the Node may say Ready, not even for an instant
    (the reporter's thread may PATCH the annotation and send the SchedulerRestarted Event at once). Before the
    review the phase reached the health and the reporter first and the save was tried after: Ready, then
    Failed. Driven step by step (no loop thread), with the stateful test's kubelet."""
    root, src = helpers.node_folders(tmp_path)
    kubelet = FakeKubelet(root)
    kubelet.sync()
    health, reporter = SaidHealth(), SaidReporter()
    agent = Agent(build_settings(files=Files(source=src, host_root=root), node_name="cp-1", check_extenders=False,
                                 restart_timeout=3600.0, restart_settle=0.0, state_retry=0.05),
                  pods=kubelet, health=health, reporter=reporter, file_ops=(ops := Hooked()))
    agent.start()
    assert agent.node.phase is not None and agent.node.phase.value == "WaitingForRestart"
    kubelet.sync()  # the scheduler runs the patched manifest
    health.said.clear()
    reporter.published.clear()
    with ops.calling(refuse(root / STATE_DIR.lstrip("/"), errno.EROFS)):
        agent.notify(LoopEvent.POD)  # what a mirror pod update does
        assert agent.turn() is LoopEvent.POD
    assert agent.node.record.phase == "Failed"
    assert "Ready" not in health.said and "Ready" not in reporter.published, (health.said, reporter.published)
    assert agent.node.fault is not None and agent.node.fault.phase == "Ready"  # said once the folder works
    agent.timers.state_retry_at = 0.0  # the folder's retry is due (the loop's timer, no sleep)
    assert agent.turn() is None
    assert agent.node.record.phase == "Ready"
    assert reporter.published[-1] == "Ready" and health.said[-1] == "Ready"


def test_timers_due_during_a_fault_do_not_wake_the_loop_every_50_ms(tmp_path: Path) -> None:
    """While the record cannot be saved only the state folder's retry does anything: a resync (or a probe or
    Lease retry) that falls due meanwhile is held back, not cleared, so before the review the loop's timeout
    was its floor, 50 ms, for as long as the fault lasted (hours for a read-only remount)."""
    root, src = helpers.node_folders(tmp_path)
    kubelet = FakeKubelet(root)
    kubelet.sync()
    agent = Agent(build_settings(files=Files(source=src, host_root=root), node_name="cp-1", check_extenders=False,
                                 restart_timeout=3600.0, restart_settle=0.0, resync_interval=0.0, state_retry=30.0,
                                 state_retry_max=30.0),
                  pods=kubelet, file_ops=(ops := Hooked()))
    with ops.calling(refuse(root / STATE_DIR.lstrip("/"), errno.EROFS)):
        agent.start()
        assert agent.node.fault is not None
        assert agent.turn() is None  # a loop turn with the resync due: held back by the fault
        assert agent.world.timeout(agent.rules) > 1.0  # the next timer is the folder's retry (30 s) or the heartbeat


def test_a_state_folder_whose_fsync_fails_after_the_record_is_renamed_fails_the_apply_cleanly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The folder's own fsync (after the record's rename, before the manifest's) fails with EIO: a dying disk.
    Before the review that OSError left ``nodefiles.apply`` raw: the config files it created stayed, the record
    claiming the patch stayed, and the agent took it for an internal error instead of the state folder's
    fault. Now it is the state folder's error, raised before the manifest is touched, and the node is as
    it was."""
    root, src = helpers.node_folders(tmp_path)
    opts = Files(source=src, host_root=root)
    state_dir = os.path.realpath(root / STATE_DIR.lstrip("/"))
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.path.realpath(f"/proc/self/fd/{fd}") == state_dir:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    plan = nodefiles.plan_apply(opts)
    fsio.ensure_dir(Path(state_dir), 0o700)
    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(StateFolderError, match="Input/output error"):
        nodefiles.apply(opts, plan)
    monkeypatch.undo()
    assert (root / helpers.MANIFEST).read_bytes() == KUBEADM
    assert not (root / "etc/kubernetes/scheduler-patcher").exists()  # made by this apply: removed again
    assert not os.path.exists(os.path.join(state_dir, "state.json"))  # no record claims a patch


def test_a_manifest_folder_whose_fsync_fails_after_the_rename_keeps_what_the_manifest_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifest is renamed in place, then its folder's fsync fails: the config files it names and the record
    of it must stay (removing them would restart the scheduler onto a missing file). Before the review the raw
    OSError left apply; with the folder's failure a refusal like the others, this is a PartialWrite."""
    root, src = helpers.node_folders(tmp_path)
    opts = Files(source=src, host_root=root)
    manifest_dir = os.path.realpath(root / "etc/kubernetes/manifests")
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.path.realpath(f"/proc/self/fd/{fd}") == manifest_dir:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    plan = nodefiles.plan_apply(opts)
    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(nodefiles.PartialWrite, match="not done: making it durable") as exc:
        nodefiles.apply(opts, plan)
    monkeypatch.undo()
    patched = (root / helpers.MANIFEST).read_bytes()
    assert b"--config=" in patched and f"wrote /{helpers.MANIFEST}; not done: " in str(exc.value)
    config = plan.config
    assert config is not None
    assert (root / "etc/kubernetes/scheduler-patcher" / config.main).is_file()
    assert state_store(opts).load().patched_sha256 == nodefiles.sha256(patched)
