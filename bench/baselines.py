"""The two baselines our in-process figures are compared with, in the same run.

* naive: what most patchers do — ruamel.yaml round-trip load of the whole manifest, edit the data, dump the
  whole document, write it (temp file, fsync, rename). It loses bytes (that is why we do not do it), but it is
  the cost people expect;
* floor: read the manifest and write the same bytes back (temp file, fsync, rename, fsync of the folder):
  what any safe writer pays, whatever it computes.

Both are written here for the benchmark only; nothing in ``patcher`` imports them.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

VOLUME = "scheduler-patcher-config"
MARKER = "scheduler-patcher.io/patch"


def _rt() -> YAML:
    y = YAML(typ="rt")
    y.preserve_quotes = True
    y.width = 4096
    return y


def write_floor(path: Path, data: bytes) -> None:
    """temp file in the same folder, write, fsync, rename, fsync the folder."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def floor(path: Path) -> None:
    write_floor(path, path.read_bytes())


def _scheduler(doc: Any) -> tuple[Any, Any, str]:
    containers = doc["spec"]["containers"]
    container = next((c for c in containers if c.get("name") == "kube-scheduler"), containers[0])
    key = "args" if container.get("args") else "command"
    return container, container[key], key


def naive_patch(path: Path, config_dir: str, config_file: str, config_hash: str) -> None:
    """Round-trip load -> add --config, volume, mount, marker -> dump -> write."""
    y = _rt()
    doc = y.load(path.read_text())
    container, flags, _ = _scheduler(doc)
    flag = f"--config={config_dir}/{config_file}"
    for i, item in enumerate(flags):
        if isinstance(item, str) and item.startswith("--config="):
            flags[i] = flag
            break
    else:
        flags.append(flag)
    if doc["spec"].get("volumes") is None:
        doc["spec"]["volumes"] = []
    doc["spec"]["volumes"].append({"hostPath": {"path": config_dir, "type": "DirectoryOrCreate"}, "name": VOLUME})
    if container.get("volumeMounts") is None:
        container["volumeMounts"] = []
    container["volumeMounts"].append({"mountPath": config_dir, "name": VOLUME, "readOnly": True})
    meta = doc["metadata"]
    if meta.get("annotations") is None:
        meta["annotations"] = {}
    meta["annotations"][MARKER] = json.dumps({"hash": config_hash[:12], "flag": flag})
    out = io.StringIO()
    y.dump(doc, out)
    write_floor(path, out.getvalue().encode())


def naive_restore(path: Path) -> None:
    """Round-trip load -> remove what naive_patch added -> dump -> write."""
    y = _rt()
    doc = y.load(path.read_text())
    container, flags, _ = _scheduler(doc)
    for i, item in enumerate(flags):
        if isinstance(item, str) and item.startswith("--config="):
            del flags[i]
            break
    doc["spec"]["volumes"] = [v for v in doc["spec"].get("volumes") or [] if v.get("name") != VOLUME]
    container["volumeMounts"] = [m for m in container.get("volumeMounts") or [] if m.get("name") != VOLUME]
    (doc["metadata"].get("annotations") or {}).pop(MARKER, None)
    out = io.StringIO()
    y.dump(doc, out)
    write_floor(path, out.getvalue().encode())
