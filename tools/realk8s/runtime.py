"""`make real-k8s`, second step: the container runtime the real node's kubelet talks to (tests/realnode.py).

containerd and runc from the machine's Debian packages: the kubelets pinned here accept Debian 12's containerd
1.6 (its CRI v1 API) and run static pods on it. Installed with apt-get when missing and this runs as root on a
Debian-like system; otherwise it says what is missing and the real-node tests skip (or fail under CI=true).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

PACKAGES = {"containerd": "containerd", "ctr": "containerd", "runc": "runc"}


def missing() -> list[str]:
    return sorted({pkg for program, pkg in PACKAGES.items() if shutil.which(program) is None})


def main() -> int:
    packages = missing()
    if not packages:
        print("real node runtime: containerd and runc present", flush=True)
        return 0
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        print(f"real node runtime: {', '.join(packages)} missing and cannot be installed here (needs root and "
              "apt-get); the real_kubelet tests will skip", file=sys.stderr)
        return 0
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages], check=True, env=env)
    print(f"real node runtime: installed {', '.join(packages)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
