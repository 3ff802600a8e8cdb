"""The project's own image for the real node: built with podman from the unmodified Dockerfile, never
pulled, and imported into the node's containerd.

No registry is reachable here, so the Dockerfile's base (`python:3.11-slim`, pinned by digest) is the local
stand-in that `../shared/tools/offline-base-image.sh` builds with mmdebstrap (`make real-k8s` runs it, as root,
idempotent: ~0.4 s once done). The image is tagged with a hash of what goes into it (the Dockerfile and every
file its COPY lines take: pyproject.toml, README.md, LICENSE, patcher/), so a test builds it only when the
inputs changed; `podman save` writes it once as an archive into the real-k8s cache, which each node's fresh
containerd imports (`ctr images import`, the CRI plugin's namespace).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.harness.real.controlplane import ROOT
from tools.realk8s.build import cache_root

REPOSITORY = "localhost/scheduler-patcher"
#: The stand-in offline-base-image.sh imports as the Dockerfile's FROM (a digest-pinned base cannot be local).
BASE = "docker.io/library/python:3.11-slim"
PIP_CONF = Path("/etc/containers/pip-build.conf")
BUILD_TIMEOUT = 900


def inputs() -> list[Path]:
    """What the Dockerfile's COPY lines take, and the Dockerfile: the image changes only when one of these does."""
    files = [ROOT / "Dockerfile", ROOT / "pyproject.toml", ROOT / "README.md", ROOT / "LICENSE"]
    files += sorted(p for p in (ROOT / "patcher").rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    return files


def inputs_hash() -> str:
    h = hashlib.sha256()
    for path in inputs():
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def podman_missing() -> str | None:
    """One line on why the image cannot be built here, or None."""
    if shutil.which("podman") is None:
        return "no podman on PATH: `make real-k8s` installs it (../shared/tools/offline-base-image.sh, as root)"
    proc = subprocess.run(["podman", "image", "exists", BASE], capture_output=True, timeout=60, check=False)
    if proc.returncode != 0:
        return (f"podman has no {BASE}: `make real-k8s` builds the offline stand-in "
                "(../shared/tools/offline-base-image.sh)")
    return None


@dataclass(frozen=True)
class AgentImage:
    name: str
    archive: Path
    built_in: float  # seconds this call spent building; 0 when podman had it
    saved_in: float  # seconds spent on `podman save`; 0 when the archive was cached
    size: int  # the archive's bytes (uncompressed layers)


def _podman(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"podman {' '.join(args[:3])}: {proc.stderr[-3000:]}"
    return proc


def agent_image() -> AgentImage:
    """The image of this checkout, built and saved when missing. Call it holding the real-test lock."""
    key = inputs_hash()
    name = f"{REPOSITORY}:inputs-{key}"
    built_in = saved_in = 0.0
    if subprocess.run(["podman", "image", "exists", name], capture_output=True, timeout=60, check=False).returncode:
        started = time.monotonic()
        volume = ["-v", f"{PIP_CONF}:/etc/pip.conf:ro"] if PIP_CONF.is_file() else []
        revision = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                  check=False).stdout.strip() or "unknown"
        _podman("build", "--pull=never", *volume, "--build-arg", f"PYTHON_IMAGE={BASE}",
                "--build-arg", f"REVISION={revision}", "-t", name, str(ROOT), timeout=BUILD_TIMEOUT)
        built_in = time.monotonic() - started
    folder = cache_root() / "agent-image"
    archive = folder / f"{key}.tar"
    if not archive.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.tar"):  # one image at a time: each is ~300 MB
            old.unlink()
        started = time.monotonic()
        tmp = folder / f".{key}.tar.tmp"
        tmp.unlink(missing_ok=True)
        _podman("save", "--format", "docker-archive", "-o", str(tmp), name)
        os.replace(tmp, archive)
        saved_in = time.monotonic() - started
    return AgentImage(name, archive, built_in, saved_in, archive.stat().st_size)
