"""Smoke test of a built image (``make image-test``): what a user and the DaemonSet rely on, run for real.

Checks, in order: the image's metadata (user 0 as the DaemonSet runs it, entrypoint ``scheduler-patcher`` with
``run`` as the command, the OCI labels version/revision/source/licenses against the project), ``--version``,
``run --help``, and a ``plan`` on ``examples/`` mounted read-only in a container run the way the DaemonSet runs
it (read-only root file system, every capability dropped, no new privileges, no network): exit 2, changes
pending, nothing written. Prints one line per check; exit 1 at the first that fails.

Usage: ``python tools/image_smoke.py --engine podman|docker --image NAME [--revision SHA]``
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: How the DaemonSet's container runs, as engine flags (manifests/base/daemonset.yaml's securityContext).
CONFINED = ["--read-only", "--cap-drop=ALL", "--security-opt=no-new-privileges", "--network=none"]


class SmokeError(Exception):
    """A check failed; the message says which and what was seen."""


def project() -> tuple[str, str, str]:
    """(version, license, source URL) as the project declares them."""
    found = re.search(r'^__version__ = "([^"]+)"$', (ROOT / "patcher/__init__.py").read_text(), re.M)
    assert found is not None
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return found.group(1), meta["license"], meta["urls"]["Source"]


def run(cmd: list[str], expect: int = 0) -> str:
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    took = time.monotonic() - started
    if proc.returncode != expect:
        raise SmokeError(f"{' '.join(cmd)}: exit {proc.returncode}, expected {expect}\n{proc.stdout}{proc.stderr}")
    print(f"ok   {' '.join(cmd[2:])}  (exit {proc.returncode}, {took:.1f} s)")
    return proc.stdout


def inspect(engine: str, image: str) -> dict[str, Any]:
    out = subprocess.run([engine, "image", "inspect", image], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SmokeError(f"{engine} image inspect {image}: {out.stderr.strip()} (build it first: make image)")
    found: list[dict[str, Any]] = json.loads(out.stdout)
    config: dict[str, Any] = found[0]["Config"]
    size = found[0].get("Size")
    if size:
        print(f"info image size {int(size) / 1e6:.0f} MB")
    return config


def check_metadata(config: dict[str, Any], revision: str | None) -> None:
    version, license_, source = project()
    labels = config.get("Labels") or {}
    want = {"org.opencontainers.image.version": version, "org.opencontainers.image.licenses": license_,
            "org.opencontainers.image.source": source}
    if revision:
        want["org.opencontainers.image.revision"] = revision
    for key, value in want.items():
        if labels.get(key) != value:
            raise SmokeError(f"label {key}: {labels.get(key)!r}, expected {value!r}")
    if not re.fullmatch(r"[0-9a-f]{40}", labels.get("org.opencontainers.image.revision", "")):
        raise SmokeError(f"label org.opencontainers.image.revision is not a commit: {labels!r}")
    shown = ", ".join(f"{key.rsplit('.', 1)[1]}={value}" for key, value in sorted(want.items()))
    print(f"ok   labels {shown}")
    # uid 0 as the DaemonSet runs it (root-owned manifest folder); see the Dockerfile's USER comment.
    if config.get("User") not in ("0", "0:0", "root"):
        raise SmokeError(f"user {config.get('User')!r}, expected 0 (the DaemonSet's runAsUser)")
    if config.get("Entrypoint") != ["scheduler-patcher"] or config.get("Cmd") != ["run"]:
        raise SmokeError(f"entrypoint {config.get('Entrypoint')!r} cmd {config.get('Cmd')!r}")
    print(f"ok   user {config['User']}, entrypoint {config['Entrypoint']}, cmd {config['Cmd']}")


def smoke(engine: str, image: str, revision: str | None) -> None:
    version = project()[0]
    check_metadata(inspect(engine, image), revision)
    out = run([engine, "run", "--rm", image, "--version"])
    if out.strip() != f"scheduler-patcher {version}":
        raise SmokeError(f"--version printed {out.strip()!r}, expected 'scheduler-patcher {version}'")
    out = run([engine, "run", "--rm", image, "run", "--help"])
    if "usage: scheduler-patcher run" not in out:
        raise SmokeError(f"run --help: no usage line in {out[:200]!r}")
    examples = ROOT / "examples"
    before = {p: p.read_bytes() for p in examples.rglob("*") if p.is_file()}
    out = run([engine, "run", "--rm", *CONFINED, "-v", f"{examples}:/ex:ro", image, "plan",
               "--manifest-dir", "/ex/manifests", "--source", "/ex/scheduler-config"], expect=2)
    if "+    - --config=/etc/kubernetes/scheduler-patcher/config-" not in out:
        raise SmokeError(f"plan: no --config line in the diff:\n{out}")
    if {p: p.read_bytes() for p in examples.rglob("*") if p.is_file()} != before:
        raise SmokeError("plan changed examples/")
    print("ok   plan printed the diff (exit 2: changes pending), examples/ unchanged")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", required=True)
    parser.add_argument("--image", required=True)
    parser.add_argument("--revision", help="the git commit the image must carry (default: any commit)")
    args = parser.parse_args(argv[1:])
    revision = args.revision if args.revision and args.revision != "unknown" else None
    try:
        smoke(args.engine, args.image, revision)
    except SmokeError as exc:
        print(f"FAIL {exc}", file=sys.stderr)
        return 1
    print(f"image-test: {args.image} passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
