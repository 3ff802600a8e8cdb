"""The one way this project reads a file: bounded, non-blocking, checked with ``fstat`` before a byte is read.

Every file the agent or the CLI reads, and every fingerprint and comparison made of one, goes through here
(``tests/unit/test_architecture.py`` fails on any other ``open``/``read_bytes``/``read_text`` in ``patcher/``): a
second, quicker read beside it is all it takes for a FIFO in a folder to hang the agent, or for a huge file to cost
its size in memory. ``O_NONBLOCK``: opening a FIFO must not wait for a writer; ``fstat`` of what was opened:
anything but a regular file, or one over the caller's ``limit``, is refused in one line; at most ``limit + 1``
bytes are read, whatever the file grows to meanwhile. In core, as the source folder's reader is.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from patcher.core.errors import PatcherError


class TooLarge(PatcherError):
    """The file is over the caller's limit (a refusal like any other; ``holds`` reads it as "different").
    ``size``: what ``fstat`` said, when that is how it was known (None: it grew past the limit while read)."""

    def __init__(self, path: str | None, problem: str, size: int | None = None) -> None:
        super().__init__(path, problem)
        self.size = size


def kind(mode: int) -> str:
    """What a non-regular file is, in the words of a refusal."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _open(path: Path | str, what: str, name: str, error: type[PatcherError]) -> int:
    try:  # O_NONBLOCK: opening a FIFO for reading must not wait for a writer that may never come
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise error(name, f"{what} not found") from None
    except PermissionError:
        raise error(name, f"{what} is not readable (permission denied)") from None
    except OSError as exc:
        raise error(name, f"cannot read {what}: {exc.strerror}") from None


def _read_open(fd: int, what: str, name: str, limit: int, error: type[PatcherError]) -> bytes:
    """The bytes of an open file, when its ``fstat`` shows a regular file within ``limit``: at most ``limit`` (more:
    ``TooLarge``); anything else refused as ``error``."""
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        raise error(name, f"{what} is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise error(name, f"{what} is not a regular file ({kind(st.st_mode)}); refusing to read it")
    if st.st_size > limit:
        raise TooLarge(name, f"{what} is {st.st_size} bytes, over the limit of {limit} bytes", st.st_size)
    chunks: list[bytes] = []
    size = 0
    while size <= limit and (chunk := os.read(fd, min(limit + 1 - size, max(st.st_size + 1 - size, 65536)))):
        chunks.append(chunk)
        size += len(chunk)
    if size > limit:  # grew after the fstat
        raise TooLarge(name, f"{what} is over the limit of {limit} bytes")
    return b"".join(chunks)


def read_file(path: Path | str, what: str, shown: str | None = None, *, limit: int,
              error: type[PatcherError] = PatcherError) -> bytes:
    """A regular file's bytes (symlinks followed), at most ``limit``; anything else refused in one line (as
    ``error``; over ``limit``: ``TooLarge``)."""
    name = shown or str(path)
    fd = _open(path, what, name, error)
    try:
        return _read_open(fd, what, name, limit, error)
    except OSError as exc:
        raise error(name, f"cannot read {what}: {exc.strerror}") from None
    finally:
        os.close(fd)


def read_if_exists(path: Path | str, what: str, shown: str | None = None, *, limit: int) -> bytes | None:
    """``read_file``, with None for a file that does not exist (a dangling symlink included)."""
    try:
        return read_file(path, what, shown, limit=limit)
    except PatcherError:
        if not os.path.exists(path):
            return None
        raise


def holds(path: Path | str, data: bytes | None, shown: str | None = None, *, refuse: bool = False) -> bool:
    """Whether the file holds exactly ``data`` (None: that there is no file): the one answer to "does this file
    hold these bytes", for a re-check before a write as for a check after one. Reads at most ``len(data) + 1``
    bytes: a larger file differs without being read. A file that cannot be read (a FIFO in its place, no
    permission) does not hold it; with ``refuse`` it is refused instead, in one line naming it as ``shown``
    (a re-check must not take a FIFO for a changed file and go on)."""
    try:
        return read_if_exists(path, "file", shown, limit=len(data) if data is not None else 0) == data
    except PatcherError as exc:
        if refuse and not isinstance(exc, TooLarge):
            raise
        return False


def fingerprint(path: Path | str, *, limit: int) -> str:
    """Content hash of one file (symlinks followed), read as ``read_file`` reads it. A file it would refuse is
    not read: the refusal is the fingerprint (a FIFO; "is N bytes, over the limit": the same on every node
    for the same file), and whoever acts on the change reads the file and refuses it in its own words.
    ``missing`` when it cannot be opened."""
    try:
        fd = _open(path, "file", str(path), PatcherError)
    except PatcherError:
        return "missing"
    try:
        return hashlib.sha256(_read_open(fd, "file", str(path), limit, PatcherError)).hexdigest()
    except PatcherError as exc:  # the refusal (too large included) is the fingerprint
        return f"refused: {exc.problem}"
    except OSError:
        return "missing"
    finally:
        os.close(fd)


def folder_fingerprint(folder: Path, *, limit: int) -> str:
    """Content hash of the visible files of a folder (ConfigMap style: names not starting with a dot), each
    file's as ``fingerprint`` gives it with ``limit``; folders in it are skipped."""
    h = hashlib.sha256()
    try:
        names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    except OSError:
        return "missing"
    for name in names:
        path = folder / name
        if path.is_dir():
            continue
        h.update(name.encode() + b"\0" + fingerprint(path, limit=limit).encode() + b"\n")
    return h.hexdigest()
