"""A ``--config`` that names a missing file, on the agent's side.

The agent's own config file deleted is written back at once (the host config folder is watched), through the
usual plan and write, without a manifest write (the kubelet restarts nothing). A missing file the agent does not
write back (another prefix's config, a source refused or known bad) makes the node Failed, its message naming
the path, with the ``scheduler_patcher_config_missing`` gauge at 1, until the file is back; then the node says
again what it said before. The decision is ``lifecycle.planned`` (pure, tested first); then the agent on a real
tmp_path without the API; then the folder watch; then the agent against the API emulator and the kubelet sim.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from patcher.core import lifecycle as lc
from patcher.core.manifestedit import MISSING_FILE
from patcher.core.settings import Files, Lifecycle
from patcher.core.state import LastGood, State
from patcher.core.status import NodeState
from patcher.services import nodefiles
from patcher.services.runner import build_agent
from tests.conftest import write_configmap
from tests.harness.emu.kubeemu import wait_until
from tests.harness.helpers import EXTENDERS, MANIFEST, Node, Running, metric, node_folders
from tests.harness.helpers import node as node
from tests.harness.settings import build_settings

OPTS = Lifecycle(restart_timeout=60.0, check_extenders=False)
H1, H2 = "a" * 64, "b" * 64
GONE = (f"/etc/kubernetes/scheduler-patcher/config-{H2[:12]}.yaml: kube-scheduler's "
        f"--config=/etc/kubernetes/scheduler-patcher/config-{H2[:12]}.yaml {MISSING_FILE}; its next start fails")
OTHER = "other.example.com"
CONFIG_DIR = "etc/kubernetes/scheduler-patcher"


def refused(missing: str = "", message: str = "carries the marker of annotation prefix other.example.com"
            ) -> lc.Planned:
    return lc.Planned(1.0, "refused", message=message, error_kind="manifest", missing=missing)


def ready_node() -> lc.Node:
    good = LastGood(config_hash=H1, config_file="config.yaml", files=("config.yaml",), source_hash="s")
    return lc.Node(record=State(phase=NodeState.READY.value, config_hash=H1, patched_sha256="p",
                                original_sha256="o", last_good=good))


def publishes(acts: list[lc.Action]) -> list[lc.Publish]:
    return [a for a in acts if isinstance(a, lc.Publish)]


# -- the decision (pure) --------------------------------------------------------------------------------------


def test_a_missing_file_the_plan_does_not_write_back_is_failed_naming_the_path_once() -> None:
    start = lc.Node(record=State(phase=NodeState.FAILED.value, message="carries the marker …; nothing was changed"))
    n, acts = lc.step(start, refused(GONE), OPTS)
    # The missing file first, then the refusal it would say without it (the way out of both).
    refusal = "carries the marker of annotation prefix other.example.com; nothing was changed"
    assert n.phase == NodeState.FAILED and n.record.message == f"{GONE}; also: {refusal}"
    assert publishes(acts) == [lc.Publish()]  # one report; Failed already: a Note is the Event
    assert lc.Note("ConfigMissing", GONE, warning=True) in acts
    assert [a.message for a in acts if isinstance(a, lc.Log) and a.level == "error"][-1] == GONE
    # The next plan finds the same: nothing new to say (no Publish, no second error line for the file).
    n2, acts2 = lc.step(n, refused(GONE), OPTS)
    assert n2.record == n.record and publishes(acts2) == []
    assert GONE not in [a.message for a in acts2 if isinstance(a, lc.Log)]


def test_once_the_file_is_back_the_node_says_again_what_it_said_before() -> None:
    n, acts0 = lc.step(ready_node(), lc.Planned(1.0, "known-bad", message="config bbb failed before",
                                                missing=GONE), OPTS)
    assert n.phase == NodeState.FAILED and n.record.message == GONE and n.missing is not None
    assert publishes(acts0) == [lc.Publish("ConfigMissing")]  # the change of phase carries the Event
    assert not any(isinstance(a, lc.Note) for a in acts0)
    n2, acts = lc.step(n, lc.Planned(2.0, "known-bad", message="config bbb failed before"), OPTS)
    assert n2.phase == NodeState.READY and n2.record.message is None and n2.missing is None
    assert len(publishes(acts)) == 1
    assert n2.record.config_hash == H1 and n2.record.last_good == n.record.last_good  # nothing else touched


def test_a_refusal_that_changes_while_the_file_is_missing_comes_back_as_it_is_now() -> None:
    n, _ = lc.step(lc.Node(), refused(GONE, "first refusal"), OPTS)
    n, _ = lc.step(n, refused(GONE, "second refusal"), OPTS)
    assert n.record.message == f"{GONE}; also: second refusal; nothing was changed"
    n, _ = lc.step(n, refused("", "second refusal"), OPTS)
    assert n.phase == NodeState.FAILED and n.record.message == "second refusal; nothing was changed"


def test_a_write_that_puts_the_file_back_is_not_an_error() -> None:
    """The plan writes the missing file back (``missing`` empty): a write of config files only, no restart."""
    n, acts = lc.step(ready_node(), lc.Planned(1.0, "pending", config_hash=H1, files=("config.yaml",)), OPTS)
    assert n.phase == NodeState.READY and lc.Apply() in acts and publishes(acts) == []
    n, acts = lc.step(n, lc.Wrote(2.0, n.record, manifest_change=False), OPTS)
    assert n.wait is None and n.phase == NodeState.READY and lc.Watch() not in acts


def test_a_write_waiting_for_its_restart_keeps_its_wait_and_says_it_in_an_event() -> None:
    n, _ = lc.step(ready_node(), lc.Planned(1.0, "pending", config_hash=H2, manifest_change=True), OPTS)
    n, _ = lc.step(n, lc.Wrote(1.0, State(config_hash=H2, manifest_mtime_ns=5), manifest_change=True), OPTS)
    assert n.phase == NodeState.WAITING_FOR_RESTART
    n2, acts = lc.step(n, refused(GONE), OPTS)
    assert n2.phase == NodeState.WAITING_FOR_RESTART and n2.wait == n.wait
    assert lc.Note("ConfigMissing", GONE, warning=True) in acts and publishes(acts) == []
    n3, acts3 = lc.step(n2, refused(), OPTS)  # the file is back: nothing to say again, the wait stands
    assert n3.phase == NodeState.WAITING_FOR_RESTART and n3.missing is None and publishes(acts3) == []


def test_after_a_restart_of_the_agent_its_own_earlier_report_is_cleared_by_the_next_plan() -> None:
    """The record a restarted agent loads says Failed with the missing file; what it said before is lost:
    the plan decides (here a source known bad: Failed with that sentence, never the stale path)."""
    loaded = lc.Node(record=State(phase=NodeState.FAILED.value, message=GONE))
    n, _ = lc.step(loaded, lc.Resumed(0.0), OPTS)
    n, acts = lc.step(n, lc.Planned(1.0, "known-bad", message="config bbb failed before"), OPTS)
    assert n.phase == NodeState.FAILED and n.record.message == "config bbb failed before"
    assert len(publishes(acts)) == 1
    still, _ = lc.step(loaded, lc.Planned(1.0, "known-bad", message="x", missing=GONE), OPTS)
    back, _ = lc.step(still, lc.Planned(2.0, "up-to-date", config_hash=H1, current_sha256="p"), OPTS)
    assert back.phase == NodeState.WAITING_FOR_RESTART  # adopted as any Failed node whose manifest is ours


GONE2 = GONE.replace(H2[:12], H1[:12])
PLANS = st.builds(
    lc.Planned, now=st.just(1.0), kind=st.sampled_from(["refused", "known-bad", "up-to-date", "pending"]),
    message=st.sampled_from(["", "refusal one", "refusal two"]), config_hash=st.sampled_from([H1, H2]),
    current_sha256=st.just("p"), missing=st.sampled_from(["", GONE, GONE2]))
STARTS = st.sampled_from([lc.Node(), ready_node(),
                          lc.Node(record=State(phase=NodeState.FAILED.value, message="x; nothing was changed")),
                          lc.Node(record=State(phase=NodeState.ROLLED_BACK.value, message="rolled back")),
                          lc.Node(record=State(phase=NodeState.FAILED.value, message=GONE))])


@settings(max_examples=300, deadline=None)
@given(STARTS, st.lists(PLANS, min_size=1, max_size=12))
def test_any_sequence_of_plans_says_a_missing_file_exactly_while_it_is_missing(
        start: lc.Node, plans: list[lc.Planned]) -> None:
    """Whatever the plans find, in any order: while a plan reports a missing file (and no write waits for its
    restart) the node is Failed with a message that starts with it; once a plan reports none, no message
    speaks of a missing file; a step reports (Publish) at most once."""
    n = start
    for ev in plans:
        n, acts = lc.step(n, ev, OPTS)
        assert len(publishes(acts)) <= 1
        if ev.missing and n.wait is None:
            assert n.phase == NodeState.FAILED and (n.record.message or "").startswith(ev.missing)
        if not ev.missing:
            assert MISSING_FILE not in (n.record.message or "") and n.missing is None


# -- the agent on a real tmp_path, no API -----------------------------------------------------------------------


@pytest.fixture
def agent_node(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    yield node_folders(tmp_path)


def test_the_agents_own_config_deleted_is_written_back_without_touching_the_manifest(
        agent_node: tuple[Path, Path], caplog: pytest.LogCaptureFixture) -> None:
    root, src = agent_node
    agent = build_agent(build_settings(files=Files(source=src, host_root=root), check_extenders=False,
                                       no_api=True), None).agent
    assert agent.start() and agent.node.phase == NodeState.READY
    (config,) = (root / CONFIG_DIR).iterdir()
    content, manifest = config.read_bytes(), (root / MANIFEST)
    before = (manifest.read_bytes(), manifest.stat().st_mtime_ns, manifest.stat().st_ino)
    wrote = metric(agent.metrics, "scheduler_patcher_writes_total")
    config.unlink()
    with caplog.at_level(logging.WARNING, logger="patcher.services.agent"):
        agent.reconcile("config folder changed")
    assert config.read_bytes() == content
    # The kubelet restarts a static pod when its manifest changes: not a byte, not an inode, not an mtime.
    assert (manifest.read_bytes(), manifest.stat().st_mtime_ns, manifest.stat().st_ino) == before
    assert metric(agent.metrics, "scheduler_patcher_writes_total") == (wrote or 0) + 1
    assert agent.node.phase == NodeState.READY and agent.node.record.message is None
    assert metric(agent.metrics, "scheduler_patcher_config_missing") == 0
    assert any("missing; writing it back" in r.getMessage() for r in caplog.records)
    assert agent.shutdown() == 0


def other_prefix_patched(root: Path, src: Path) -> Path:
    """The manifest patched under another annotation prefix (by its own agent or CLI); returns its config."""
    other = Files(source=src, host_root=root, prefix=OTHER)
    plan = nodefiles.plan_apply(other)
    nodefiles.apply(other, plan, State())
    assert plan.config is not None
    return root / CONFIG_DIR / plan.config.main


def test_another_prefixs_config_missing_is_failed_with_the_path_until_it_is_back(
        agent_node: tuple[Path, Path]) -> None:
    root, src = agent_node
    theirs = other_prefix_patched(root, src)
    content = theirs.read_bytes()
    theirs.unlink()
    # restore_on_exit=never: a restore of a manifest patched under another prefix is refused (nothing of ours)
    agent = build_agent(build_settings(files=Files(source=src, host_root=root), check_extenders=False,
                                       no_api=True, restore_on_exit="never"), None).agent
    assert agent.start()
    node_path = "/" + str(theirs.relative_to(root))
    assert agent.node.phase == NodeState.FAILED and agent.node.record.message is not None
    assert agent.node.record.message.startswith(f"{node_path}: kube-scheduler's --config={node_path} {MISSING_FILE}")
    assert metric(agent.metrics, "scheduler_patcher_config_missing") == 1
    assert not theirs.exists()  # not ours to write: the other prefix's agent or a restore with it does
    theirs.write_bytes(content)
    agent.reconcile("config folder changed")
    assert agent.node.phase == NodeState.FAILED and agent.node.record.message is not None
    assert f"pass --annotation-prefix {OTHER}" in agent.node.record.message  # the refusal it had without the file
    assert metric(agent.metrics, "scheduler_patcher_config_missing") == 0
    assert agent.shutdown() == 0


def test_a_foreign_config_in_a_folder_the_agent_cannot_see_is_not_called_missing(
        agent_node: tuple[Path, Path]) -> None:
    """In its pod the agent sees only the folders mounted into it: a foreign config elsewhere is unseen, and
    the refusal (which names the path it looked at and both ways out) is the news, not a missing file."""
    root, src = agent_node
    text = (root / MANIFEST).read_text().replace(
        "    - --leader-elect=true\n", "    - --leader-elect=true\n    - --config=/etc/unmounted/sched.yaml\n")
    text = text.replace("  volumes:\n", "  volumes:\n  - hostPath: {path: /etc/unmounted}\n    name: unmounted\n"
                        ).replace("    volumeMounts:\n", "    volumeMounts:\n    - {mountPath: /etc/unmounted, "
                                                          "name: unmounted}\n")
    (root / MANIFEST).write_text(text)
    assert "--config=/etc/unmounted/sched.yaml" in (root / MANIFEST).read_text()
    files = Files(source=src, host_root=root)
    assert nodefiles.missing_named_config(files) == ""
    (root / "etc/unmounted").mkdir()  # mounted now, and the file is not there: missing
    assert nodefiles.missing_named_config(files).startswith("/etc/unmounted/sched.yaml: ")


# -- the folder watch -------------------------------------------------------------------------------------------


def test_what_the_config_watch_compares_moves_with_a_deletion_and_not_with_the_agents_own_writes(
        agent_node: tuple[Path, Path]) -> None:
    """``nodefiles.named_missing_fingerprint``: a write of a new config and the prune of the old one leave it as
    it was (no second reconcile for our own work, however slow the write); a deletion changes it."""
    root, src = agent_node
    files = Files(source=src, host_root=root)
    agent = build_agent(build_settings(files=files, check_extenders=False, no_api=True), None).agent
    assert nodefiles.named_missing_fingerprint(files) == ""  # nothing named yet, and the folder is not there
    assert agent.start() and agent.node.phase == NodeState.READY
    first = agent.node.record.config_file
    write_configmap(src, {"extenders.yaml": EXTENDERS.replace("weight: 1", "weight: 4")})
    agent.reconcile("source changed")  # writes the new config and the manifest; Ready at once; prunes the old
    assert agent.node.record.config_file != first and not (root / CONFIG_DIR / first).exists()
    assert nodefiles.named_missing_fingerprint(files) == ""
    (root / CONFIG_DIR / agent.node.record.config_file).unlink()
    assert nodefiles.named_missing_fingerprint(files) == f"/{CONFIG_DIR}/{agent.node.record.config_file}"
    assert agent.shutdown() == 0




def test_a_config_folder_not_there_yet_is_watched_for_then_a_deleted_file_is_seen(tmp_path: Path) -> None:
    from patcher.adapters.watch import FolderWatcher
    from patcher.core.fileread import folder_fingerprint
    from tests.harness.inotify import watched_for_content, watched_for_return

    seen: queue.Queue[str] = queue.Queue()
    watcher = FolderWatcher(seen.put, debounce=0.05)
    folder = tmp_path / CONFIG_DIR
    try:
        watcher.add("config", folder, lambda: folder_fingerprint(folder, limit=1 << 20), missing_ok=True)
        watcher.start()
        assert watched_for_return(folder)  # the nearest existing ancestor, for the folder to appear
        folder.mkdir(parents=True)  # the agent's first write creates it
        (folder / "config-abc.yaml").write_text("kind: KubeSchedulerConfiguration\n")
        assert seen.get(timeout=30) == "config"
        assert wait_until(lambda: watched_for_content(folder), 30)
        (folder / "config-abc.yaml").unlink()  # someone deletes it
        assert seen.get(timeout=30) == "config"
    finally:
        watcher.stop()
    with pytest.raises(Exception, match="does not exist"):  # without missing_ok a missing folder is refused
        FolderWatcher(seen.put).add("source", tmp_path / "nope", lambda: "")


# -- against the API emulator and the kubelet sim ---------------------------------------------------------------


def test_a_deleted_config_is_written_back_at_once_and_the_scheduler_is_not_restarted(node: Node) -> None:
    agent = Running(node)
    assert wait_until(lambda: node.state() == "Ready", 30), node.annotations()
    (config,) = (node.root / CONFIG_DIR).iterdir()
    content, restarts = config.read_bytes(), len(node.kubelet.restarts)
    manifest = (node.manifest.read_bytes(), node.manifest.stat().st_mtime_ns)
    wrote = metric(agent.metrics, "scheduler_patcher_writes_total") or 0
    config.unlink()
    # Seen by the config folder's watch: the periodic resync (5 minutes) is far beyond this wait.
    assert wait_until(lambda: config.exists() and metric(agent.metrics, "scheduler_patcher_writes_total") == wrote + 1,
                      30)
    assert config.read_bytes() == content
    assert (node.manifest.read_bytes(), node.manifest.stat().st_mtime_ns) == manifest
    assert len(node.kubelet.restarts) == restarts and node.state() == "Ready"
    assert "message" not in node.annotations()
    assert agent.stop() == 0


def test_the_node_annotation_names_a_missing_config_the_agent_does_not_write_back(node: Node) -> None:
    theirs = other_prefix_patched(node.root, node.src)
    content = theirs.read_bytes()
    agent = Running(node, restore_on_exit="never")
    assert wait_until(lambda: node.state() == "Failed", 30), node.annotations()
    assert f"pass --annotation-prefix {OTHER}" in node.annotations()["message"]
    theirs.unlink()
    node_path = "/" + str(theirs.relative_to(node.root))
    assert wait_until(lambda: node.annotations().get("message", "").startswith(f"{node_path}: "), 30), \
        node.annotations()
    assert MISSING_FILE in node.annotations()["message"] and node.state() == "Failed"
    assert f"; also: /{MANIFEST}: carries the scheduler-patcher marker" in node.annotations()["message"]
    assert f"pass --annotation-prefix {OTHER}" in node.annotations()["message"]  # the way out, still said
    assert metric(agent.metrics, "scheduler_patcher_config_missing") == 1
    assert wait_until(lambda: "ConfigMissing" in [e["reason"] for e in node.emu.events()], 30)
    theirs.write_bytes(content)
    assert wait_until(lambda: MISSING_FILE not in node.annotations().get("message", MISSING_FILE), 30)
    assert f"pass --annotation-prefix {OTHER}" in node.annotations()["message"] and node.state() == "Failed"
    assert metric(agent.metrics, "scheduler_patcher_config_missing") == 0
    assert agent.stop() == 0
    assert theirs.read_bytes() == content  # never ours to remove
