"""What the kernel reports to this process through inotify, read from ``/proc/self/fdinfo``: a test sees which
folders a watcher watches, and for which events, from the kernel instead of from the watcher."""

from __future__ import annotations

import os
from pathlib import Path

IN_MODIFY = 0x2
IN_CREATE = 0x100


def inotify_masks() -> dict[int, int]:
    """The event mask of every inotify watch of this process, by inode (watches of one inode in several inotify
    instances together)."""
    masks: dict[int, int] = {}
    for fd in os.listdir("/proc/self/fdinfo"):
        try:
            text = Path("/proc/self/fdinfo", fd).read_text()
        except OSError:  # closed meanwhile (this listing's own descriptor, among others)
            continue
        for line in text.splitlines():
            if line.startswith("inotify "):
                fields = dict(f.split(":", 1) for f in line.split()[1:])
                ino = int(fields["ino"], 16)
                masks[ino] = masks.get(ino, 0) | int(fields["mask"], 16)
    return masks


def watched_for_content(folder: Path) -> bool:
    """The writes to the files of ``folder`` are reported: the folder itself is watched."""
    try:
        ino = folder.stat().st_ino
    except FileNotFoundError:
        return False
    return bool(inotify_masks().get(ino, 0) & IN_MODIFY)


def watched_for_return(folder: Path) -> bool:
    """``folder`` is gone, and its nearest existing ancestor is watched for a new entry: its return is seen."""
    ancestor = folder
    while not ancestor.exists():
        ancestor = ancestor.parent
    return ancestor != folder and bool(inotify_masks().get(ancestor.stat().st_ino, 0) & IN_CREATE)
