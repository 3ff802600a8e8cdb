"""Atomic writes and symlink resolution on a real file system (tmp_path)."""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from patcher.adapters import fsio
from patcher.core.errors import PatcherError
from tests.harness.fileops import Hooked


def test_atomic_write_keeps_mode_and_owner_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "kube-scheduler.yaml"
    target.write_text("old")
    os.chmod(target, 0o600)
    if os.geteuid() == 0:
        os.chown(target, 1234, 2345)
    inode = target.stat().st_ino
    fsio.atomic_write(target, b"new")
    st = target.stat()
    assert target.read_bytes() == b"new"
    assert st.st_mode & 0o7777 == 0o600
    assert st.st_ino != inode  # replaced, not rewritten in place: a reader sees old or new, never half
    if os.geteuid() == 0:
        assert (st.st_uid, st.st_gid) == (1234, 2345)
    assert os.listdir(tmp_path) == ["kube-scheduler.yaml"]


def test_new_file_gets_the_requested_mode(tmp_path: Path) -> None:
    target = tmp_path / "config-0123456789ab.yaml"
    fsio.atomic_write(target, b"x", mode=0o644)
    assert target.stat().st_mode & 0o777 == 0o644


def test_failed_replace_leaves_the_old_file_and_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "kube-scheduler.yaml"
    target.write_text("old")
    seen: list[str] = []

    def failing_replace(src: str, dst: object) -> None:
        seen.append(os.path.basename(src))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(PatcherError, match="write failed: No space left on device"):
        fsio.atomic_write(target, b"new")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["kube-scheduler.yaml"]
    assert seen and seen[0].startswith(".kube-scheduler.yaml.")  # the kubelet ignores dot-files


def test_write_into_a_missing_folder_names_the_folder(tmp_path: Path) -> None:
    with pytest.raises(PatcherError, match="folder does not exist"):
        fsio.atomic_write(tmp_path / "nope" / "x", b"x")


def test_resolve_follows_absolute_links_inside_the_host_root(tmp_path: Path) -> None:
    fs = fsio.HostFS(tmp_path)
    real = tmp_path / "etc/kubernetes/real/ks.yaml"
    real.parent.mkdir(parents=True)
    real.write_text("x")
    manifests = tmp_path / "etc/kubernetes/manifests"
    manifests.mkdir()
    (manifests / "hop.yaml").symlink_to("/etc/kubernetes/real/ks.yaml")  # absolute: a node path
    (manifests / "kube-scheduler.yaml").symlink_to("hop.yaml")  # relative
    assert fs.resolve("/etc/kubernetes/manifests/kube-scheduler.yaml") == "/etc/kubernetes/real/ks.yaml"
    assert fs.local("/etc/../etc/kubernetes") == tmp_path / "etc/kubernetes"


def test_symlink_loop_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(PatcherError, match="too many levels"):
        fsio.HostFS(tmp_path).resolve("/a")


def test_write_in_order_publishes_group_after_group_and_leaves_no_temp_file(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "sub" / "b", tmp_path / "c"
    b.parent.mkdir()
    c.write_bytes(b"old c")
    seen: list[tuple[bool, bool]] = []

    def at(point: str, path: Path) -> None:  # the rename of c (it has an expect): a and b are there already
        if point == "before-rename":
            seen.append((a.exists(), b.exists()))

    fsio.write_in_order([fsio.Write(a, b"a", "a", mode=0o600), fsio.Write(b, b"b", "b")],
                        [fsio.Write(c, b"c", "c", expect=b"old c")], ops=Hooked(at))
    assert (a.read_bytes(), b.read_bytes(), c.read_bytes()) == (b"a", b"b", b"c")
    assert seen == [(True, True)] and a.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b", "c", "sub"]


def test_write_in_order_stops_at_the_first_failed_group(tmp_path: Path) -> None:
    a, c, d = tmp_path / "a", tmp_path / "c", tmp_path / "d"
    c.write_bytes(b"changed by someone else")
    with pytest.raises(fsio.ChangedUnderneath):
        fsio.write_in_order([fsio.Write(a, b"a", "a")], [fsio.Write(c, b"c", "c", expect=b"old c")],
                            [fsio.Write(d, b"d", "d")])
    assert a.read_bytes() == b"a" and c.read_bytes() == b"changed by someone else" and not d.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "c"]  # no temp file of c or d is left


#: inotify event bits, and how the kubelet's manifest watch (fsnotify, pkg/kubelet/config/file_linux.go) reads them:
#: Create (IN_CREATE, IN_MOVED_TO) adds the file's pod, Write and Chmod (IN_MODIFY, IN_ATTRIB) read it again,
#: Remove and Rename (IN_DELETE, IN_MOVED_FROM) remove it; dot names are skipped.
KUBELET_READS = {0x100: "add", 0x80: "add", 0x2: "add", 0x4: "add", 0x200: "remove", 0x40: "remove"}


def _inotify_events(folder: Path, act: Callable[[], None]) -> list[tuple[str, int]]:
    """(name, mask) of each event in ``folder`` while ``act`` runs, in the kernel's order."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK)
    assert fd >= 0
    try:
        assert libc.inotify_add_watch(fd, os.fsencode(folder), 0xFFF) >= 0
        act()
        data = os.read(fd, 65536)
    finally:
        os.close(fd)
    events, at = [], 0
    while at < len(data):
        _, mask, _, size = struct.unpack_from("iIII", data, at)
        name = data[at + 16:at + 16 + size].rstrip(b"\0").decode()
        events.append((name, mask))
        at += 16 + size
    return events


def test_a_manifest_swapped_in_is_read_by_the_kubelet_at_once(tmp_path: Path) -> None:
    """The real kubelet, recorded (tests/fixtures/kubelet/): after the agent's exchange it stopped kube-scheduler at
    once and ran the patched pod only at its next 20 s look at the folder, as the exchange's last event on the
    manifest's name is the old file moving away (a removal). The write now ends on an attribute change, which the
    kubelet reads as a modification: the file's pod stays."""
    if fsio._renameat2() is None:
        pytest.skip("no renameat2 here: a plain rename, one event")
    manifest = tmp_path / "kube-scheduler.yaml"
    manifest.write_bytes(b"old\n")
    events = _inotify_events(tmp_path, lambda: fsio.atomic_write(manifest, b"new\n", expect=b"old\n"))
    seen = [KUBELET_READS.get(mask & 0xFFF) for name, mask in events if name == manifest.name]
    assert "remove" in seen  # the exchange, as before
    assert [s for s in seen if s][-1] == "add", events
    assert manifest.read_bytes() == b"new\n"
