"""Everything in the state folder: ``state.json`` (its value and encoding: ``patcher.core.state``), the manifest
as it was before the patch (the restore's last resort when the current one cannot be parsed), and the node's
writer lock. Never in the kubelet's manifest folder. Every refusal of the folder is a ``StateFolderError``
naming the folder and the kernel's answer: the agent keeps running, says so on the Node and tries again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from patcher.adapters import fsio
from patcher.adapters.health import Metrics
from patcher.core import fileread, lifecycle
from patcher.core.errors import PatcherError, StateFolderError
from patcher.core.manifestedit import MAX_MANIFEST_BYTES
from patcher.core.settings import Files
from patcher.core.state import State, decode, encode

log = logging.getLogger("patcher.services.agent")

STATE_FILE = "state.json"
ORIGINAL_FILE = "original-manifest.yaml"
#: The record is a few KiB (hashes, file names, the last Ready config's names): 1 MiB bounds a read of one
#: that something else wrote there. The saved original is a manifest, bounded as the manifest is.
MAX_STATE_BYTES = 1024 * 1024
LIMITS = {STATE_FILE: MAX_STATE_BYTES, ORIGINAL_FILE: MAX_MANIFEST_BYTES}
#: Every file write of the agent goes through them (``Agent(file_ops=)``, which imports no adapter itself).
FileOps = fsio.FileOps
REAL_FILE_OPS = fsio.REAL


@contextlib.contextmanager
def _folder_faults(kept: tuple[type[PatcherError], ...] = (StateFolderError,)) -> Iterator[None]:
    """Any refusal of the state folder's file system, as a ``StateFolderError`` (``kept``: raised as they are)."""
    try:
        yield
    except kept:
        raise
    except PatcherError as exc:
        raise StateFolderError(exc.path, exc.problem) from None


class StateStore:
    def __init__(self, folder: Path, shown: str, ops: fsio.FileOps = fsio.REAL) -> None:
        self.folder = folder
        self.shown = shown
        self.ops = ops  # every write here, and every writer handed this store, writes through them

    def load(self) -> State:
        shown = f"{self.shown}/{STATE_FILE}"
        try:
            data = fileread.read_if_exists(self.folder / STATE_FILE, "state record", shown, limit=MAX_STATE_BYTES)
            return State() if data is None else decode(data)
        except PatcherError as exc:
            raise PatcherError(shown, f"unreadable state record: {exc.problem}") from None
        except ValueError as exc:
            raise PatcherError(shown, f"unreadable state record: {exc}") from None

    def save(self, state: State) -> None:
        fsio.write_in_order(self.writes(state), ops=self.ops)

    def writes(self, state: State, original: bytes | None = None) -> list[fsio.Write]:
        """``save(state)`` (and the original manifest, when given) as writes for ``fsio.write_in_order``; their
        failures are ``StateFolderError``s."""
        try:
            fsio.ensure_dir(self.folder, 0o700)
        except PatcherError as exc:
            raise StateFolderError(self.shown, exc.problem) from None
        files = {ORIGINAL_FILE: original, STATE_FILE: encode(state)}
        return [fsio.Write(self.folder / name, data, f"{self.shown}/{name}", mode=0o600, error=StateFolderError)
                for name, data in files.items() if data is not None]

    def checkpoint(self) -> dict[str, bytes | None]:
        """The record's files as they are now, to rewind to when a write fails half-way."""
        return {name: self.read(name) for name in (STATE_FILE, ORIGINAL_FILE)}

    def read(self, name: str) -> bytes | None:
        """The bytes of ``STATE_FILE`` or ``ORIGINAL_FILE``, None when it is not there."""
        return fileread.read_if_exists(self.folder / name, name, f"{self.shown}/{name}", limit=LIMITS[name])

    def rewind(self, checkpoint: dict[str, bytes | None]) -> None:
        with _folder_faults():
            for name, data in checkpoint.items():
                if data is None:
                    fsio.remove(self.folder / name)
                elif not fileread.holds(self.folder / name, data):
                    fsio.atomic_write(self.folder / name, data, mode=0o600, ops=self.ops)

    def present(self) -> bool:
        """Whether the record or the saved original is there (what ``clear`` would remove); reads neither."""
        return any(os.path.lexists(self.folder / name) for name in (STATE_FILE, ORIGINAL_FILE))

    def clear(self) -> None:
        with _folder_faults():
            for name in (STATE_FILE, ORIGINAL_FILE):
                # Only what is there: on a read-only mount unlink fails with EROFS even for a missing file.
                if os.path.lexists(self.folder / name):
                    fsio.remove(self.folder / name)


def state_store(files: Files, ops: fsio.FileOps = fsio.REAL) -> StateStore:
    return StateStore(fsio.HostFS(files.host_root).local(files.state_dir), files.state_dir, ops)


def state_folder_message(exc: PatcherError) -> str:
    """The Node's sentence for a state folder that refused the record (the folder and the kernel's answer)."""
    return f"state folder unusable: {exc}"


@contextlib.contextmanager
def writer_lock(files: Files, ops: fsio.FileOps = fsio.REAL) -> Iterator[None]:
    """The node's writer lock (reentrant for the thread that holds it): every write happens under it. It lives
    in the state folder: when the folder cannot hold it, a ``StateFolderError``. While another writer holds it,
    ``ops.sleep`` waits."""
    with contextlib.ExitStack() as stack:
        with _folder_faults((StateFolderError, fsio.LockBusy)):  # the taking only: the body raises its own
            folder = fsio.HostFS(files.host_root).local(files.state_dir)
            stack.enter_context(fsio.writer_lock(folder, files.state_dir, wait=files.lock_wait, sleep=ops.sleep))
        yield


def remove_stale_temp_files(files: Files) -> list[str]:
    """Remove the temp files a killed writer left (node paths), under the writer lock so that a live writer's are
    never taken for stale; when it is busy (or the state folder unusable), the next writer cleans up."""
    try:
        with writer_lock(files):
            return remove_stale_temp_files_locked(files)
    except PatcherError:
        return []


def remove_stale_temp_files_locked(files: Files) -> list[str]:
    """``remove_stale_temp_files`` for a caller that holds the writer lock already."""
    fs = fsio.HostFS(files.host_root)
    manifest_path = fs.resolve(files.manifest_path)
    targets = [(posixpath.dirname(manifest_path), posixpath.basename(manifest_path)),
               (files.host_config_dir, "*"), (files.state_dir, "*")]
    return [posixpath.join(folder, path.name) for folder, name in targets
            for path in fsio.remove_stale_temp_files(fs.local(folder), name)]


class RecordKeeper:
    def __init__(self, files: Files, *, log_extra: dict[str, str], ops: fsio.FileOps = fsio.REAL) -> None:
        self.files = files
        self.store = state_store(files, ops)  # its ``ops`` are every file write of the agent
        self.saved: State | None = None  # the record the state folder holds, as far as this agent knows
        self._lock: contextlib.ExitStack | None = None  # holds the writer lock while the agent runs, once taken
        self._lock_held = False
        self._log_extra = log_extra

    def load(self, *, clean: bool = True) -> State:
        """The record the last agent left (a fresh one when it cannot be read), after removing what a writer
        killed mid-write left (``clean``). Not proven saved yet: the first transition's save tests the folder."""
        try:
            record = self.store.load()
        except PatcherError as exc:
            log.error("state record unreadable, starting fresh: %s", exc, extra=self._log_extra)
            record = State()
        if clean:  # else the writer lock is busy: the record as far as this agent knows stands
            self.saved = None
            for leftover in remove_stale_temp_files(self.files):
                log.info("removed %s, left by a writer that was killed mid-write", leftover, extra=self._log_extra)
        return record

    def hold_for_life(self, stack: contextlib.ExitStack, metrics: Metrics) -> bool:
        """Take the node's writer lock for the agent's life (``stack``): a CLI ``apply``/``restore`` meanwhile
        refuses in one line instead of racing the agent. A state folder that cannot hold it is not fatal (the
        first save says so, and retries). False: another writer holds it."""
        own = contextlib.ExitStack()  # its own stack, so a hold can let go of the lock alone (``let_go``)
        try:
            own.enter_context(writer_lock(self.files, self.store.ops))
            self._lock_held = True
        except fsio.LockBusy as exc:
            metrics.error("lock")
            log.error("%s", exc, extra=self._log_extra)
            return False
        except StateFolderError:
            pass  # the state folder cannot hold it: the first save says so on the Node, and retries
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
                self._lock_held = True
            except (fsio.LockBusy, StateFolderError) as exc:
                log.warning("cannot take the node's writer lock back yet (%s); each write takes it meanwhile", exc,
                            extra=self._log_extra)
                return self.load(clean=False)  # the left-overs check would wait for the same busy lock again
        return self.load()

    def _write(self, record: State) -> None:
        """Save ``record``, after taking the writer lock for good if the start could not (the state folder was
        unusable), without waiting: another writer holding it is a refusal (``StateFolderError``), tried again
        later."""
        if self._lock is not None and not self._lock_held:
            with _folder_faults():  # LockBusy included
                self._lock.enter_context(writer_lock(replace(self.files, lock_wait=0.0), self.store.ops))
            self._lock_held = True
        self.store.save(record)
        self.saved = record

    def save(self, node: lifecycle.Node) -> PatcherError | None:
        """Save a transition's record; returns the state folder's refusal (a transition of its own,
        ``StateFolderFailed``: while it lasts only ``retry`` saves)."""
        if node.record == self.saved or node.fault is not None:
            return None
        try:
            self._write(node.record)
        except StateFolderError as exc:
            return exc
        except PatcherError as exc:
            log.error("cannot save the state record: %s", exc, extra=self._log_extra)
        return None

    def retry(self, record: State) -> lifecycle.StateFolderOk | lifecycle.StateFolderFailed:
        """The state folder's retry: the writer lock when it could not be taken, and the record."""
        try:
            self._write(record)
        except PatcherError as exc:
            return lifecycle.StateFolderFailed(state_folder_message(exc))
        return lifecycle.StateFolderOk()
