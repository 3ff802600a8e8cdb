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
from patcher.core.state import State, decode, encode

STATE_FILE = "state.json"
ORIGINAL_FILE = "original-manifest.yaml"


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
        path = self._path(STATE_FILE)
        if not path.exists():
            return State()
        try:
            return decode(path.read_bytes())
        except (OSError, ValueError) as exc:
            raise PatcherError(f"{self.shown}/{STATE_FILE}", f"unreadable state record: {exc}") from None

    def save(self, state: State) -> None:
        self._ensure()
        with self._faults():
            fsio.atomic_write(self._path(STATE_FILE), encode(state), mode=0o600, shown=f"{self.shown}/{STATE_FILE}")

    def save_original(self, data: bytes) -> None:
        self._ensure()
        with self._faults():
            fsio.atomic_write(self._path(ORIGINAL_FILE), data, mode=0o600, shown=f"{self.shown}/{ORIGINAL_FILE}")

    def writes(self, state: State, original: bytes | None = None) -> list[fsio.Write]:
        """``save(state)`` (and ``save_original(original)``) as writes for ``fsio.write_in_order``; their
        failures are ``StateFolderError``s."""
        self._ensure()
        out = [] if original is None else [fsio.Write(self._path(ORIGINAL_FILE), original,
                                                      f"{self.shown}/{ORIGINAL_FILE}", mode=0o600,
                                                      error=StateFolderError)]
        return [*out, fsio.Write(self._path(STATE_FILE), encode(state), f"{self.shown}/{STATE_FILE}", mode=0o600,
                                 error=StateFolderError)]

    def load_original(self) -> bytes | None:
        try:
            return self._path(ORIGINAL_FILE).read_bytes()
        except FileNotFoundError:
            return None

    def checkpoint(self) -> dict[str, bytes | None]:
        """The record's files as they are now, to rewind to when a write fails half-way."""
        out: dict[str, bytes | None] = {}
        for name in (STATE_FILE, ORIGINAL_FILE):
            try:
                out[name] = self._path(name).read_bytes()
            except FileNotFoundError:
                out[name] = None
        return out

    def rewind(self, checkpoint: dict[str, bytes | None]) -> None:
        with self._faults():
            self._rewind(checkpoint)

    def _rewind(self, checkpoint: dict[str, bytes | None]) -> None:
        for name, data in checkpoint.items():
            if data is None:
                fsio.remove(self._path(name))
            elif not self._path(name).exists() or self._path(name).read_bytes() != data:
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
