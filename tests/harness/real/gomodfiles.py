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
import tempfile
from pathlib import Path

#: cert-manager's CRDs: the webhook overlay's Issuer and Certificate need them on a real API server. The h1: hash
#: is go.sum's for that version, checked here because the checksum database is not reachable (GOSUMDB=off).
CERT_MANAGER = ("github.com/cert-manager/cert-manager", "v1.21.2", "h1:UWgoYM+KLNtRlqmoWOKjKBOBUPVHeepQ6/ac3ERJW68=")


def find_go() -> str | None:
    return shutil.which("go") or next((p for p in ("/usr/local/go/bin/go",) if os.access(p, os.X_OK)), None)


@functools.cache
def module_dir(module: str, version: str, h1: str) -> tuple[Path | None, str]:
    """(the unpacked module in the Go module cache, "") or (None, why not): downloaded through the proxy on first
    use, and refused unless its hash is the pinned `h1`."""
    go = find_go()
    if go is None:
        return None, f"no `go` to download {module}@{version} from the Go module proxy"
    env = {**os.environ, "GOPROXY": os.environ.get("GOPROXY") or "https://proxy.golang.org", "GOSUMDB": "off",
           "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local", "GO111MODULE": "on"}
    with tempfile.TemporaryDirectory() as outside_any_module:
        proc = subprocess.run([go, "mod", "download", "-json", f"{module}@{version}"], capture_output=True,
                              text=True, timeout=600, check=False, env=env, cwd=outside_any_module)
    try:
        info: dict[str, str] = json.loads(proc.stdout)
    except ValueError:
        info = {}
    if proc.returncode != 0 or "Dir" not in info:
        why = info.get("Error") or (proc.stderr.strip().splitlines() or ["failed"])[-1]
        return None, f"go mod download {module}@{version}: {why}"
    if info.get("Sum") != h1:
        return None, f"{module}@{version}: hash {info.get('Sum')} is not the pinned {h1}"
    return Path(info["Dir"]), ""


def cert_manager_crds() -> list[Path]:
    folder, why = module_dir(*CERT_MANAGER)
    assert folder is not None, why
    return sorted((folder / "deploy" / "crds").glob("*.yaml"))
