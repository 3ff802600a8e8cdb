"""Where the agent's record lives on the node: ``state.json`` and the manifest as it was before the patch.

Both live in the state folder, never in the kubelet's manifest folder, written atomically through ``fsio``.
The saved original is the last resort for restore (when the current manifest cannot be parsed); normal
restores work on the current manifest. The record itself (``State``, ``LastGood``, its format) is pure and
lives in ``patcher.core.state``.

Every failure to write in the folder (or to make it) is a ``StateFolderError`` naming the folder as the
operator gave it and the kernel's answer (``Read-only file system``, ``No space left on device``, ``Not a
directory``): the agent keeps running on it, says so on the Node and tries again (docs/operator-contract.md).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from patcher.adapters import fsio
from patcher.core.errors import PatcherError, StateFolderError
from patcher.core.manifest import MAX_MANIFEST_BYTES
from patcher.core.state import State, decode, encode

STATE_FILE = "state.json"
ORIGINAL_FILE = "original-manifest.yaml"
#: The record is a few KiB (hashes, file names, the last Ready config's names): 1 MiB bounds a read of one
#: that something else wrote there. The saved original is a manifest, bounded as the manifest is.
MAX_STATE_BYTES = 1024 * 1024
LIMITS = {STATE_FILE: MAX_STATE_BYTES, ORIGINAL_FILE: MAX_MANIFEST_BYTES}


class StateStore:
    def __init__(self, folder: Path, shown: str) -> None:
        self.folder = folder
        self.shown = shown

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
            fsio.atomic_write(self._path(STATE_FILE), encode(state), mode=0o600, shown=f"{self.shown}/{STATE_FILE}")

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
                fsio.atomic_write(self._path(name), data, mode=0o600)

    def present(self) -> bool:
        """Whether the record or the saved original is there (what ``clear`` would remove); reads neither."""
        return any(os.path.lexists(self._path(name)) for name in (STATE_FILE, ORIGINAL_FILE))

    def clear(self) -> None:
        with self._faults():
            for name in (STATE_FILE, ORIGINAL_FILE):
                # Only what is there: on a read-only mount unlink fails with EROFS even for a missing file.
                if os.path.lexists(self._path(name)):
                    fsio.remove(self._path(name))
