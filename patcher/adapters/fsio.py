"""File I/O on the node: paths under a host root, atomic writes, symlinked manifests.

The kubelet runs every non-hidden file in its manifest folder as a pod and may read the manifest at any
moment, so a write is a dot-named temp file in the same folder, fsync, ``os.replace``, fsync of the folder,
with the old mode and owner kept. Paths given to the agent are node paths; under ``--host-root`` they are
read and written below that root, while the paths written into the manifest stay node paths.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import os
import posixpath
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from patcher.core import fileread
from patcher.core.errors import PatcherError

MAX_LINK_HOPS = 40
LOCK_NAME = ".lock"

class FileOps:
    """The steps of a write where the kernel can refuse it or another writer can come in, as methods: these are
    the real ones, and every writer takes them as an argument (``REAL`` by default). A caller hands a subclass
    to meet a refusal the kernel will not give it (a read-only or full folder, for a test running as root) or
    another writer at one exact step, instead of leaving either to privileges or timing."""

    def create_temp(self, path: Path) -> tuple[int, str]:
        """A new dot-named temp file beside ``path``: its open descriptor and its path."""
        return tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)

    def before_rename(self, path: Path) -> None:
        """The last moment before a checked write (``expect``) puts its file at ``path``: another writer that
        comes now is caught by the check. Nothing to do here."""

    def sleep(self, seconds: float) -> None:
        """Wait for a writer lock that another writer holds."""
        time.sleep(seconds)


REAL = FileOps()


@dataclass(frozen=True)
class HostFS:
    root: Path

    def local(self, node_path: str) -> Path:
        """Where a node path lives for this process (below the host root)."""
        norm = posixpath.normpath("/" + node_path.lstrip("/"))
        return self.root / norm.lstrip("/") if norm != "/" else self.root

    def resolve(self, node_path: str) -> str:
        """Follow a symlinked file inside the node's namespace: absolute targets are node paths too."""
        path = posixpath.normpath(node_path)
        for _ in range(MAX_LINK_HOPS):
            local = self.local(path)
            if not local.is_symlink():
                return path
            target = os.readlink(local)
            path = posixpath.normpath(target if target.startswith("/") else
                                      posixpath.join(posixpath.dirname(path), target))
        raise PatcherError(node_path, "too many levels of symbolic links")


def decode_utf8(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PatcherError(name, f"not UTF-8 (byte {exc.start})") from None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ChangedUnderneath(PatcherError):
    """The file is no longer what the caller planned from: someone else wrote it in between."""


def atomic_write(path: Path, data: bytes, *, mode: int | None = None, shown: str | None = None,
                 expect: bytes | None = None, ops: FileOps = REAL) -> None:
    """Replace ``path`` with ``data`` atomically; an existing file's mode, uid and gid are kept.

    ``expect``: the content the caller planned from. The new file is swapped in with RENAME_EXCHANGE and
    the displaced one compared with it, so a write by someone else in the meantime (a ``kubeadm upgrade``) is
    put back instead of lost (where the exchange is not available: compared right before the rename).
    """
    write_in_order([Write(path, data, shown or str(path), mode, expect)], ops=ops)


def _written_temp(w: Write, ops: FileOps) -> tuple[int, str]:
    """A dot-named temp file beside ``w.path`` holding its data (not yet fsynced), with the mode and owner of the
    file it replaces (``w.mode`` for a new file): its open descriptor and its path. Failures are raised as
    ``w.error``, naming the folder (or the file) as ``w.shown`` shows it."""
    shown_folder = posixpath.dirname(w.shown) or str(w.path.parent)
    try:
        old = w.path.stat()
        keep_mode, uid, gid = stat.S_IMODE(old.st_mode), old.st_uid, old.st_gid
    except FileNotFoundError:
        keep_mode, uid, gid = (w.mode if w.mode is not None else 0o644), -1, -1
    try:
        fd, tmp = ops.create_temp(w.path)
    except FileNotFoundError:
        raise w.error(shown_folder, "folder does not exist") from None
    except OSError as exc:
        raise w.error(shown_folder, f"cannot write in this folder: {exc.strerror}") from None
    try:
        view = memoryview(w.data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, keep_mode)
        if uid != -1 and (uid, gid) != (os.getuid(), os.getgid()):
            with contextlib.suppress(PermissionError):
                os.fchown(fd, uid, gid)
        if w.mtime_ns is not None:  # the caller records it before the rename
            os.utime(fd, ns=(w.mtime_ns, w.mtime_ns))
    except OSError as exc:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise w.error(w.shown, f"write failed: {exc.strerror or exc}") from None
    return fd, tmp


@dataclass(frozen=True)
class Write:
    """One file of ``write_in_order``: ``atomic_write(path, data, mode=, shown=, expect=)``, and ``mtime_ns``: the
    modification time the new file gets, known to the caller before the rename."""

    path: Path
    data: bytes
    shown: str
    mode: int | None = None
    expect: bytes | None = None
    mtime_ns: int | None = None
    error: type[PatcherError] = PatcherError  # what a failure of this file is raised as


def write_in_order(*groups: list[Write], ops: FileOps = REAL) -> None:
    """Atomic writes of several files, published group after group: every group's files are renamed in place
    and their folders fsynced before the next group's first rename, as that many ``atomic_write`` calls in
    that order would. Every file's content is written and fsynced before the first rename: a failure to
    write or fsync any of them (a read-only or full folder) changes nothing; a failure of a rename leaves the
    groups before it written, the rest not. Errors are raised as the failing ``Write``'s ``error`` type."""
    writes = [w for group in groups for w in group]
    temps: list[str] = []
    fds: list[int] = []
    try:
        for w in writes:
            fd, tmp = _written_temp(w, ops)
            fds.append(fd)
            temps.append(tmp)
        for w, fd in zip(writes, fds, strict=True):
            try:  # a full disk can answer the fsync, not the write, with ENOSPC
                os.fsync(fd)
            except OSError as exc:
                raise w.error(w.shown, f"write failed: {exc.strerror or exc}") from None
    except PatcherError:
        for tmp in temps:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    finally:
        for fd in fds:
            os.close(fd)
    try:
        for group in groups:
            folders: dict[str, tuple[str, Path]] = {}
            displaced = []
            for w in group:
                displaced.append(_publish(temps.pop(0), w, ops))
                folders.setdefault(str(w.path.parent), (posixpath.dirname(w.shown) or str(w.path.parent),
                                                        w.path.parent))
            for shown, folder in folders.values():
                try:
                    _fsync_dir(folder)
                except OSError as exc:  # renamed, not known durable: the folder's failure, as its file's type
                    raise group[0].error(shown, f"cannot sync the folder: {exc.strerror or exc}") from None
            for old in displaced:
                if old is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(old)
    finally:
        for tmp in temps:  # those of the groups not published
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _publish(tmp: str, w: Write, ops: FileOps) -> str | None:
    """Rename the durable temp file ``tmp`` over ``w.path`` (see ``atomic_write``); the caller fsyncs the folder,
    then removes the file this returns (the one an exchange displaced: a hidden temp file, left for the clean-up
    of a killed writer if we die in between)."""
    path, expect, name = w.path, w.expect, w.shown
    try:
        if expect is not None and _renameat2() is not None:
            ops.before_rename(path)
            if _exchange(tmp, path):  # swap, then compare what we displaced: no window at all
                try:
                    _settle_exchange(tmp, path, w.data, expect, name)
                finally:
                    _show_kubelet(path)
                return tmp
        if expect is not None and not fileread.holds(path, expect, name, refuse=True):  # no exchange: check, rename
            raise ChangedUnderneath(name, "changed by someone else since it was read; not overwriting it")
        if expect is not None and _renameat2() is None:
            ops.before_rename(path)  # the window this fallback leaves open
        os.replace(tmp, path)
    except PatcherError:  # changed underneath, or not a regular file any more
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise w.error(name, f"write failed: {exc.strerror or exc}") from None
    return None


def _settle_exchange(tmp: str, path: Path, data: bytes, expect: bytes, name: str) -> None:
    """After swapping our file in: the displaced one is what we overwrote; if it is not what we planned
    from, someone wrote in between, and their file goes back (nothing of theirs is ever lost)."""
    if fileread.holds(tmp, expect, refuse=True):
        return  # the caller removes it, once the folder is synced (the rename is what must be durable first)
    if not _exchange(tmp, path) or not fileread.holds(tmp, data, refuse=True):
        # The swap back failed (theirs is at tmp), or a third write replaced ours between the two swaps (it
        # is the newest): either way the file at tmp is theirs and goes in place.
        os.replace(tmp, path)
    raise ChangedUnderneath(name, "changed by someone else since it was read; not overwriting it")


def _show_kubelet(path: Path) -> None:
    """An attribute change on ``path`` (its own mode again): the kubelet's manifest watch (fsnotify) reads the
    second half of an exchange, the file's name moved away, as the file's removal: it stops the static pod and
    sees the new one only at its next look at the folder (every 20 s by default). An attribute change after it
    reads as a modification: the kubelet takes the new pod at once (tests/fixtures/kubelet/)."""
    with contextlib.suppress(OSError):
        os.chmod(path, stat.S_IMODE(os.stat(path).st_mode))


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


@functools.cache
def _renameat2() -> Callable[..., int] | None:
    try:
        fn: Callable[..., int] = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    return fn


def _exchange(a: str | Path, b: str | Path) -> bool:
    """Swap two paths atomically (``renameat2(RENAME_EXCHANGE)``); False where the kernel, libc or file
    system cannot (the caller falls back to check-then-rename)."""
    fn = _renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(str(a)), _AT_FDCWD, os.fsencode(str(b)), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOENT, errno.EOPNOTSUPP, errno.EXDEV):
        return False  # ENOENT: the target is gone (the fallback check reports it), or a fake file system
    raise OSError(err, os.strerror(err), str(b))


def remove_stale_temp_files(folder: Path, name: str) -> list[Path]:
    """Remove ``.<name>.*.tmp`` left by a writer that was killed between create and rename (ours only)."""
    removed: list[Path] = []
    try:
        candidates = list(folder.glob(f".{name}.*.tmp"))
    except OSError:
        return removed
    for path in candidates:
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(path)
    return removed


def remove(path: Path) -> bool:
    """Remove a file we own; True when something was removed."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise PatcherError(str(path), f"cannot remove: {exc.strerror}") from None
    try:
        _fsync_dir(path.parent)
    except OSError as exc:
        raise PatcherError(str(path.parent), f"cannot sync the folder: {exc.strerror or exc}") from None
    return True


def ensure_dir(path: Path, mode: int = 0o755) -> None:
    try:
        path.mkdir(mode=mode, parents=True, exist_ok=True)
    except OSError as exc:
        raise PatcherError(str(path), f"cannot create folder: {exc.strerror}") from None


def mtime_ns(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None


class LockBusy(PatcherError):
    """Another writer (the agent, or another CLI run) holds the node's writer lock."""


# Locks this process holds: folder -> holding thread. Reentrant for the holding thread, so an agent that holds
# the lock for its whole life still calls apply/restore; other threads wait like other processes do (each
# acquisition opens its own file description, and flock locks are per description).
_held: dict[str, int] = {}
_held_guard = threading.Lock()


@contextlib.contextmanager
def writer_lock(folder: Path, shown: str, *, wait: float = 10.0,
                sleep: Callable[[float], None] = REAL.sleep) -> Iterator[None]:
    """One writer at a time on the node: ``flock`` on ``<state folder>/.lock``, holder pid written in it.

    Waits up to ``wait`` seconds, then refuses in one line naming the holder.
    """
    key = os.path.abspath(folder)
    me = threading.get_ident()
    with _held_guard:
        reentered = _held.get(key) == me
    if reentered:  # the outer hold releases it
        yield
        return
    fd = _open_lock(folder, shown)
    try:
        _flock(fd, folder, shown, wait, sleep)
    except BaseException:
        os.close(fd)
        raise
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    with _held_guard:
        _held[key] = me
    try:
        yield
    finally:
        with _held_guard:
            del _held[key]
        os.close(fd)  # closing the last descriptor releases the flock


def _open_lock(folder: Path, shown: str) -> int:
    path = folder / LOCK_NAME
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        # O_NONBLOCK: a FIFO put in its place must not block the open (flock ignores the flag)
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        try:  # a read-only state folder with a lock file in it: locking still works
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            raise PatcherError(shown, f"folder is not writable (cannot create the writer lock {LOCK_NAME}: "
                               f"{exc.strerror})") from None


def _flock(fd: int, folder: Path, shown: str, wait: float, sleep: Callable[[float], None]) -> None:
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        left = deadline - time.monotonic()
        if left <= 0:
            try:
                os.lseek(fd, 0, os.SEEK_SET)
                holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
            except OSError:
                holder = "unknown"
            raise LockBusy(posixpath.join(shown, LOCK_NAME), f"another scheduler-patcher writer holds the lock "
                           f"(pid {holder}); gave up after {wait:g} s")
        sleep(min(0.05, left))
