"""The agent's record on the node, as a value: what it wrote, what it is waiting for, what last worked.

Pure: the typed, frozen record and its versioned (de)serialisation to bytes. Where the bytes live (the state
folder, never the kubelet's manifest folder) and how they are written is ``patcher.services.record``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

#: On-disk format. 1 (no ``version`` key): message, restart time and source hash kept in a free ``extra`` dict.
#: 2: every field typed at the top level. Version 1 records are read (and written as 2 on the next save).
#: ``last_good`` holds the keys of ``LastGood`` in both (``api_version`` only since 2; missing keys read empty).
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
        texts = {f.name: str(raw.get(f.name) or "") for f in fields(cls) if f.name != "files"}
        return cls(**texts, files=tuple(str(f) for f in raw.get("files") or ()))


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
    #: The pre-flight's last word on ignorable extenders that did not answer (the config was written anyway):
    #: shown by ``status``; empty once they all answer.
    extender_warning: str = ""

    @property
    def patched(self) -> bool:
        return bool(self.patched_sha256)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> State:
        """Any version this code wrote: unknown keys are ignored, missing ones take their defaults."""
        extra = raw.get("extra")
        merged = {**(extra if isinstance(extra, dict) else {}), **raw}  # version 1: some fields in ``extra``
        known = {f.name: merged[f.name] for f in fields(cls) if f.name in merged}
        for name in ("files", "previous_files", "written", "bad_hashes"):
            if name in known:
                known[name] = tuple(str(x) for x in known[name] or ())
        known["last_good"] = LastGood.from_json(known.get("last_good"))
        return cls(**known)

    def with_bad(self, config_hash: str) -> State:
        return self if config_hash in self.bad_hashes else replace(self, bad_hashes=(*self.bad_hashes, config_hash))


def encode(state: State) -> bytes:
    """The record as the bytes of ``state.json``: sorted keys, so two saves of one value are identical."""
    return json.dumps({"version": FORMAT_VERSION, **asdict(state)}, indent=2, sort_keys=True).encode() + b"\n"


def decode(data: bytes) -> State:
    """The record in ``data``; ``ValueError`` (one line, no path: the caller names the file) when it is not one."""
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    try:
        return State.from_json(raw)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
