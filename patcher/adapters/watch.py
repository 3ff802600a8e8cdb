"""Folder watches on the ``watchdog`` library's inotify observer, turned into "this thing really changed".

Folders, not files, are watched: the kubelet replaces a manifest by rename (a file watch would follow the old
inode), and a ConfigMap update swaps the ``..data`` symlink without an event on the visible names. Every event
schedules a look, which compares a content fingerprint with the last one seen; after writing, the agent tells
the watcher what it wrote (``expect``), so its own events find nothing new.

When to look: a file modified and not yet closed has a writer at work, so a look waits for every writer in the
target's folders to close, then a short quiet time (``debounce``: a writer's next syscall), never longer than
``max_wait``. The kubelet's rename of ``..data_tmp`` over ``..data`` is the last step that matters: once the
visible names match it (``configmap_published``) the look starts at once. ``Settler`` (the timing) and
``classify`` (what one event means) are pure.

A watched folder can be deleted, renamed away or have a parent replaced: each folder's ancestors are watched
too, and while a folder is gone its nearest existing ancestor is watched for it to appear; any such event
re-arms every watch from the paths and looks at every target. The event filters keep the kernel masks small.

Threads: watchdog's (a reader per watch, a dispatcher that wakes once an hour when idle; stop() ends it at
once), and one of ours that sleeps with no timeout unless a look is due. watchdog's callbacks never take
``_lock`` (watchdog holds its own lock while dispatching, we hold ours while (un)scheduling).
"""

from __future__ import annotations

import errno
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from watchdog import events as wde
from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers.api import BaseObserver
from watchdog.observers.inotify import InotifyFullEmitter, InotifyObserver

from patcher.core.errors import PatcherError

log = logging.getLogger(__name__)

#: The observer's dispatcher wakes up this often when nothing happens (stop() does not wait for it).
OBSERVER_TIMEOUT = 3600.0

#: "Full events": a move out of a watched folder is a move without destination, not a deletion, so ancestors
#: need no deletion events (one for every sibling deleted in a busy /etc). watchdog 4.x cannot filter them.
FULL_EVENTS = "event_filter" in inspect.signature(InotifyFullEmitter.__init__).parameters
#: A watched folder: entries created, written, closed after writing, moved, deleted (no reads, no opens; at
#: watchdog 4.x the closing of a reader also reaches watchdog, which drops it).
CONTENT_EVENTS: tuple[type[FileSystemEvent], ...] = (
    FileCreatedEvent, FileModifiedEvent, FileClosedEvent, FileDeletedEvent, FileMovedEvent,
    DirCreatedEvent, DirMovedEvent, DirDeletedEvent,
)
#: An ancestor of a watched folder: its next path component moved away or over (a deletion needs the folder
#: deleted first, which the folder's own watch sees).
ANCESTOR_EVENTS: tuple[type[FileSystemEvent], ...] = (
    (DirMovedEvent,) if FULL_EVENTS else (DirMovedEvent, DirDeletedEvent)
)
#: The nearest existing ancestor of a folder that is gone: also its next path component appearing, and its
#: own deletion (watchdog drops an ``IN_DELETE_SELF`` the filter does not name: an ``rmtree`` split by a re-arm
#: would leave the watch on a deleted inode).
CREATION_EVENTS: tuple[type[FileSystemEvent], ...] = tuple(dict.fromkeys((DirCreatedEvent, DirDeletedEvent,
                                                                           *ANCESTOR_EVENTS)))

#: watchdog >= 7 tells attribute changes apart (``FileAttribEvent``); before, a chmod or touch arrives as a
#: ``FileModifiedEvent`` and holds the look as an open writer would, up to ``max_wait``.
_ATTRIB: tuple[type[FileSystemEvent], ...] = tuple(
    c for c in (getattr(wde, "FileAttribEvent", None), getattr(wde, "DirAttribEvent", None)) if c is not None
)


class Action(Enum):
    CHANGE = "change"  # an entry changed: look at the target
    WRITING = "writing"  # a writer is at work on ``name``
    CLOSED = "closed"  # ``name``'s writer is done (or the file is gone)
    COMMIT = "commit"  # a ConfigMap's ``..data`` swap: the new content is complete, look at once
    REARM = "rearm"  # the watched path itself changed: watch again from the paths


#: The kubelet's AtomicWriter publishes a ConfigMap or Secret volume's new content with one rename of a fresh
#: ``..data_tmp`` symlink over ``..data``: every file is written (and closed) before it.
CONFIGMAP_DATA = "..data"


def _name(path: bytes | str) -> str:
    return os.path.basename(os.fsdecode(path)) if path else ""


def classify(event: FileSystemEvent, *, watched: str, ancestor_of: str | None) -> list[tuple[Action, str]]:
    """What one watchdog event means for a folder watch on ``watched``: ``(action, entry name)`` pairs.

    ``ancestor_of``: the next path component, when this watch is on an ancestor of the watched folder rather
    than on the folder itself. Only names are compared, never folders: a watch that was moved along with its
    folder still reports paths under the old name until it is re-armed.
    """
    src = os.fsdecode(event.src_path)
    if isinstance(event, (DirDeletedEvent, FileDeletedEvent)) and src == watched:
        return [(Action.REARM, "")]  # the watched path itself is gone
    names = [_name(event.src_path)]
    dest = getattr(event, "dest_path", "")
    if isinstance(event, (DirMovedEvent, FileMovedEvent)) and dest:
        names.append(_name(dest))
    if ancestor_of is not None:
        return [(Action.REARM, ancestor_of)] if ancestor_of in names else []
    if _ATTRIB and isinstance(event, _ATTRIB):
        return []  # a chmod or touch: no content changed (a write raises its own event)
    if isinstance(event, (FileMovedEvent, DirMovedEvent)):
        out = [(Action.CLOSED, names[0])] if event.src_path else []  # moved away: no writer left here
        return out + [(Action.COMMIT if n == CONFIGMAP_DATA else Action.CHANGE, n) for n in names[1:]]
    if isinstance(event, (FileDeletedEvent, DirDeletedEvent, FileClosedEvent)):
        return [(Action.CLOSED, names[0])]
    if isinstance(event, FileModifiedEvent):
        return [(Action.WRITING, names[0])]
    if isinstance(event, (FileCreatedEvent, DirCreatedEvent)):
        return [(Action.CHANGE, names[0])]
    return []  # directory modified, opened, closed without writing: nothing for us


@dataclass
class _Pending:
    first: float  # when the first unsettled event came
    last: float  # when the latest one came
    commit: float | None = None  # when a ConfigMap swap came (the content is complete: no quiet time)


class Settler:
    """When to look at which target, from the events seen so far; pure (the clock is an argument).

    A target is due ``quiet`` seconds after its last event once no file in its folders has an open writer,
    and at the latest ``max_wait`` seconds after its first unsettled event (a writer that never closes). A
    ConfigMap swap (``COMMIT``) is the writer's own "done": with no open writer, the target is due at once.
    """

    def __init__(self, quiet: float, max_wait: float) -> None:
        self.quiet = quiet
        self.max_wait = max(quiet, max_wait)
        self.folders: dict[str, set[str]] = {}  # target -> its folders (the watcher arms these)
        self._pending: dict[str, _Pending] = {}
        self._writers: dict[str, set[str]] = {}  # folder -> names with a writer at work

    def track(self, target: str, folder: str) -> None:
        self.folders.setdefault(target, set()).add(folder)

    def targets_of(self, folder: str) -> list[str]:
        return [t for t, folders in self.folders.items() if folder in folders]

    def event(self, folder: str, action: Action, name: str, now: float) -> None:
        """Record one classified event in ``folder`` (REARM: pass every folder, or call ``touch_all``)."""
        writers = self._writers.setdefault(folder, set())
        if action is Action.WRITING:
            writers.add(name)
        elif action is Action.CLOSED:
            writers.discard(name)
        elif action is Action.REARM:
            writers.clear()  # a new watch cannot see old writers close: do not wait for them
        for target in self.targets_of(folder):
            self._touch(target, now)
            if action is Action.COMMIT:
                self._pending[target].commit = now

    def touch_all(self, now: float) -> None:
        self._writers.clear()
        for target in self.folders:
            self._touch(target, now)

    def _touch(self, target: str, now: float) -> None:
        pending = self._pending.get(target)
        if pending is None:
            self._pending[target] = _Pending(now, now)
        else:
            pending.last = now

    def _due_at(self, target: str, pending: _Pending) -> float:
        cap = pending.first + self.max_wait
        if any(self._writers.get(f) for f in self.folders.get(target, ())):
            return cap
        if pending.commit is not None:
            return min(cap, pending.commit)
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


# -- the watchdog adapter -----------------------------------------------------------------------------------


def configmap_published(folder: str) -> bool:
    """After a ``..data`` swap: does every entry of ``..data`` have its visible name, and does no visible name
    dangle? The kubelet adds the names of new keys, and removes those of dropped keys, right after the swap; a
    look before that would see a half state (a new file missing, an old one gone), so it waits the quiet time.
    """
    try:
        published = {n for n in os.listdir(os.path.join(folder, CONFIGMAP_DATA)) if not n.startswith(".")}
        visible = [e for e in os.scandir(folder) if not e.name.startswith(".")]
    except OSError:
        return False
    if not published <= {e.name for e in visible}:
        return False
    return all(os.path.exists(e.path) for e in visible if e.is_symlink())


def ancestors(folder: str) -> list[tuple[str, str]]:
    """``(ancestor, next component)`` pairs from the root down to the folder's parent."""
    parts = Path(os.path.abspath(folder)).parts
    return [(str(Path(*parts[:i])), parts[i]) for i in range(1, len(parts))]


@dataclass
class Target:
    fingerprint: Callable[[], str]
    last: str = ""


@dataclass(frozen=True)
class _Role:
    folder: str
    ancestor_of: str | None  # None: the folder itself


class _Handler(FileSystemEventHandler):
    """Hands each event of one watch to the watcher's inbox; runs on watchdog's dispatcher thread."""

    def __init__(self, inbox: Callable[[int, str, _Role, FileSystemEvent], None], generation: int, path: str,
                 role: _Role) -> None:
        super().__init__()
        self._inbox = inbox
        self._generation = generation
        self._path = path
        self._role = role

    def dispatch(self, event: FileSystemEvent) -> None:
        self._inbox(self._generation, self._path, self._role, event)


def _inotify_observer() -> BaseObserver:
    observer = InotifyObserver(timeout=OBSERVER_TIMEOUT, generate_full_events=FULL_EVENTS)
    observer.start()  # before any schedule: a watch that cannot be set up fails in schedule(), not later
    return observer


class FolderWatcher:
    """Calls ``on_change(name)`` once a watched target's fingerprint differs from the last one seen.

    ``debounce`` is the quiet time after the last event (writers with a file open are waited for on top,
    up to ``max_wait``). The callback runs on the watcher's thread: keep it short (queue the work).
    """

    def __init__(self, on_change: Callable[[str], None], debounce: float = 0.02, max_wait: float = 2.0, *,
                 published: Callable[[str], bool] = configmap_published,
                 observer: Callable[[], BaseObserver] | None = None, settler: Settler | None = None) -> None:
        """``published``: whether a ConfigMap swap in a folder may be looked at at once; ``observer``: makes the
        started watchdog observer (default: inotify); ``settler``: the timing core (default: ``Settler(debounce,
        max_wait)``)."""
        self.on_change = on_change
        self._is_published = published
        self._make_observer = observer or _inotify_observer
        self.debounce = debounce
        self.targets: dict[str, Target] = {}
        self._settler = settler or Settler(debounce, max_wait)
        self._lock = threading.Lock()  # targets, settler, watches; never taken on watchdog's threads
        self._cv = threading.Condition(threading.Lock())  # the inbox, and waking our thread
        self._inbox: list[tuple[int, str, _Role, FileSystemEvent]] = []
        self._observer: BaseObserver | None = None
        self._generation = 0  # events of watches dropped by a re-arm are ignored
        self._thread: threading.Thread | None = None
        self._stopping = False

    def add(self, name: str, folder: Path, fingerprint: Callable[[], str], *, missing_ok: bool = False) -> None:
        """Watch ``folder`` for ``name`` (again: one more folder, as a symlinked manifest's target's).
        ``missing_ok``: a folder not there yet is watched for from its nearest existing ancestor."""
        if not missing_ok and not folder.is_dir():
            raise PatcherError(str(folder), "folder to watch does not exist")
        with self._lock:
            if self._observer is None:
                try:
                    self._observer = self._make_observer()
                except OSError as exc:  # e.g. fs.inotify.max_user_instances reached
                    raise PatcherError(str(folder), f"cannot watch: {exc.strerror or exc}") from exc
            if name not in self.targets:
                self.targets[name] = Target(fingerprint, last=fingerprint())
            self._settler.track(name, os.path.abspath(folder))
            missing = self._arm_locked()
        if missing:
            raise PatcherError(str(folder), f"cannot watch: {missing}")

    def start(self) -> None:
        with self._lock:
            if self._thread is not None or self._stopping or self._observer is None:  # None: nothing added
                return
            self._thread = threading.Thread(target=self._run, name="folder-watch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            thread, observer = self._thread, self._observer
            self._observer = None
        with self._cv:
            self._cv.notify_all()
        if observer is not None:
            observer.stop()  # also ends every emitter; the dispatcher gets a sentinel, not a timeout
            observer.join(timeout=2)
        if thread is not None:
            thread.join(timeout=2)

    def expect(self, name: str) -> None:
        """We just wrote this target: take its current content as seen, so our own events stay quiet."""
        target = self.targets.get(name)
        if target is not None:
            with self._lock:
                target.last = target.fingerprint()

    # -- internals --------------------------------------------------------------------------------------

    def _arm_locked(self) -> str:
        """(Re)create every watch from the paths; returns the first error for a folder that exists."""
        assert self._observer is not None
        self._generation += 1  # before the new watches exist: none of their events is taken for an old one
        self._observer.unschedule_all()
        first_error = ""
        folders = sorted({f for fs in self._settler.folders.values() for f in fs})
        for folder in folders:
            if not self._arm_chain_locked(folder) and os.path.isdir(folder):
                first_error = first_error or f"cannot set up a watch on {folder}"
        return first_error

    def _arm_chain_locked(self, folder: str) -> bool:
        """Watch ``folder`` and its ancestors; when a path component is missing, watch the nearest existing
        ancestor for it to appear instead. True when the folder itself is watched."""
        chain: list[tuple[str, str | None]] = [*ancestors(folder), (folder, None)]
        i, retries = 0, 0
        while i < len(chain):
            path, child = chain[i]
            added = self._add_locked(path, CONTENT_EVENTS if child is None else ANCESTOR_EVENTS, _Role(folder, child))
            if added is True or (added is None and child is not None):
                i += 1  # an ancestor we may not watch (EACCES): only its replacement goes unseen
                continue
            if i == 0 or added is None:
                return False
            parent, name = chain[i - 1]
            parent_gone = self._add_locked(parent, CREATION_EVENTS, _Role(folder, name)) is False
            if retries < len(chain) and (parent_gone or os.path.isdir(path)):
                retries += 1  # its parent deleted meanwhile (an rmtree): watch from further up; or it was created
                i -= 1 if parent_gone else 0
                continue
            return False
        return True

    def _add_locked(self, path: str, events: tuple[type[FileSystemEvent], ...], role: _Role) -> bool | None:
        """True: watched; False: the path does not exist (or is no folder); None: another error."""
        if not os.path.isdir(path):
            return False  # watchdog would watch a file, or raise ENOENT
        assert self._observer is not None
        try:
            self._observer.schedule(_Handler(self._receive, self._generation, path, role), path, recursive=False,
                                    event_filter=list(events))
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return False
            log.log(logging.WARNING if role.ancestor_of is None else logging.DEBUG,
                    "cannot watch %s: %s", path, exc.strerror or exc)
            return None
        return True

    def _receive(self, generation: int, path: str, role: _Role, event: FileSystemEvent) -> None:
        """On watchdog's dispatcher thread: queue the event and wake our thread (nothing else, no ``_lock``)."""
        with self._cv:
            self._inbox.append((generation, path, role, event))
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                due = self._settler.next_due()
            with self._cv:
                if not self._inbox and not self._stopping:
                    self._cv.wait(None if due is None else max(0.0, due - time.monotonic()))
                if self._stopping:
                    return
                batch, self._inbox = self._inbox, []
            try:
                if batch:
                    self._handle(batch)
                self._look_at_due()
            except Exception:  # a bug in a fingerprint or callback must not end the watch for good
                log.exception("folder watch: unexpected error")

    def _handle(self, batch: list[tuple[int, str, _Role, FileSystemEvent]]) -> None:
        now = time.monotonic()
        with self._lock:
            if self._stopping or self._observer is None:
                return
            rearm = False
            for generation, path, role, event in batch:
                if generation != self._generation:
                    continue  # a watch dropped by a re-arm
                actions = classify(event, watched=path, ancestor_of=role.ancestor_of)
                for action, name in actions:
                    if action is Action.COMMIT and not self._is_published(role.folder):
                        action = Action.CHANGE
                    if action is Action.REARM:
                        rearm = True
                    else:
                        self._settler.event(role.folder, action, name, now)
            if rearm:
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
