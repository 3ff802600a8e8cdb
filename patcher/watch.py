"""inotify on folders, turned into "this thing really changed" notifications.

Folders, not files, are watched: the kubelet's manifest is replaced by rename (a file watch would follow the
old inode), and a ConfigMap update is an atomic swap of the ``..data`` symlink that raises no event on the
visible file names. Every event in a folder schedules a look; the look compares a content fingerprint with
the last one seen, which also swallows our own writes: after writing, the agent tells the watcher what it
wrote (``expect``), and the resulting events find nothing new.

When to look is the latency/correctness trade: a ConfigMap swap is one rename and should be acted on at
once, while an editor may write in several steps. inotify says which steps are unfinished: a file that was
modified and not yet closed has a writer at work (``IN_MODIFY`` without ``IN_CLOSE_WRITE``). So a look waits
for every writer in the target's folders to close, then for a short quiet time (``debounce``) that covers a
writer's next syscall (rename after close, a second ``>>``), and never longer than ``max_wait`` for a writer
that keeps a file open. The timing core (``Settler``) is pure and takes the clock as an argument.

A watched folder can be deleted and recreated, renamed away, or have a parent replaced (a host-config
rebuild, a remounted ConfigMap volume). Each folder's ancestors are watched too, for their own deletion or
move only; while a folder is gone, its nearest existing ancestor is watched for the next path component to
appear. Any such event, or the loss of a folder's own watch, re-arms every watch from the paths and looks
at every target (a change made while unwatched is then seen by its fingerprint).

One thread blocks in ``poll`` with no timeout unless a look is due: an idle watcher never wakes up. The
inotify calls are a small ctypes adapter (Linux only, like the agent); no third-party library is needed.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import select
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from patcher.errors import PatcherError
from patcher.fsio import file_fingerprint, folder_fingerprint

__all__ = ["FolderWatcher", "Settler", "file_fingerprint", "folder_fingerprint"]

log = logging.getLogger(__name__)

# <sys/inotify.h>
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_MASK_ADD = 0x20000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000

_SELF = IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT | IN_IGNORED
#: A watched folder: every change of an entry, and writers opening/closing (no reads, no attribute changes).
CONTENT_MASK = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE \
    | IN_DELETE_SELF | IN_MOVE_SELF
#: An ancestor of a watched folder: only the ancestor itself going (so a busy /tmp or /etc costs nothing).
ANCESTOR_MASK = IN_DELETE_SELF | IN_MOVE_SELF
#: The nearest existing ancestor of a folder that is gone: also its next path component appearing.
CREATION_MASK = ANCESTOR_MASK | IN_CREATE | IN_MOVED_TO

_HEADER = struct.Struct("iIII")


@dataclass(frozen=True)
class RawEvent:
    wd: int
    mask: int
    name: str


def parse_events(buf: bytes) -> list[RawEvent]:
    """Split what ``read`` returned from an inotify descriptor into events (names lose their NUL padding)."""
    out: list[RawEvent] = []
    offset = 0
    while offset + _HEADER.size <= len(buf):
        wd, mask, _cookie, length = _HEADER.unpack_from(buf, offset)
        offset += _HEADER.size
        name = buf[offset:offset + length].split(b"\0", 1)[0].decode(errors="surrogateescape")
        offset += length
        out.append(RawEvent(wd, mask, name))
    return out


class Action(Enum):
    IGNORE = "ignore"
    CHANGE = "change"  # an entry changed: look at the target
    WRITING = "writing"  # a writer is at work on ``name``
    CLOSED = "closed"  # ``name``'s writer is done (or the file is gone)
    REARM = "rearm"  # the watched path itself changed: watch again from the paths


def classify(mask: int, name: str, *, ancestor_of: str | None) -> Action:
    """What one event means for a folder watch (``ancestor_of``: the next path component, when this watch
    is on an ancestor of the watched folder rather than on the folder itself)."""
    if mask & (_SELF | IN_Q_OVERFLOW):
        return Action.REARM
    if ancestor_of is not None:
        return Action.REARM if name == ancestor_of else Action.IGNORE
    if mask & (IN_CLOSE_WRITE | IN_DELETE | IN_MOVED_FROM):
        return Action.CLOSED
    if mask & IN_MODIFY:
        return Action.WRITING
    return Action.CHANGE


@dataclass
class _Pending:
    first: float  # when the first unsettled event came
    last: float  # when the latest one came


class Settler:
    """When to look at which target, from the events seen so far; pure (the clock is an argument).

    A target is due ``quiet`` seconds after its last event once no file in its folders has an open writer,
    and at the latest ``max_wait`` seconds after its first unsettled event (a writer that never closes).
    """

    def __init__(self, quiet: float, max_wait: float) -> None:
        self.quiet = quiet
        self.max_wait = max(quiet, max_wait)
        self._folders: dict[str, set[str]] = {}  # target -> its folders
        self._pending: dict[str, _Pending] = {}
        self._writers: dict[str, set[str]] = {}  # folder -> names with a writer at work

    def track(self, target: str, folder: str) -> None:
        self._folders.setdefault(target, set()).add(folder)

    def targets_of(self, folder: str) -> list[str]:
        return [t for t, folders in self._folders.items() if folder in folders]

    def event(self, folder: str, action: Action, name: str, now: float) -> None:
        """Record one classified event in ``folder`` (REARM: pass every folder, or call ``touch_all``)."""
        writers = self._writers.setdefault(folder, set())
        if action is Action.WRITING:
            writers.add(name)
        elif action is Action.CLOSED:
            writers.discard(name)
        elif action is Action.REARM:
            writers.clear()  # a new watch cannot see old writers close: do not wait for them
        if action is not Action.IGNORE:
            for target in self.targets_of(folder):
                self._touch(target, now)

    def writers(self) -> list[str]:
        return sorted(f"{folder}/{name}" for folder, names in self._writers.items() for name in names)

    def touch_all(self, now: float) -> None:
        self._writers.clear()
        for target in self._folders:
            self._touch(target, now)

    def _touch(self, target: str, now: float) -> None:
        pending = self._pending.get(target)
        if pending is None:
            self._pending[target] = _Pending(now, now)
        else:
            pending.last = now

    def _due_at(self, target: str, pending: _Pending) -> float:
        cap = pending.first + self.max_wait
        if any(self._writers.get(f) for f in self._folders.get(target, ())):
            return cap
        return min(cap, pending.last + self.quiet)

    def next_due(self) -> float | None:
        """The earliest time a look is due (``None``: nothing pending, sleep until the next event)."""
        return min((self._due_at(t, p) for t, p in self._pending.items()), default=None)

    def pop_due(self, now: float) -> list[str]:
        """The targets to look at now; they are settled until their next event."""
        due = [t for t, p in self._pending.items() if self._due_at(t, p) <= now]
        for target in due:
            del self._pending[target]
        return due


# -- the inotify adapter ------------------------------------------------------------------------------------


class _Inotify:
    """inotify_init1/add_watch/rm_watch through ctypes; ``fd`` is non-blocking, to be polled."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self.fd: int = fd

    def add(self, path: str, mask: int) -> int:
        wd = int(self._libc.inotify_add_watch(self.fd, os.fsencode(path), ctypes.c_uint32(mask)))
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
        return wd

    def rm(self, wd: int) -> None:
        self._libc.inotify_rm_watch(self.fd, wd)  # EINVAL for a watch the kernel already dropped: fine

    def read(self) -> list[RawEvent]:
        chunks = []
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return parse_events(b"".join(chunks))

    def close(self) -> None:
        os.close(self.fd)


def ancestors(folder: str) -> list[tuple[str, str]]:
    """``(ancestor, next component)`` pairs from the root down to the folder's parent."""
    parts = Path(os.path.abspath(folder)).parts
    return [(str(Path(*parts[:i])), parts[i]) for i in range(1, len(parts))]


@dataclass
class Target:
    name: str  # "source" or "manifest": what the callback receives
    fingerprint: Callable[[], str]
    last: str = ""
    folders: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Role:
    folder: str
    ancestor_of: str | None  # None: the folder itself


class FolderWatcher:
    """Calls ``on_change(name)`` once a watched target's fingerprint differs from the last one seen.

    ``debounce`` is the quiet time after the last event (writers with a file open are waited for on top,
    up to ``max_wait``). The callback runs on the watcher's thread: keep it short (queue the work).
    """

    def __init__(self, on_change: Callable[[str], None], debounce: float = 0.02, max_wait: float = 2.0) -> None:
        self.on_change = on_change
        self.debounce = debounce
        self.targets: dict[str, Target] = {}
        self._settler = Settler(debounce, max_wait)
        self._lock = threading.Lock()
        self._inotify: _Inotify | None = None
        self._roles: dict[int, list[_Role]] = {}
        self._wake_r = self._wake_w = -1
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.rearms = 0  # how many times the watches were set up again (tests and metrics)
        self.rounds = 0  # loop rounds done: events read, due looks taken (tests wait on it, never on time)
        self.events_read = 0  # inotify events read (what an idle node costs shows here)

    def add(self, name: str, folder: Path, fingerprint: Callable[[], str]) -> None:
        """Watch ``folder`` for ``name``; adding a name again watches one more folder for the same thing (a
        symlinked manifest changes in its target's folder)."""
        if not folder.is_dir():
            raise PatcherError(str(folder), "folder to watch does not exist")
        with self._lock:
            if self._inotify is None:
                try:
                    self._inotify = _Inotify()
                except OSError as exc:  # e.g. fs.inotify.max_user_instances reached
                    raise PatcherError(str(folder), f"cannot watch: {exc.strerror or exc}") from exc
            target = self.targets.get(name)
            if target is None:
                target = self.targets[name] = Target(name, fingerprint, last=fingerprint())
            path = os.path.abspath(folder)
            target.folders.append(path)
            self._settler.track(name, path)
            missing = self._arm_locked()
        if missing:
            raise PatcherError(str(folder), f"cannot watch: {missing}")

    def start(self) -> None:
        with self._lock:
            if self._thread is not None or self._stopping:
                return
            if self._inotify is None:  # nothing added (every add failed): nothing to watch
                return
            self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._thread = threading.Thread(target=self._run, name="folder-watch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            thread = self._thread
            if thread is not None:
                os.write(self._wake_w, b"x")
        if thread is not None:
            thread.join(timeout=2)
        with self._lock:
            if self._inotify is not None and (thread is None or not thread.is_alive()):
                self._inotify.close()
                self._inotify = None
                for fd in (self._wake_r, self._wake_w):
                    if fd >= 0:
                        os.close(fd)
                self._wake_r = self._wake_w = -1

    def expect(self, name: str) -> None:
        """We just wrote this target: take its current content as seen, so our own events stay quiet."""
        target = self.targets.get(name)
        if target is not None:
            with self._lock:
                target.last = target.fingerprint()

    def writers_at_work(self) -> list[str]:
        """Files seen modified and not yet closed, as ``folder/name`` (their target's look waits for them)."""
        with self._lock:
            return self._settler.writers()

    def watched_folders(self) -> list[str]:
        """The folders watched right now (not the ancestors): a folder that is gone is missing here."""
        with self._lock:
            return sorted({r.folder for roles in self._roles.values() for r in roles if r.ancestor_of is None})

    # -- internals --------------------------------------------------------------------------------------

    def _arm_locked(self) -> str:
        """(Re)create every watch from the paths; returns the first error for a folder that exists."""
        ino = self._inotify
        assert ino is not None
        for wd in self._roles:
            ino.rm(wd)
        self._roles = {}
        first_error = ""
        folders = sorted({f for t in self.targets.values() for f in t.folders})
        for folder in folders:
            if not self._arm_chain_locked(folder) and os.path.isdir(folder):
                first_error = first_error or f"inotify_add_watch failed for {folder}"
        return first_error

    def _arm_chain_locked(self, folder: str) -> bool:
        """Watch ``folder`` and its ancestors; when a path component is missing, watch the nearest existing
        ancestor for it to appear instead. True when the folder itself is watched."""
        chain: list[tuple[str, str | None]] = [*ancestors(folder), (folder, None)]
        i, retries = 0, 0
        while i < len(chain):
            path, child = chain[i]
            added = self._add_locked(path, CONTENT_MASK if child is None else ANCESTOR_MASK, _Role(folder, child))
            if added is True or (added is None and child is not None):
                i += 1  # an ancestor we may not watch (EACCES): only its replacement goes unseen
                continue
            if i == 0 or added is None:
                return False
            parent, name = chain[i - 1]
            self._add_locked(parent, CREATION_MASK, _Role(folder, name))
            if os.path.isdir(path) and retries < 3:
                retries += 1  # created between the failed add and the creation watch: try again
                continue
            return False
        return True

    def _add_locked(self, path: str, mask: int, role: _Role) -> bool | None:
        """True: watched; False: the path does not exist (or is no folder); None: another error."""
        assert self._inotify is not None
        try:
            wd = self._inotify.add(path, mask | IN_ONLYDIR | IN_MASK_ADD)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return False
            log.log(logging.WARNING if role.ancestor_of is None else logging.DEBUG,
                    "cannot watch %s: %s", path, exc.strerror)
            return None
        roles = self._roles.setdefault(wd, [])
        if role not in roles:
            roles.append(role)
        return True

    def _run(self) -> None:
        ino = self._inotify
        assert ino is not None
        poller = select.poll()
        poller.register(ino.fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            with self._lock:
                due = self._settler.next_due()
            timeout = None if due is None else max(0, int((due - time.monotonic()) * 1000) + 1)
            ready = {fd for fd, _ in poller.poll(timeout)}
            if self._wake_r in ready:
                with self._lock:
                    if self._stopping:
                        return
            try:
                if ino.fd in ready:
                    self._handle(ino.read())
                self._look_at_due()
            except Exception:  # a bug in a fingerprint or callback must not end the watch for good
                log.exception("folder watch: unexpected error")
            with self._lock:
                self.rounds += 1

    def _handle(self, events: list[RawEvent]) -> None:
        now = time.monotonic()
        with self._lock:
            rearm = False
            self.events_read += len(events)
            for ev in events:
                if ev.mask & IN_Q_OVERFLOW:
                    rearm = True
                    continue
                for role in self._roles.get(ev.wd, ()):  # unknown: a watch we dropped while re-arming
                    action = classify(ev.mask, ev.name, ancestor_of=role.ancestor_of)
                    if action is Action.REARM:
                        rearm = True
                    elif action is not Action.IGNORE:
                        self._settler.event(role.folder, action, ev.name, now)
            if rearm:
                self.rearms += 1
                log.debug("a watched folder or its parent changed: watching again")
                self._arm_locked()
                self._settler.touch_all(now)

    def _look_at_due(self) -> None:
        with self._lock:
            due = self._settler.pop_due(time.monotonic())
        for name in due:
            target = self.targets[name]
            now = target.fingerprint()
            with self._lock:
                if now == target.last:
                    continue
                target.last = now
            log.debug("change seen", extra={"target": name})
            self.on_change(name)
