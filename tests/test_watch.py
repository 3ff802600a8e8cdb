"""Folder watching on a real file system: debounce, ConfigMap symlink swaps, our own writes."""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Iterator
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
