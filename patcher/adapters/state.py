"""The agent's own record on the node: what it wrote, and the manifest as it was before the patch.

It lives in the state folder, never in the kubelet's manifest folder. The saved original is the last resort
for restore (when the current manifest cannot be parsed); normal restores work on the current manifest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from patcher.adapters import fsio
from patcher.core.errors import PatcherError

STATE_FILE = "state.json"
ORIGINAL_FILE = "original-manifest.yaml"
#: On-disk format. 1 (no ``version`` key): ``last_good`` a free dict, message/restart time/source hash in
#: ``extra``. 2: every field typed. Version 1 files are read (and rewritten as 2 on the next save).
FORMAT_VERSION = 2


@dataclass(frozen=True)
class LastGood:
    """The last config the scheduler was seen running Ready with: what a rollback goes back to."""

    config_hash: str
    config_file: str
    files: tuple[str, ...] = ()
    source_hash: str = ""
    original_sha256: str = ""  # the unpatched manifest it ran on: after an upgrade only the original is safe
    api_version: str = ""

    @classmethod
    def from_json(cls, raw: Any) -> LastGood | None:
        if not isinstance(raw, dict) or not raw.get("config_hash"):
            return None
        return cls(config_hash=str(raw["config_hash"]), config_file=str(raw.get("config_file") or ""),
                   files=tuple(str(f) for f in raw.get("files") or ()), source_hash=str(raw.get("source_hash") or ""),
                   original_sha256=str(raw.get("original_sha256") or ""),
                   api_version=str(raw.get("api_version") or ""))


@dataclass(frozen=True)
class State:
    """The agent's record on the node. Frozen: a change is a new value (``dataclasses.replace``)."""

    manifest: str = ""  # node path of the manifest we patched (symlinks resolved)
    config_hash: str = ""  # full sha256 of the config the scheduler should run with
    config_file: str = ""
    api_version: str = ""  # of that config
    files: tuple[str, ...] = ()  # host config files of the current config
    previous_files: tuple[str, ...] = ()  # kept for a rollback until the new one is confirmed
    written: tuple[str, ...] = ()  # every host config file we wrote that may still exist
    original_sha256: str = ""
    patched_sha256: str = ""
    manifest_mtime_ns: int = 0  # mtime after our last write
    phase: str = ""  # the lifecycle's phase (Pending, WaitingForRestart, Ready, ...)
    message: str | None = None  # why, in Failed and RolledBack
    restarted_at_ns: int | None = None  # when the scheduler was seen restarted onto config_hash
    source_hash: str = ""  # fingerprint of the source folder behind config_hash
    bad_hashes: tuple[str, ...] = ()  # configs that failed and must not be retried
    last_good: LastGood | None = None

    @property
    def patched(self) -> bool:
        return bool(self.patched_sha256)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": FORMAT_VERSION}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, LastGood):
                value = {**{g.name: getattr(value, g.name) for g in fields(value)}, "files": list(value.files)}
            out[f.name] = value
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> State:
        """Any version this code wrote: unknown keys are ignored, missing ones take their defaults."""
        extra_raw = raw.get("extra")
        extra: dict[str, Any] = extra_raw if isinstance(extra_raw, dict) else {}  # version 1
        known: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in raw:
                known[f.name] = raw[f.name]
            elif f.name in extra:
                known[f.name] = extra[f.name]
        for name in ("files", "previous_files", "written", "bad_hashes"):
            if name in known:
                known[name] = tuple(str(x) for x in known[name] or ())
        known["last_good"] = LastGood.from_json(known.get("last_good"))
        return cls(**known)

    def with_bad(self, config_hash: str) -> State:
        return self if config_hash in self.bad_hashes else replace(self, bad_hashes=(*self.bad_hashes, config_hash))


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
        if not isinstance(raw, dict):
            raise PatcherError(f"{self.shown}/{STATE_FILE}", "unreadable state record: not a JSON object")
        try:
            return State.from_json(raw)
        except (TypeError, ValueError) as exc:
            raise PatcherError(f"{self.shown}/{STATE_FILE}", f"unreadable state record: {exc}") from None

    def save(self, state: State) -> None:
        fsio.ensure_dir(self.folder, 0o700)
        data = json.dumps(state.to_json(), indent=2, sort_keys=True).encode() + b"\n"
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
