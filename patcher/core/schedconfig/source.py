"""The source folder: a ConfigMap mount, read safely, and which of the three source forms it holds.

A ConfigMap volume is a folder of symlinks (``extenders.yaml -> ..data/extenders.yaml``) the kubelet swaps
atomically. We follow them only inside the folder: a link leading elsewhere would let whoever writes the
ConfigMap (or the node's filesystem) make us copy an arbitrary file into the scheduler's config.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from patcher.core import fileread
from patcher.core.errors import ConfigError

EXTENDERS_FILE = "extenders.yaml"
CONFIG_FILE = "config.yaml"
POLICY_FILE = "policy.yaml"
CSI_CONFIGS = ("config-19.yaml", "config-23.yaml", "config-29.yaml")
KNOWN_FILES = (EXTENDERS_FILE, CONFIG_FILE, POLICY_FILE, *CSI_CONFIGS)

FORM_EXTENDERS = "extenders.yaml"
FORM_CONFIG = "config.yaml"
FORM_CSI = "csi-baremetal-operator"

# A ConfigMap holds up to 1 MiB, but the largest real scheduler config we know is under 20 KiB: a quarter of a
# MiB bounds what one source file can cost the agent (read, event scan) long before the node-count limit.
MAX_SOURCE_BYTES = 256 * 1024


@dataclass(frozen=True)
class SourceFile:
    """One file of the source folder: its name (used in headers), the path we read, and its text."""

    name: str
    path: str
    text: str


@dataclass(frozen=True)
class SourceForm:
    """What the folder holds: the form, the known files present, and any other entries we ignore."""

    form: str
    present: frozenset[str]
    ignored: tuple[str, ...]


def _folder(source_dir: Path) -> str:
    try:
        info = os.stat(source_dir)
    except FileNotFoundError:
        raise ConfigError(str(source_dir), "source folder not found") from None
    except OSError as exc:
        raise ConfigError(str(source_dir), f"cannot read source folder: {exc.strerror}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(str(source_dir), "source is not a folder")
    return os.path.realpath(source_dir)


def read_source_file(source_dir: Path, name: str) -> SourceFile:
    """Read one file of the source folder, following symlinks only while they stay inside the folder."""
    if not name or "/" in name or "\\" in name or "\0" in name or ".." in name or name.startswith("."):
        raise ConfigError(str(source_dir / name), f"refusing source file name {name!r}: not a plain file name")
    root = _folder(source_dir)
    path = source_dir / name
    shown = str(path)
    if not os.path.lexists(path):
        raise ConfigError(shown, "source file not found")
    target = os.path.realpath(path)
    if os.path.commonpath([root, target]) != root:
        raise ConfigError(shown, f"refusing a link that points outside the source folder (to {target})")
    try:
        info = os.stat(target)
    except FileNotFoundError:
        raise ConfigError(shown, f"dangling link (to {target})") from None
    except OSError as exc:
        raise ConfigError(shown, f"cannot read: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(shown, f"not a regular file ({fileread.kind(info.st_mode)})")
    try:  # the one reader: fstat of what is opened (the link may have changed since), bounded, non-blocking
        raw = fileread.read_file(target, "source file", shown, limit=MAX_SOURCE_BYTES, error=ConfigError)
    except fileread.TooLarge as exc:  # the fstat's size, or it grew past the limit while read
        size = f"{exc.size} bytes" if exc.size is not None else f"over {MAX_SOURCE_BYTES} bytes"
        raise ConfigError(shown, f"too large ({size}; the limit for a source file is {MAX_SOURCE_BYTES})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(shown, "not UTF-8") from None
    return SourceFile(name=name, path=shown, text=text.removeprefix("\ufeff"))


def detect_form(source_dir: Path) -> SourceForm:
    """Which source form the folder holds; conflicting forms or no form at all are refused."""
    root = _folder(source_dir)
    try:
        entries = sorted(os.listdir(root))
    except OSError as exc:
        raise ConfigError(str(source_dir), f"cannot list source folder: {exc.strerror}") from None
    visible = [name for name in entries if not name.startswith(".")]  # ..data, ..2024_… are the mount's own
    present = frozenset(name for name in visible if name in KNOWN_FILES)
    ignored = tuple(name for name in visible if name not in KNOWN_FILES)
    if EXTENDERS_FILE in present:
        others = sorted(present - {EXTENDERS_FILE})
        if others:
            raise ConfigError(
                str(source_dir),
                f"conflicting source forms: {EXTENDERS_FILE} and {', '.join(others)}; keep either extenders.yaml "
                "(recommended), a single config.yaml, or the csi-baremetal-operator layout",
            )
        return SourceForm(FORM_EXTENDERS, present, ignored)
    if present & {POLICY_FILE, *CSI_CONFIGS}:
        return SourceForm(FORM_CSI, present, ignored)
    if CONFIG_FILE in present:
        return SourceForm(FORM_CONFIG, present, ignored)
    found = ", ".join(visible) if visible else "nothing"
    raise ConfigError(
        str(source_dir),
        f"no source config: expected {EXTENDERS_FILE}, {CONFIG_FILE}, or the csi-baremetal-operator layout "
        f"({POLICY_FILE}, {CONFIG_FILE}, {', '.join(CSI_CONFIGS)}); found {found}",
    )


def csi_pick(minor: int) -> str:
    """The file the csi-baremetal-operator's patcher uses for a Kubernetes minor version (its config.yaml and
    policy.yaml are for 1.18 and older)."""
    if minor <= 22:
        return "config-19.yaml"
    if minor <= 28:
        return "config-23.yaml"
    return "config-29.yaml"
