"""The agent's own record on the node: what it wrote, and the manifest as it was before the patch.

It lives in the state folder, never in the kubelet's manifest folder. The saved original is the last resort
for restore (when the current manifest cannot be parsed); normal restores work on the current manifest.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from patcher import fsio
from patcher.errors import PatcherError

STATE_FILE = "state.json"
ORIGINAL_FILE = "original-manifest.yaml"


@dataclass
class State:
    manifest: str = ""  # node path of the manifest we patched (symlinks resolved)
    config_hash: str = ""  # full sha256 of the config the scheduler should run with
    config_file: str = ""
    files: list[str] = field(default_factory=list)  # host config files of the current config
    previous_files: list[str] = field(default_factory=list)  # kept for a rollback until the new one is confirmed
    written: list[str] = field(default_factory=list)  # every host config file we wrote that may still exist
    original_sha256: str = ""
    patched_sha256: str = ""
    manifest_mtime_ns: int = 0  # mtime after our last write
    phase: str = ""  # the agent's state machine (Pending, WaitingForRestart, Ready, ...)
    bad_hashes: list[str] = field(default_factory=list)  # configs that failed and must not be retried
    last_good: dict[str, Any] = field(default_factory=dict)  # {config_hash, files} of the last Ready config
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def patched(self) -> bool:
        return bool(self.patched_sha256)


class StateStore:
    def __init__(self, folder: Path, shown: str) -> None:
        self.folder = folder
        self.shown = shown

    def _path(self, name: str) -> Path:
        return self.folder / name

    def load(self) -> State:
        path = self._path(STATE_FILE)
        if not path.exists():
            return State()
        try:
            raw = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError) as exc:
            raise PatcherError(f"{self.shown}/{STATE_FILE}", f"unreadable state record: {exc}") from None
        known = {f.name for f in fields(State)}
        return State(**{k: v for k, v in raw.items() if k in known})

    def save(self, state: State) -> None:
        fsio.ensure_dir(self.folder, 0o700)
        data = json.dumps(asdict(state), indent=2, sort_keys=True).encode() + b"\n"
        fsio.atomic_write(self._path(STATE_FILE), data, mode=0o600, shown=f"{self.shown}/{STATE_FILE}")

    def save_original(self, data: bytes) -> None:
        fsio.ensure_dir(self.folder, 0o700)
        fsio.atomic_write(self._path(ORIGINAL_FILE), data, mode=0o600, shown=f"{self.shown}/{ORIGINAL_FILE}")

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
        for name, data in checkpoint.items():
            if data is None:
                fsio.remove(self._path(name))
            elif not self._path(name).exists() or self._path(name).read_bytes() != data:
                fsio.atomic_write(self._path(name), data, mode=0o600)

    def clear(self) -> None:
        for name in (STATE_FILE, ORIGINAL_FILE):
            fsio.remove(self._path(name))
