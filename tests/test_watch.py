"""Folder watching on a real file system: debounce, ConfigMap symlink swaps, our own writes."""

from __future__ import annotations

import os
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from patcher import fsio
from patcher.watch import FolderWatcher, file_fingerprint, folder_fingerprint
from tests.conftest import write_configmap


@pytest.fixture
def seen() -> queue.Queue[str]:
    return queue.Queue()


@pytest.fixture
def watcher(seen: queue.Queue[str]) -> Iterator[FolderWatcher]:
    w = FolderWatcher(seen.put, debounce=0.1)
    yield w
    w.stop()


def quiet(seen: queue.Queue[str], seconds: float = 0.5) -> bool:
    try:
        seen.get(timeout=seconds)
    except queue.Empty:
        return True
    return False


def test_configmap_symlink_swap_is_seen(tmp_path: Path, watcher: FolderWatcher, seen: queue.Queue[str]) -> None:
    write_configmap(tmp_path, {"extenders.yaml": "a: 1\n"})
    watcher.add("source", tmp_path, lambda: folder_fingerprint(tmp_path))
    watcher.start()
    write_configmap(tmp_path, {"extenders.yaml": "a: 2\n"})
    assert seen.get(timeout=3) == "source"
    assert quiet(seen)


def test_same_content_is_not_a_change(tmp_path: Path, watcher: FolderWatcher, seen: queue.Queue[str]) -> None:
    f = tmp_path / "kube-scheduler.yaml"
    f.write_text("x")
    watcher.add("manifest", tmp_path, lambda: file_fingerprint(f))
    watcher.start()
    os.utime(f)
    fsio.atomic_write(f, b"x")
    (tmp_path / ".hidden").write_text("ignored")
    assert quiet(seen)


def test_our_own_write_is_ignored_and_a_foreign_one_is_not(tmp_path: Path, watcher: FolderWatcher,
                                                            seen: queue.Queue[str]) -> None:
    f = tmp_path / "kube-scheduler.yaml"
    f.write_text("x")
    watcher.add("manifest", tmp_path, lambda: file_fingerprint(f))
    watcher.start()
    fsio.atomic_write(f, b"ours")
    watcher.expect("manifest")
    assert quiet(seen)
    t0 = time.monotonic()
    fsio.atomic_write(f, b"theirs")
    assert seen.get(timeout=3) == "manifest"
    assert time.monotonic() - t0 < 1.0  # re-applied within a second needs the event within a second


def test_bursts_are_debounced_into_one_notification(tmp_path: Path, watcher: FolderWatcher,
                                                    seen: queue.Queue[str]) -> None:
    f = tmp_path / "kube-scheduler.yaml"
    f.write_text("0")
    watcher.add("manifest", tmp_path, lambda: file_fingerprint(f))
    watcher.start()
    for i in range(10):
        f.write_text(str(i + 1))
    assert seen.get(timeout=3) == "manifest"
    assert quiet(seen)


def test_missing_folder_is_an_error(tmp_path: Path, watcher: FolderWatcher) -> None:
    from patcher.errors import PatcherError

    with pytest.raises(PatcherError, match="does not exist"):
        watcher.add("source", tmp_path / "nope", lambda: "")


# -- a replaced folder is watched again (issue 13 item 6) --------------------------------------------------


class Looks:
    """Records what each notification saw, so a test can wait for one particular content to be noticed."""

    def __init__(self, read: Callable[[], str]) -> None:
        self.read = read
        self.seen: list[str] = []
        self._cond = threading.Condition()

    def __call__(self, name: str) -> None:
        with self._cond:
            self.seen.append(self.read())
            self._cond.notify_all()

    def wait_for(self, content: str, timeout: float = 10.0) -> bool:
        """Wait (generously: a busy machine is slow, never wrong) until a notification saw ``content``."""
        with self._cond:
            return self._cond.wait_for(lambda: content in self.seen, timeout)


def read_or_missing(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return "<missing>"


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[Path, Looks, FolderWatcher]]:
    folder = tmp_path / "etc/kubernetes/manifests"
    folder.mkdir(parents=True)
    manifest = folder / "kube-scheduler.yaml"
    manifest.write_text("v1")
    looks = Looks(lambda: read_or_missing(manifest))
    w = FolderWatcher(looks)
    w.add("manifest", folder, lambda: file_fingerprint(manifest))
    w.start()
    yield folder, looks, w
    w.stop()


def test_deleted_and_recreated_folder_is_watched_again(tree: tuple[Path, Looks, FolderWatcher]) -> None:
    folder, looks, w = tree
    shutil.rmtree(folder)
    assert looks.wait_for("<missing>")
    folder.mkdir()
    fsio.atomic_write(folder / "kube-scheduler.yaml", b"v2")
    assert looks.wait_for("v2")
    fsio.atomic_write(folder / "kube-scheduler.yaml", b"v3")  # later kubeadm rewrites too
    assert looks.wait_for("v3")
    assert w.watched_folders() == [str(folder)] and w.rearms >= 1


def test_folder_renamed_away_and_replaced_is_watched_again(tree: tuple[Path, Looks, FolderWatcher]) -> None:
    folder, looks, _ = tree
    folder.rename(folder.with_name("manifests.old"))
    folder.mkdir()
    (folder / "kube-scheduler.yaml").write_text("v2")
    assert looks.wait_for("v2")
    (folder.with_name("manifests.old") / "kube-scheduler.yaml").write_text("old inode")  # not ours any more
    fsio.atomic_write(folder / "kube-scheduler.yaml", b"v3")
    assert looks.wait_for("v3")
    assert "old inode" not in looks.seen


def test_replaced_parent_is_watched_again(tree: tuple[Path, Looks, FolderWatcher]) -> None:
    folder, looks, _ = tree
    parent = folder.parent
    parent.rename(parent.with_name("kubernetes.old"))
    folder.mkdir(parents=True)
    fsio.atomic_write(folder / "kube-scheduler.yaml", b"v2")
    assert looks.wait_for("v2")
    fsio.atomic_write(folder / "kube-scheduler.yaml", b"v3")
    assert looks.wait_for("v3")


def test_folder_missing_with_its_parents_then_created_again(tree: tuple[Path, Looks, FolderWatcher]) -> None:
    folder, looks, w = tree
    shutil.rmtree(folder.parent.parent)  # .../etc
    assert looks.wait_for("<missing>")
    assert w.watched_folders() == []
    folder.mkdir(parents=True)
    fsio.atomic_write(folder / "kube-scheduler.yaml", b"back")
    assert looks.wait_for("back")
    assert w.watched_folders() == [str(folder)]


def test_replaced_configmap_mount_is_watched_again(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    write_configmap(source, {"extenders.yaml": "a: 1\n"})
    looks = Looks(lambda: read_or_missing(source / "extenders.yaml"))
    w = FolderWatcher(looks)
    try:
        w.add("source", source, lambda: folder_fingerprint(source))
        w.start()
        shutil.rmtree(source)
        source.mkdir()
        write_configmap(source, {"extenders.yaml": "a: 2\n"})
        assert looks.wait_for("a: 2\n")
        write_configmap(source, {"extenders.yaml": "a: 3\n"})
        assert looks.wait_for("a: 3\n")
    finally:
        w.stop()
