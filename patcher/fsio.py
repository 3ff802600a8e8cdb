"""File I/O on the node: paths under a host root, atomic writes, symlinked manifests.

The kubelet runs every non-hidden file in its manifest folder as a pod and may read the manifest at any
moment, so a write is a dot-named temp file in the same folder, fsync, ``os.replace``, fsync of the folder,
with the old mode and owner kept. Paths given to the agent are node paths; under ``--host-root`` they are
read and written below that root, while the paths written into the manifest stay node paths.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from patcher.errors import PatcherError

MAX_LINK_HOPS = 40


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


def read_bytes(path: Path, what: str, shown: str | None = None) -> bytes:
    name = shown or str(path)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise PatcherError(name, f"{what} not found") from None
    except IsADirectoryError:
        raise PatcherError(name, f"{what} is a directory") from None
    except PermissionError:
        raise PatcherError(name, f"{what} is not readable (permission denied)") from None
    except OSError as exc:
        raise PatcherError(name, f"cannot read {what}: {exc.strerror}") from None


def decode_utf8(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PatcherError(name, f"not UTF-8 (byte {exc.start})") from None


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ChangedUnderneath(PatcherError):
    """The file is no longer what the caller planned from: someone else wrote it in between."""


def atomic_write(path: Path, data: bytes, *, mode: int | None = None, shown: str | None = None,
                 expect: bytes | None = None) -> None:
    """Replace ``path`` with ``data`` atomically; an existing file's mode, uid and gid are kept.

    ``expect``: the content the caller planned from. It is compared right before the rename, so a write
    by someone else in the meantime (a ``kubeadm upgrade``) is not overwritten with a stale base.
    """
    name = shown or str(path)
    folder = path.parent
    try:
        old = path.stat()
        keep_mode, uid, gid = stat.S_IMODE(old.st_mode), old.st_uid, old.st_gid
    except FileNotFoundError:
        keep_mode, uid, gid = (mode if mode is not None else 0o644), -1, -1
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except FileNotFoundError:
        raise PatcherError(str(folder), "folder does not exist") from None
    except OSError as exc:
        raise PatcherError(str(folder), f"cannot write in this folder: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), keep_mode)
            if uid != -1 and (uid, gid) != (os.getuid(), os.getgid()):
                with contextlib.suppress(PermissionError):
                    os.fchown(fh.fileno(), uid, gid)
            os.fsync(fh.fileno())
        if expect is not None and _current(path) != expect:
            raise ChangedUnderneath(name, "changed by someone else since it was read; not overwriting it")
        os.replace(tmp, path)
    except ChangedUnderneath:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise PatcherError(name, f"write failed: {exc.strerror or exc}") from None
    fsync_dir(folder)


def _current(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


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
    fsync_dir(path.parent)
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


def file_fingerprint(path: Path) -> str:
    """Content hash of one file (symlinks followed); ``missing`` when it cannot be read."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "missing"


def folder_fingerprint(folder: Path) -> str:
    """Content hash of the visible files of a folder (ConfigMap style: names not starting with a dot)."""
    h = hashlib.sha256()
    try:
        names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    except OSError:
        return "missing"
    for name in names:
        path = folder / name
        if path.is_dir():
            continue
        h.update(name.encode() + b"\0" + file_fingerprint(path).encode() + b"\n")
    return h.hexdigest()
