"""The agent's state record and the node's writer lock, with one owner, since both live in the state folder.

The executor saves each transition's record here once (``save``), before anything says its phase. While the
state folder refuses it, the step's ``CheckStateFolder`` retry (``retry``) is the only one that tries, and its
attempt comes back as one ``lifecycle`` event. The writer lock is held for the agent's whole life
(``hold_for_life``): when the state folder cannot hold it at the start, the first save that works takes it.
The other writers of ``state.json`` are ``engine.apply`` (the record in the manifest's batch) and the restore
on exit (``stopping``), through the same ``store``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import replace

from patcher.adapters import fsio
from patcher.adapters.health import Metrics
from patcher.core import lifecycle
from patcher.core.errors import PatcherError, StateFolderError
from patcher.core.settings import Files
from patcher.core.state import State
from patcher.services import engine
from patcher.services.patching import state_folder_message

log = logging.getLogger("patcher.services.agent")


class RecordKeeper:
    def __init__(self, files: Files, *, log_extra: dict[str, str]) -> None:
        self.files = files
        self.store = engine.state_store(files)
        self.saved: State | None = None  # the record the state folder holds, as far as this agent knows
        self._lock: contextlib.ExitStack | None = None  # holds the writer lock while the agent runs, once taken
        self._lock_held = False
        self._log_extra = log_extra

    def load(self) -> State:
        """The record the last agent left (a fresh one when it cannot be read), after removing what a writer
        killed mid-write left. Not proven saved yet: the first transition saves it, which tests the folder."""
        try:
            record = self.store.load()
        except PatcherError as exc:
            log.error("state record unreadable, starting fresh: %s", exc, extra=self._log_extra)
            record = State()
        self.saved = None
        for leftover in engine.remove_stale_temp_files(self.files):
            log.info("removed %s, left by a writer that was killed mid-write", leftover, extra=self._log_extra)
        return record

    def hold_for_life(self, stack: contextlib.ExitStack, metrics: Metrics) -> bool:
        """Take the node's writer lock into ``stack`` (the agent's life): a CLI ``apply``/``restore`` run on the
        node meanwhile refuses in one line instead of racing the agent (the lock is reentrant for this thread).
        A state folder that cannot hold it is not fatal: the first save says so on the Node, and retries. False:
        another writer holds it."""
        own = contextlib.ExitStack()  # its own stack, so a hold can let go of the lock alone (``let_go``)
        try:
            own.enter_context(engine.writer_lock(self.files))
        except fsio.LockBusy as exc:
            metrics.error("lock")
            log.error("%s", exc, extra=self._log_extra)
            return False
        except StateFolderError:
            pass  # the state folder cannot hold it: the first save says so on the Node, and retries
        else:
            self._lock_held = True
        stack.callback(own.close)
        self._lock = own
        return True

    def let_go(self) -> None:
        """The node is held: release the writer lock, so that a hand ``restore``/``apply`` can run on the node.
        Until ``reclaim`` every engine call takes the lock itself, as before ``hold_for_life``."""
        if self._lock is not None and self._lock_held:
            self._lock.close()
            self._lock_held = False
            log.info("released the node's writer lock while the node is held", extra=self._log_extra)

    def reclaim(self) -> State:
        """The hold is gone: take the writer lock back (waiting ``lock_wait`` for a hand writer that holds it;
        still busy: the next save tries again) and read the record as it is on disk now."""
        if self._lock is not None and not self._lock_held:
            try:
                self._lock.enter_context(engine.writer_lock(self.files))
            except (fsio.LockBusy, StateFolderError) as exc:
                log.warning("cannot take the node's writer lock back yet (%s); each write takes it meanwhile", exc,
                            extra=self._log_extra)
                try:  # the record only: the left-overs check would wait for the same busy lock again
                    return self.store.load()
                except PatcherError as err:
                    log.error("state record unreadable, starting fresh: %s", err, extra=self._log_extra)
                    return State()
            else:
                self._lock_held = True
        return self.load()

    def _hold_lock(self) -> None:
        """Take the writer lock for the rest of the agent's life if it could not be taken at its start (the
        state folder was unusable), without waiting: another writer that took it meanwhile is a refusal, tried
        again later. Before ``hold_for_life`` (tests driving the executor) every engine call takes it itself."""
        if self._lock is None or self._lock_held:
            return
        try:
            self._lock.enter_context(engine.writer_lock(replace(self.files, lock_wait=0.0)))
        except fsio.LockBusy as exc:
            raise StateFolderError(exc.path, exc.problem) from None
        self._lock_held = True

    def save(self, node: lifecycle.Node) -> tuple[PatcherError | None, bool]:
        """Save a transition's record: (the state folder's refusal, saved). A state folder that refuses it is a
        transition of its own (``StateFolderFailed``); while that lasts nothing is saved here: ``retry`` is the
        one that tries."""
        if node.record == self.saved or node.fault is not None:
            return None, False
        try:
            self._hold_lock()
            self.store.save(node.record)
        except StateFolderError as exc:
            return exc, False
        except PatcherError as exc:
            log.error("cannot save the state record: %s", exc, extra=self._log_extra)
            return None, False
        self.saved = node.record
        return None, True

    def retry(self, record: State) -> lifecycle.StateFolderOk | lifecycle.StateFolderFailed:
        """The state folder's retry: save the record as it stands (the writer lock first, when it could not be
        taken)."""
        try:
            self._hold_lock()
            self.store.save(record)
        except PatcherError as exc:
            return lifecycle.StateFolderFailed(time.monotonic(), state_folder_message(exc))
        self.saved = record
        return lifecycle.StateFolderOk(time.monotonic())
