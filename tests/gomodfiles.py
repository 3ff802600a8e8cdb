"""Files that public projects publish inside their Go modules (CRDs, mostly), fetched through the Go module proxy.

The proxy is the one registry here that carries, for example, cert-manager's CustomResourceDefinitions: `go mod
download` puts the module's whole tree, checksummed, in the module cache, and the tests read the files from there.
Pinned versions; nothing is copied into the repository.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path

#: cert-manager's CRDs: the webhook overlay's Issuer and Certificate need them on a real API server.
CERT_MANAGER = ("github.com/cert-manager/cert-manager", "v1.21.2")


@functools.cache
def module_dir(module: str, version: str) -> Path:
    """The unpacked module in the Go module cache (downloaded through the proxy on first use)."""
    if shutil.which("go") is None:
        raise FileNotFoundError(f"no `go` on PATH to download {module}@{version}")
    env = dict(os.environ, GOPROXY="https://proxy.golang.org", GOSUMDB="off", GOTOOLCHAIN="local", GOFLAGS="-mod=mod")
    proc = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], capture_output=True, text=True,
                          env=env, timeout=600, check=False)
    info = json.loads(proc.stdout or "{}")
    if proc.returncode != 0 or "Dir" not in info:
        raise FileNotFoundError(f"go mod download {module}@{version}: {info.get('Error') or proc.stderr.strip()}")
    return Path(info["Dir"])


def cert_manager_crds() -> list[Path]:
    return sorted((module_dir(*CERT_MANAGER) / "deploy" / "crds").glob("*.yaml"))
