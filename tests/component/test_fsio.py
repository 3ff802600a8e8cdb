"""Atomic writes and symlink resolution on a real file system (tmp_path)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from patcher.adapters import fsio
from patcher.core.errors import PatcherError


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


def test_one_dir_sync_syncs_each_folder_once_on_leaving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real = fsio._fsync_dir_now

    def spy(path: Path) -> None:
        synced.append(path.name)
        real(path)

    monkeypatch.setattr(fsio, "_fsync_dir_now", spy)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    for name in ("x", "y"):
        (a / name).write_text(name)
    with fsio.one_dir_sync():
        assert fsio.remove(a / "x") and fsio.remove(a / "y")
        fsio.atomic_write(b / "z", b"z")
        with fsio.one_dir_sync():  # nested: the outer one syncs
            fsio.atomic_write(b / "w", b"w")
        assert synced == []  # not yet: nothing relied on them inside
    assert sorted(synced) == ["a", "b"]
    fsio.remove(b / "z")
    assert synced[-1] == "b"  # outside: at once, as before


def test_write_in_order_publishes_group_after_group_and_leaves_no_temp_file(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "sub" / "b", tmp_path / "c"
    b.parent.mkdir()
    c.write_bytes(b"old c")
    seen: list[tuple[bool, bool]] = []

    def at(point: str, path: Path) -> None:  # the rename of c (it has an expect): a and b are there already
        if point == "before-rename":
            seen.append((a.exists(), b.exists()))

    with fsio.pause_points(at):
        fsio.write_in_order([fsio.Write(a, b"a", "a", mode=0o600), fsio.Write(b, b"b", "b")],
                            [fsio.Write(c, b"c", "c", expect=b"old c")])
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


# -- swap_in: what it compares before its rename (one descriptor per file since issue 26) ---------------------


def _staged(tmp_path: Path) -> tuple[Path, Path]:
    path = tmp_path / "m.yaml"
    path.write_bytes(b"patched\n")
    return fsio.stage(path, b"original\n"), path


def test_swap_in_publishes_the_staged_file_and_leaves_what_it_displaced_at_its_name(tmp_path: Path) -> None:
    staged, path = _staged(tmp_path)
    fsio.swap_in(staged, path, data=b"original\n", expect=b"patched\n")
    assert path.read_bytes() == b"original\n"
    assert staged.read_bytes() == b"patched\n"  # the caller removes it


def _seen(staged: Path, path: Path) -> tuple[fsio.Identity, fsio.Identity]:
    ours, theirs = fsio.identity_holding(staged, b"original\n"), fsio.identity_holding(path, b"patched\n")
    assert ours is not None and theirs is not None
    return ours[0], theirs[0]


def test_swap_in_with_both_identities_as_seen_reads_neither_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26: one stat each answers the comparison before the rename; the exchange's own comparison of
    what it displaced still reads."""
    staged, path = _staged(tmp_path)
    seen = _seen(staged, path)
    monkeypatch.setattr(fsio, "_snapshot", lambda p: pytest.fail(f"read {p} before the rename"))
    fsio.swap_in(staged, path, data=b"original\n", expect=b"patched\n", seen=seen)
    assert path.read_bytes() == b"original\n" and staged.read_bytes() == b"patched\n"


def test_swap_in_reads_both_files_when_an_identity_differs_in_its_ctime_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a same-size write in place (same inode, same size, mtime moved or not) changes at least."""
    staged, path = _staged(tmp_path)
    ours, theirs = _seen(staged, path)
    read: list[Path] = []
    real = fsio._snapshot

    def counted(p: Path, limit: int) -> object:
        read.append(p)
        return real(p, limit)

    monkeypatch.setattr(fsio, "_snapshot", counted)
    fsio.swap_in(staged, path, data=b"original\n", expect=b"patched\n", seen=(ours, (*theirs[:4], theirs[4] - 1,
                                                                                     *theirs[5:])))
    assert read == [staged, path] and path.read_bytes() == b"original\n"


def test_identity_holding_answers_for_those_bytes_only_and_says_when_it_stands_for_them(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"patched\n")
    ctime = path.stat().st_ctime_ns
    young = fsio.identity_holding(path, b"patched\n", now_ns=lambda: ctime)
    old = fsio.identity_holding(path, b"patched\n", now_ns=lambda: ctime + fsio.SETTLED_NS + 1)
    assert young is not None and young[1] == pytest.approx(fsio.SETTLED_NS / 1e9)  # ask again then
    assert old is not None and old[1] < 0 and old[0] == young[0]
    assert fsio.identity_holding(path, b"patched!\n") is None  # other bytes
    assert fsio.identity_holding(path, b"patche\n") is None  # same size, other bytes
    assert fsio.identity_holding(tmp_path / "gone", b"patched\n") is None
    os.mkfifo(tmp_path / "fifo")
    assert fsio.identity_holding(tmp_path / "fifo", b"") is None
    os.chmod(path, 0o600)  # a chmod moves the ctime: the identity is another
    again = fsio.identity_holding(path, b"patched\n")
    assert again is not None and again[0] != old[0]


@pytest.mark.parametrize("seen", [False, True], ids=["read", "identities seen before the change"])
@pytest.mark.parametrize("what", ["staged changed", "manifest changed", "staged gone", "manifest gone",
                                  "manifest is a FIFO", "manifest is a folder", "staged mode differs"])
def test_swap_in_writes_nothing_unless_both_files_are_what_they_were(tmp_path: Path, what: str, seen: bool) -> None:
    staged, path = _staged(tmp_path)
    identities = _seen(staged, path) if seen else None
    if what == "staged changed":
        staged.write_bytes(b"not what was staged\n")
    elif what == "manifest changed":
        path.write_bytes(b"upgraded\n")
    elif what == "staged gone":
        staged.unlink()
    elif what == "manifest gone":
        path.unlink()
    elif what == "manifest is a FIFO":
        path.unlink()
        os.mkfifo(path)
    elif what == "manifest is a folder":
        path.unlink()
        path.mkdir()
    elif what == "staged mode differs":
        staged.chmod(0o600 if (path.stat().st_mode & 0o777) != 0o600 else 0o644)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(fsio.ChangedUnderneath):
        fsio.swap_in(staged, path, data=b"original\n", expect=b"patched\n", seen=identities)
    assert sorted(os.listdir(tmp_path)) == before
    if what in ("staged changed", "manifest changed", "staged mode differs"):
        assert path.read_bytes() in (b"patched\n", b"upgraded\n")


def test_holds_writer_lock_is_true_only_for_the_holding_thread_while_it_holds_it(tmp_path: Path) -> None:
    key = fsio.lock_key(tmp_path)
    assert not fsio.holds_writer_lock(key)
    with fsio.writer_lock(tmp_path, "state"):
        assert fsio.holds_writer_lock(key)
        other: list[bool] = []
        thread = threading.Thread(target=lambda: other.append(fsio.holds_writer_lock(key)))
        thread.start()
        thread.join()
        assert other == [False]
    assert not fsio.holds_writer_lock(key)
