"""inotify (watchdog) on folders, turned into "this thing really changed" notifications.

Folders, not files, are watched: the kubelet's manifest is replaced by rename (a file watch would follow the
old inode), and a ConfigMap update is an atomic swap of the ``..data`` symlink that raises no event on the
visible file names. So every event in a folder only schedules a look after a short debounce; the look
compares a content fingerprint with the last one seen, which also swallows our own writes: after writing,
the agent tells the watcher what it wrote (``expect``), and the resulting events find nothing new.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from patcher.errors import PatcherError
from patcher.fsio import file_fingerprint, folder_fingerprint

__all__ = ["FolderWatcher", "file_fingerprint", "folder_fingerprint"]

log = logging.getLogger(__name__)


@dataclass
class Target:
    name: str  # "source" or "manifest": what the callback receives
    fingerprint: Callable[[], str]
    last: str = ""
    timer: threading.Timer | None = None


class _Handler(FileSystemEventHandler):
    def __init__(self, owner: FolderWatcher, target: Target) -> None:
        self.owner = owner
        self.target = target

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in ("opened", "closed_no_write"):
            return  # reads (ours included) are not changes
        self.owner._poke(self.target)


class FolderWatcher:
    """Calls ``on_change(name)`` once a watched target's fingerprint differs from the last one seen."""

    def __init__(self, on_change: Callable[[str], None], debounce: float = 0.3) -> None:
        self.on_change = on_change
        self.debounce = debounce
        self.targets: dict[str, Target] = {}
        self._lock = threading.Lock()
        self._observer = Observer()
        self._started = False

    def add(self, name: str, folder: Path, fingerprint: Callable[[], str]) -> None:
        """Watch ``folder`` for ``name``; adding a name again watches one more folder for the same thing (a
        symlinked manifest changes in its target's folder)."""
        if not folder.is_dir():
            raise PatcherError(str(folder), "folder to watch does not exist")
        target = self.targets.get(name)
        if target is None:
            target = self.targets[name] = Target(name, fingerprint, last=fingerprint())
        self._observer.schedule(_Handler(self, target), str(folder), recursive=False)

    def start(self) -> None:
        self._observer.start()
        self._started = True

    def stop(self) -> None:
        with self._lock:
            for target in self.targets.values():
                if target.timer:
                    target.timer.cancel()
        if self._started:
            self._observer.stop()
            self._observer.join(timeout=2)

    def expect(self, name: str) -> None:
        """We just wrote this target: take its current content as seen, so our own events stay quiet."""
        target = self.targets.get(name)
        if target is not None:
            with self._lock:
                target.last = target.fingerprint()

    def _poke(self, target: Target) -> None:
        with self._lock:
            if target.timer:
                target.timer.cancel()
            target.timer = threading.Timer(self.debounce, self._settle, args=(target,))
            target.timer.daemon = True
            target.timer.start()

    def _settle(self, target: Target) -> None:
        now = target.fingerprint()
        with self._lock:
            if now == target.last:
                return
            target.last = now
        log.debug("change seen", extra={"target": target.name})
        self.on_change(target.name)
