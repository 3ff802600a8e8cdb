"""The agent's record on the node, in one place: ``state.json``, the manifest as it was before the patch, and the
node's writer lock, since all three live in the state folder.

The record's value and its encoding are pure (``patcher.core.state``); this module is every read and write of it,
through ``fsio``, never in the kubelet's manifest folder. The saved original is the last resort for restore (when
the current manifest cannot be parsed); normal restores work on the current manifest. Every failure to write in
the folder (or to make it) is a ``StateFolderError`` naming the folder as the operator gave it and the kernel's
answer (``Read-only file system``, ``No space left on device``, ``Not a directory``): the agent keeps running on
it, says so on the Node and tries again (docs/operator-contract.md).

The agent's executor saves each transition's record here once (``RecordKeeper.save``), before anything says its
phase. While the state folder refuses it, the step's ``CheckStateFolder`` retry (``retry``) is the only one that
tries, and its attempt comes back as one ``lifecycle`` event. The writer lock is held for the agent's whole life
(``hold_for_life``): when the state folder cannot hold it at the start, the first save that works takes it.
The other writers of ``state.json`` are ``nodefiles.apply`` (the record in the manifest's batch) and the restore
on exit (``stopping``), through the same ``StateStore``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from patcher.adapters import fsio
from patcher.adapters.health import Metrics
from patcher.core import lifecycle
from patcher.core.errors import PatcherError, StateFolderError
from patcher.core.manifestedit import MAX_MANIFEST_BYTES
from patcher.core.settings import Files
from patcher.core.state import State, decode, encode

log = logging.getLogger("patcher.services.agent")

#: What the record's writes, and every other file write of the agent, go through: named here so that the agent
#: (``Agent(file_ops=)``) is handed them without reaching into an adapter itself.
FileOps = fsio.FileOps
REAL_FILE_OPS = fsio.REAL

STATE_FILE = "state.json"
ORIGINAL_FILE = "original-manifest.yaml"
#: The record is a few KiB (hashes, file names, the last Ready config's names): 1 MiB bounds a read of one
#: that something else wrote there. The saved original is a manifest, bounded as the manifest is.
MAX_STATE_BYTES = 1024 * 1024
LIMITS = {STATE_FILE: MAX_STATE_BYTES, ORIGINAL_FILE: MAX_MANIFEST_BYTES}


class StateStore:
    def __init__(self, folder: Path, shown: str, ops: fsio.FileOps = fsio.REAL) -> None:
        self.folder = folder
        self.shown = shown
        self.ops = ops  # every write here, and every writer handed this store, writes through them

    def _path(self, name: str) -> Path:
        return self.folder / name

    @contextlib.contextmanager
    def _faults(self) -> Iterator[None]:
        """Any refusal of the folder's file system, as a ``StateFolderError`` (already one: unchanged)."""
        try:
            yield
        except StateFolderError:
            raise
        except PatcherError as exc:
            raise StateFolderError(exc.path, exc.problem) from None

    def _ensure(self) -> None:
        try:
            fsio.ensure_dir(self.folder, 0o700)
        except PatcherError as exc:
            raise StateFolderError(self.shown, exc.problem) from None

    def load(self) -> State:
        shown = f"{self.shown}/{STATE_FILE}"
        try:
            data = fsio.read_if_exists(self._path(STATE_FILE), "state record", shown, limit=MAX_STATE_BYTES)
            return State() if data is None else decode(data)
        except PatcherError as exc:
            raise PatcherError(shown, f"unreadable state record: {exc.problem}") from None
        except ValueError as exc:
            raise PatcherError(shown, f"unreadable state record: {exc}") from None

    def save(self, state: State) -> None:
        self._ensure()
        with self._faults():
            fsio.atomic_write(self._path(STATE_FILE), encode(state), mode=0o600, shown=f"{self.shown}/{STATE_FILE}",
                              ops=self.ops)

    def writes(self, state: State, original: bytes | None = None) -> list[fsio.Write]:
        """``save(state)`` (and the original manifest, when given) as writes for ``fsio.write_in_order``; their
        failures are ``StateFolderError``s."""
        self._ensure()
        out = [] if original is None else [fsio.Write(self._path(ORIGINAL_FILE), original,
                                                      f"{self.shown}/{ORIGINAL_FILE}", mode=0o600,
                                                      error=StateFolderError)]
        return [*out, fsio.Write(self._path(STATE_FILE), encode(state), f"{self.shown}/{STATE_FILE}", mode=0o600,
                                 error=StateFolderError)]

    def load_original(self) -> bytes | None:
        return self._read(ORIGINAL_FILE)

    def checkpoint(self) -> dict[str, bytes | None]:
        """The record's files as they are now, to rewind to when a write fails half-way."""
        return {name: self._read(name) for name in (STATE_FILE, ORIGINAL_FILE)}

    def _read(self, name: str) -> bytes | None:
        return fsio.read_if_exists(self._path(name), name, f"{self.shown}/{name}", limit=LIMITS[name])

    def rewind(self, checkpoint: dict[str, bytes | None]) -> None:
        with self._faults():
            self._rewind(checkpoint)

    def _rewind(self, checkpoint: dict[str, bytes | None]) -> None:
        for name, data in checkpoint.items():
            if data is None:
                fsio.remove(self._path(name))
            elif not fsio.holds(self._path(name), data):
                fsio.atomic_write(self._path(name), data, mode=0o600, ops=self.ops)

    def present(self) -> bool:
        """Whether the record or the saved original is there (what ``clear`` would remove); reads neither."""
        return any(os.path.lexists(self._path(name)) for name in (STATE_FILE, ORIGINAL_FILE))

    def clear(self) -> None:
        with self._faults():
            for name in (STATE_FILE, ORIGINAL_FILE):
                # Only what is there: on a read-only mount unlink fails with EROFS even for a missing file.
                if os.path.lexists(self._path(name)):
                    fsio.remove(self._path(name))


def state_store(files: Files, ops: fsio.FileOps = fsio.REAL) -> StateStore:
    """The state record in the node's state folder, written through ``ops``."""
    return StateStore(fsio.HostFS(files.host_root).local(files.state_dir), files.state_dir, ops)


def state_folder_message(exc: PatcherError) -> str:
    """The Node's sentence for a state folder that refused the record: the folder (or its file) and the kernel's
    answer, e.g. ``state folder unusable: /var/lib/scheduler-patcher/state.json: write failed: No space left
    on device``."""
    return f"state folder unusable: {exc}"


@contextlib.contextmanager
def writer_lock(files: Files, ops: fsio.FileOps = fsio.REAL) -> Iterator[None]:
    """The node's writer lock (reentrant for the thread that holds it): every write happens under it. It lives
    in the state folder: when the folder cannot hold it, a ``StateFolderError``. While another writer holds it,
    ``ops.sleep`` waits."""
    with contextlib.ExitStack() as stack:
        try:
            folder = fsio.HostFS(files.host_root).local(files.state_dir)
            stack.enter_context(fsio.writer_lock(folder, files.state_dir, wait=files.lock_wait, sleep=ops.sleep))
        except fsio.LockBusy:
            raise
        except PatcherError as exc:
            raise StateFolderError(exc.path, exc.problem) from None
        yield


def remove_stale_temp_files(files: Files) -> list[str]:
    """Dot-named temp files of ours that a killed writer left between create and rename (node paths).

    Under the writer lock, so a temp file of a live writer is never taken for a stale one; when another
    writer holds the lock (or the state folder is unusable) nothing is removed: the next writer cleans up.
    """
    try:
        with writer_lock(files):
            return remove_stale_temp_files_locked(files)
    except PatcherError:
        return []


def remove_stale_temp_files_locked(files: Files) -> list[str]:
    """``remove_stale_temp_files`` for a caller that holds the writer lock already."""
    fs = fsio.HostFS(files.host_root)
    removed = []
    manifest_path = fs.resolve(files.manifest_path)
    targets = [(posixpath.dirname(manifest_path), posixpath.basename(manifest_path)),
               (files.host_config_dir, "*"), (files.state_dir, "*")]
    for folder, name in targets:
        for path in fsio.remove_stale_temp_files(fs.local(folder), name):
            removed.append(posixpath.join(folder, path.name))
    return removed


class RecordKeeper:
    def __init__(self, files: Files, *, log_extra: dict[str, str], ops: fsio.FileOps = fsio.REAL) -> None:
        self.files = files
        self.store = state_store(files, ops)  # its ``ops`` are every file write of the agent
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
        for leftover in remove_stale_temp_files(self.files):
            log.info("removed %s, left by a writer that was killed mid-write", leftover, extra=self._log_extra)
        return record

    def hold_for_life(self, stack: contextlib.ExitStack, metrics: Metrics) -> bool:
        """Take the node's writer lock into ``stack`` (the agent's life): a CLI ``apply``/``restore`` run on the
        node meanwhile refuses in one line instead of racing the agent (the lock is reentrant for this thread).
        A state folder that cannot hold it is not fatal: the first save says so on the Node, and retries. False:
        another writer holds it."""
        own = contextlib.ExitStack()  # its own stack, so a hold can let go of the lock alone (``let_go``)
        try:
            own.enter_context(writer_lock(self.files, self.store.ops))
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
        Until ``reclaim`` every nodefiles call takes the lock itself, as before ``hold_for_life``."""
        if self._lock is not None and self._lock_held:
            self._lock.close()
            self._lock_held = False
            log.info("released the node's writer lock while the node is held", extra=self._log_extra)

    def reclaim(self) -> State:
        """The hold is gone: take the writer lock back (waiting ``lock_wait`` for a hand writer that holds it;
        still busy: the next save tries again) and read the record as it is on disk now."""
        if self._lock is not None and not self._lock_held:
            try:
                self._lock.enter_context(writer_lock(self.files, self.store.ops))
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
            self._lock.enter_context(writer_lock(replace(self.files, lock_wait=0.0), self.store.ops))
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
