"""Runs a static pod's command as the kubelet would run it on a node, with the node played by a host-root folder.

A static pod names node paths (`--kubeconfig=/etc/kubernetes/scheduler.conf`, hostPath volumes, and inside the
rendered scheduler config more paths again). Rewriting them would test a command line nobody runs; instead the
command runs in a private mount namespace (`unshare --mount`) where each volumeMount's path is the host-root
folder's file bound there. A mount point that does not exist (no /etc/kubernetes on a laptop or CI runner) is made
inside the namespace only: its nearest existing ancestor is shadowed by a tmpfs holding bind mounts of every
original entry, so the host's file system is never written.

    python tests/harness/real/mountns.py SPEC.json   (run under `unshare --mount --propagation private`; see `command`)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def command(binds: list[tuple[Path, str, bool]], argv: list[str], shadow: Path) -> list[str]:
    """The argv that runs `argv` with each (host file, path, read-only) bound, `shadow` being a scratch folder."""
    spec = {"binds": [[str(src), dst, ro] for src, dst, ro in binds], "argv": argv, "shadow": str(shadow)}
    return ["unshare", "--mount", "--propagation", "private", sys.executable, str(Path(__file__).resolve()),
            json.dumps(spec)]


def pod_binds(pod: dict[str, Any], container: dict[str, Any], host_root: Path) -> list[tuple[Path, str, bool]]:
    """A container's hostPath volumeMounts as (host-root file, mount path, read-only)."""
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["spec"].get("volumes", []) if "hostPath" in v}
    return [(host_root / volumes[m["name"]].lstrip("/"), m["mountPath"], bool(m.get("readOnly")))
            for m in container.get("volumeMounts", []) if m["name"] in volumes]


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def _shadow(folder: Path, scratch: Path, skip: str = "") -> None:
    """Makes `folder` writable in this namespace only: a tmpfs over it, each original entry bound back (but
    `skip`, an entry of the wrong kind where a mount point must go)."""
    original = scratch / f"orig-{len(list(scratch.iterdir()))}"
    original.mkdir()
    _mount("--bind", str(folder), str(original))
    _mount("-t", "tmpfs", "tmpfs", str(folder))
    for entry in os.scandir(original):
        if entry.name == skip:
            continue
        target = folder / entry.name
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
            continue
        if entry.is_dir():
            target.mkdir()
            _mount("--rbind", entry.path, str(target))
        else:
            target.touch()
            _mount("--bind", entry.path, str(target))


def _mount_point(path: Path, is_dir: bool, scratch: Path, ours: set[Path]) -> None:
    """Makes `path` exist in this namespace; `ours` holds the folders already on a tmpfs of this namespace."""
    skip = ""
    if path.exists():
        if path.is_dir() == is_dir:
            return
        skip = path.name  # a folder where the node has a file, or the reverse: hidden, and made anew
    ancestor = path.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if ancestor not in ours or skip:
        if ancestor == Path("/"):
            raise SystemExit(f"mountns: will not shadow / to make {path}")
        _shadow(ancestor, scratch, skip)
        ours.add(ancestor)
    for folder in reversed(path.parents):
        if not folder.exists():
            folder.mkdir()
            ours.add(folder)
    if is_dir:
        path.mkdir()
    else:
        path.touch()


def main(spec: dict[str, Any]) -> None:
    scratch = Path(spec["shadow"])
    scratch.mkdir(parents=True, exist_ok=True)
    ours: set[Path] = set()
    for src, dst, read_only in sorted(spec["binds"], key=lambda b: b[1].count("/")):
        source = Path(src)
        _mount_point(Path(dst), source.is_dir(), scratch, ours)
        _mount("--bind", str(source), dst)
        if read_only:
            _mount("-o", "remount,bind,ro", dst)
    argv: list[str] = spec["argv"]
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
