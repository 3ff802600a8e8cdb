"""Hostile inputs and a bad day on the node: every one is a one-line refusal or a
precise account of what was written, never a hang, a crash or a traceback."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyfakefs.fake_filesystem import FakeFilesystem, set_uid

from patcher.adapters import fsio
from patcher.core import fileread, yamltext
from patcher.core.errors import ManifestError, PatcherError
from patcher.core.settings import Files
from patcher.core.state import State
from patcher.services import nodefiles
from patcher.services.record import remove_stale_temp_files, state_store, writer_lock
from tests.harness import helpers
from tests.harness.fileops import Hooked
from tests.harness.helpers import fake_node, snapshot

KUBEADM = helpers.KUBEADM.decode()
MANIFEST = "/" + helpers.MANIFEST
OPTS = Files(source=Path("/src"))


@pytest.fixture
def node(fs: FakeFilesystem) -> Iterator[FakeFilesystem]:
    fake_node(fs)
    yield fs
    set_uid(0)


def refusal(exc: pytest.ExceptionInfo[PatcherError]) -> str:
    line = str(exc.value)
    assert "\n" not in line and "Traceback" not in line
    return line


# -- item 3: bounded inputs, refused before parsing ------------------------------------------------------------


def test_an_oversized_manifest_is_refused_before_parsing(node: FakeFilesystem) -> None:
    Path(MANIFEST).write_text(KUBEADM + "#" * nodefiles.MAX_MANIFEST_BYTES)
    before = snapshot()
    with pytest.raises(PatcherError) as exc:
        nodefiles.plan_apply(OPTS)
    assert refusal(exc) == (f"{MANIFEST}: manifest is {len(KUBEADM) + nodefiles.MAX_MANIFEST_BYTES} bytes, over the "
                            f"limit of {nodefiles.MAX_MANIFEST_BYTES} bytes")
    assert snapshot() == before


def test_a_manifest_that_would_outgrow_the_limit_once_patched_is_refused(node: FakeFilesystem) -> None:
    """Otherwise restore could no longer read what apply wrote."""
    text = KUBEADM + "#" * (nodefiles.MAX_MANIFEST_BYTES - len(KUBEADM) - 10) + "\n"
    Path(MANIFEST).write_text(text)
    with pytest.raises(ManifestError) as exc:
        nodefiles.plan_apply(OPTS)
    assert refusal(exc).startswith(f"{MANIFEST}: patched, it would be ")
    assert refusal(exc).endswith(f"bytes, over the limit of {nodefiles.MAX_MANIFEST_BYTES} bytes")


@pytest.mark.parametrize(("body", "problem"), [
    ("[" * 60_000 + "]" * 60_000, f"line 1: nested more than {yamltext.MAX_DEPTH} levels deep"),  # crashed it
    ("- " * 50_000 + "x", f"line 1: nested more than {yamltext.MAX_DEPTH} levels deep"),
    ("x: [" + ",".join(["{}"] * (yamltext.MAX_NODES + 1)) + "]", f"line 1: more than {yamltext.MAX_NODES} YAML nodes"),
])
def test_deep_or_huge_yaml_in_the_manifest_is_refused_in_one_line(node: FakeFilesystem, body: str,
                                                                    problem: str) -> None:
    Path(MANIFEST).write_text(body)
    with pytest.raises(ManifestError) as exc:
        nodefiles.plan_apply(OPTS)
    assert refusal(exc).startswith(f"{MANIFEST}: {problem}")


def test_alias_expansion_is_bounded(node: FakeFilesystem) -> None:
    """Billion laughs inside the manifest (9^9 nodes once expanded): it hung the patch step."""
    laughs = "  x0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"  x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9))
    Path(MANIFEST).write_text(KUBEADM.replace("  labels:\n", "  labels:\n" + laughs.replace("  x", "    x"), 1))
    with pytest.raises(ManifestError) as exc:
        nodefiles.plan_apply(OPTS)
    assert "YAML nodes (the limit; aliases count as what they repeat)" in refusal(exc)


def test_node_count_counts_each_alias_as_its_expansion() -> None:
    text = "a: &x [1, 2]\nb: *x\nc: &y {k: *x}\nd: [*y, *y]\n"  # 1 + 4 keys + 3 + 3 + 5 + 11 = 27 nodes

    def padded(scalars: int) -> str:  # a key and a list: 2 + ``scalars`` nodes more
        return text + "e: [" + ", ".join(["0"] * scalars) + "]\n"

    yamltext.check_limits(padded(yamltext.MAX_NODES - 29))
    with pytest.raises(yamltext.YamlTextError, match=f"more than {yamltext.MAX_NODES} YAML nodes"):
        yamltext.check_limits(padded(yamltext.MAX_NODES - 28))


def test_no_real_manifest_comes_near_a_limit() -> None:
    from tests.conftest import corpus_manifests, fixture_manifests

    texts = list(fixture_manifests().values()) + [p.read_text() for p in corpus_manifests()]
    for text in texts:
        yamltext.check_limits(text)


# -- item 4: non-regular files ----------------------------------------------------------------------------------


@pytest.mark.parametrize("via_symlink", [False, True])
def test_a_fifo_in_place_of_the_manifest_is_refused_without_blocking(tmp_path: Path, via_symlink: bool) -> None:
    folder = tmp_path / "etc/kubernetes/manifests"
    folder.mkdir(parents=True)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    if via_symlink:
        (folder / "kube-scheduler.yaml").symlink_to("../../../fifo")  # a node path below the host root
    else:
        os.replace(fifo, folder / "kube-scheduler.yaml")
    opts = Files(source=tmp_path / "src", host_root=tmp_path)
    with pytest.raises(PatcherError) as exc:  # open() blocked forever here before
        nodefiles.plan_apply(opts)
    shown = "/fifo" if via_symlink else MANIFEST  # the resolved node path: that is the file that is wrong
    assert refusal(exc) == f"{shown}: manifest is not a regular file (a FIFO); refusing to read it"
    with pytest.raises(PatcherError, match="not a regular file"):
        nodefiles.plan_restore(opts)


def test_a_device_is_refused_too(tmp_path: Path) -> None:
    with pytest.raises(PatcherError, match=r"not a regular file \(a character device\)"):
        fileread.read_file(Path("/dev/null"), "manifest", limit=1)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


# -- item 5: writability up front, precise partial failures ---------------------------------------------------


@pytest.mark.parametrize("folder", ["/var/lib/scheduler-patcher", "/etc/kubernetes/scheduler-patcher"])
def test_apply_into_a_read_only_state_or_config_folder_is_refused_before_any_write(node: FakeFilesystem,
                                                                                    folder: str) -> None:
    os.makedirs(folder)
    os.chmod(folder, 0o555)
    plan = nodefiles.plan_apply(OPTS)
    before = snapshot()
    set_uid(1000)
    with pytest.raises(PatcherError) as exc:
        nodefiles.apply(OPTS, plan)
    set_uid(0)
    assert refusal(exc) == f"{folder}: folder is not writable; nothing was written"
    assert snapshot() == before


def read_only_state_folder() -> None:
    """The state folder read-only for the writer, who is no longer root; the other folders writable."""
    for folder in ("/etc/kubernetes/manifests", "/etc/kubernetes/scheduler-patcher"):
        if os.path.isdir(folder):
            os.chmod(folder, 0o777)
    os.makedirs("/var/lib/scheduler-patcher", exist_ok=True)
    fsio.ensure_dir(Path("/var/lib/scheduler-patcher"))
    Path("/var/lib/scheduler-patcher/.lock").touch()  # as a node that ran the agent has it
    for name in os.listdir("/var/lib/scheduler-patcher"):  # readable, as they are for the agent (root)
        os.chmod(f"/var/lib/scheduler-patcher/{name}", 0o666)
    os.chmod("/var/lib/scheduler-patcher", 0o555)
    set_uid(1000)


def test_restore_with_a_read_only_state_folder_still_puts_the_manifest_back(node: FakeFilesystem) -> None:
    """The manifest carries our marker: restoring it needs the manifest's folder, not the state folder (a
    SIGTERM while the state folder is read-only must not leave the node patched). Only the record's clearing
    is left undone, and said so. Before the review the restore was refused up front and the manifest stayed
    patched."""
    nodefiles.apply(OPTS, nodefiles.plan_apply(OPTS))
    plan = nodefiles.plan_restore(OPTS)
    read_only_state_folder()
    with pytest.raises(nodefiles.PartialWrite) as exc:
        nodefiles.restore(OPTS, plan)
    set_uid(0)
    line = refusal(exc)
    assert f"already done: wrote {MANIFEST}, removed /etc/kubernetes/scheduler-patcher/config-" in line
    assert line.endswith("not done: clearing the state record (run restore again once this is fixed)")
    assert Path(MANIFEST).read_text() == KUBEADM
    assert not [n for n in os.listdir("/etc/kubernetes/manifests") if n != "kube-scheduler.yaml"]


def test_restore_of_a_never_patched_node_with_a_read_only_state_folder_has_nothing_to_do(
        node: FakeFilesystem) -> None:
    """No marker, no record, no files of ours: nothing to write and nothing to clear. Before the review the
    restore refused ("folder is not writable"), so a SIGTERM during the fault exited 1."""
    plan = nodefiles.plan_restore(OPTS)
    read_only_state_folder()
    assert nodefiles.restore(OPTS, plan) == []
    set_uid(0)
    assert Path(MANIFEST).read_text() == KUBEADM


def test_restore_without_a_manifest_write_still_refuses_a_read_only_state_folder_up_front(
        node: FakeFilesystem) -> None:
    """When the manifest carries nothing of ours but a record is there to clear, nothing is gained by going
    ahead: the refusal comes before any file is touched."""
    nodefiles.apply(OPTS, nodefiles.plan_apply(OPTS))
    Path(MANIFEST).write_text(KUBEADM)  # someone put the original back; our config file and record remain
    plan = nodefiles.plan_restore(OPTS)
    read_only_state_folder()
    before = snapshot()
    with pytest.raises(PatcherError) as exc:
        nodefiles.restore(OPTS, plan)
    set_uid(0)
    assert refusal(exc) == "/var/lib/scheduler-patcher: folder is not writable; nothing was written"
    assert snapshot() == before


def state_folder_turns_read_only(point: str, path: Path) -> None:
    """A ``Hooked`` file operations' hook: right before the manifest's rename, the state folder turns read-only for the
    writer, who is no longer root."""
    if point == "before-rename" and str(path) == MANIFEST:
        for folder in ("/etc/kubernetes/manifests", "/etc/kubernetes/scheduler-patcher"):
            os.chmod(folder, 0o777)  # only the state folder fails for the unprivileged writer
        os.chmod("/var/lib/scheduler-patcher", 0o555)
        set_uid(1000)


def test_a_state_folder_that_fails_once_the_manifest_is_written_is_no_longer_needed(node: FakeFilesystem) -> None:
    """The record goes in before the manifest and nothing after the manifest writes in the state folder: a
    folder that turns read-only right then cannot leave a manifest write without its record (once,
    the record was saved a second time after the prune, and that save failed with the manifest already
    patched)."""
    stale = "/etc/kubernetes/scheduler-patcher/config-aaaaaaaaaaaa.yaml"  # ours, no longer needed: pruned after
    node.create_file(stale, contents="old")
    state_store(OPTS).save(State(written=("config-aaaaaaaaaaaa.yaml",)))
    plan = nodefiles.plan_apply(OPTS)

    lines, state = nodefiles.apply(OPTS, plan, ops=Hooked(state_folder_turns_read_only))
    set_uid(0)
    config = plan.config
    assert config is not None
    assert lines == [f"wrote /etc/kubernetes/scheduler-patcher/{config.main}", f"wrote {MANIFEST}", f"removed {stale}"]
    on_disk = state_store(OPTS).load()
    assert on_disk.patched_sha256 == nodefiles.sha256(Path(MANIFEST).read_bytes())  # the write is recorded
    assert state.written == (config.main,)  # the returned record no longer lists the pruned file


def test_restore_that_put_the_manifest_back_but_could_not_clear_state_says_exactly_that(
        node: FakeFilesystem) -> None:
    nodefiles.apply(OPTS, nodefiles.plan_apply(OPTS))
    plan = nodefiles.plan_restore(OPTS)

    with pytest.raises(nodefiles.PartialWrite) as exc:
        nodefiles.restore(OPTS, plan, ops=Hooked(state_folder_turns_read_only))
    set_uid(0)
    line = refusal(exc)
    assert f"already done: wrote {MANIFEST}, removed /etc/kubernetes/scheduler-patcher/config-" in line
    assert line.endswith("not done: clearing the state record (run restore again once this is fixed)")
    assert Path(MANIFEST).read_text() == KUBEADM


# -- item 9: the smaller ones ----------------------------------------------------------------------------------


def test_a_tab_inside_a_manifest_key_is_patched_or_refused_in_one_line(node: FakeFilesystem) -> None:
    """libyaml (the data loader, and the composer for nearly all text) reads ``lab\tels`` as a key; the
    pure-Python composer, used for text with a BOM, refuses it. Either way: a patch that round-trips, or one
    line."""
    tabbed = KUBEADM.replace("  labels:", "  lab\tels:")
    Path(MANIFEST).write_text(tabbed)
    nodefiles.apply(OPTS, nodefiles.plan_apply(OPTS))
    nodefiles.restore(OPTS, nodefiles.plan_restore(OPTS))
    assert Path(MANIFEST).read_text() == tabbed
    Path(MANIFEST).write_text("\ufeff" + tabbed)
    with pytest.raises(ManifestError) as exc:  # a YamlTextError traceback before
        nodefiles.plan_apply(OPTS)
    assert refusal(exc).startswith(f"{MANIFEST}: cannot patch: invalid YAML at line 5, column 6: found character")


def test_apply_and_restore_clean_temp_files_a_killed_writer_left(node: FakeFilesystem) -> None:
    stale = ["/etc/kubernetes/manifests/.kube-scheduler.yaml.k1ll3d.tmp",
             "/var/lib/scheduler-patcher/.state.json.x.tmp"]
    for path in stale:
        node.create_file(path, contents="half")
    lines = nodefiles.apply(OPTS, nodefiles.plan_apply(OPTS))[0]
    assert [f"removed {p} (left by a writer that was killed mid-write)" for p in stale] == lines[:2]
    assert not any(os.path.exists(p) for p in stale)
    node.create_file(stale[0], contents="half")
    lines = nodefiles.restore(OPTS, nodefiles.plan_restore(OPTS))
    assert lines[0] == f"removed {stale[0]} (left by a writer that was killed mid-write)"
    assert os.listdir("/etc/kubernetes/manifests") == ["kube-scheduler.yaml"]


def test_temp_files_of_a_live_writer_are_left_alone(tmp_path: Path) -> None:
    folder = tmp_path / "etc/kubernetes/manifests"
    folder.mkdir(parents=True)
    (folder / "kube-scheduler.yaml").write_text(KUBEADM)
    live = folder / ".kube-scheduler.yaml.l1ve.tmp"
    live.write_text("being written")
    opts = Files(source=tmp_path / "src", host_root=tmp_path, lock_wait=0.0)
    import threading

    got: list[list[str]] = []
    with writer_lock(opts):  # another writer (here: another thread) is mid-write
        t = threading.Thread(target=lambda: got.append(remove_stale_temp_files(opts)))
        t.start()
        t.join(30)
    assert got == [[]] and live.exists()
    assert remove_stale_temp_files(opts) == ["/etc/kubernetes/manifests/.kube-scheduler.yaml.l1ve.tmp"]


def test_a_second_scheduler_manifest_in_the_folder_is_reported(node: FakeFilesystem) -> None:
    node.create_file("/etc/kubernetes/manifests/kube-scheduler.yaml.bak", contents=KUBEADM)
    node.create_file("/etc/kubernetes/manifests/etcd.yaml", contents="kind: Pod\nmetadata: {name: etcd}\n")
    node.create_file("/etc/kubernetes/manifests/.hidden.yaml", contents=KUBEADM)  # the kubelet skips dot files
    plan = nodefiles.plan_apply(OPTS)
    others = [n for n in plan.notes if "another kube-scheduler" in n]
    assert others == ["/etc/kubernetes/manifests/kube-scheduler.yaml.bak is another kube-scheduler static pod in "
                      "/etc/kubernetes/manifests; the kubelet runs it too, unpatched"]
    assert nodefiles.status(OPTS)["other_schedulers"] == ["/etc/kubernetes/manifests/kube-scheduler.yaml.bak"]


def test_the_agent_start_does_not_block_on_a_fifo_manifest(tmp_path: Path) -> None:
    """runner.static_pod_identity read the manifest with a plain open(): the agent hung before its loop."""
    from patcher.services import runner

    folder = tmp_path / "etc/kubernetes/manifests"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "kube-scheduler.yaml")
    opts = Files(source=tmp_path / "src", host_root=tmp_path)
    assert runner.static_pod_identity(opts) == ("kube-scheduler", "kube-system")
