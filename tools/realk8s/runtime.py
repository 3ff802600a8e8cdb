"""`make real-k8s`, second step: the container runtime the real node's kubelet talks to
(tests/harness/real/kubelet_node.py).

containerd and runc from the machine's Debian packages: the kubelets pinned here accept Debian 12's containerd
1.6 (its CRI v1 API) and run static pods on it; and Debian's CNI plugins, of which the node uses `loopback`
only. Installed with apt-get when missing and this runs as root on a
Debian-like system; otherwise it says what is missing and the real-node tests skip (or fail under CI=true).

Also Debian's docker-registry and apache2-utils (its `htpasswd`): the local registry the kubeadm node pulls the
agent's image and chart from (tests/harness/real/registry.py).

Then podman and the local stand-in for the Dockerfile's base image, through `../shared/tools/offline-base-image.sh`
(no registry is reachable here): the real-node test that runs the agent as a pod builds the project's image with
them (tests/harness/real/agent_image.py). The script skips every step already done (~0.4 s then).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

#: haproxy: the API endpoint of the kubeadm cluster's three control-plane nodes (tests/harness/real/kubeadm_cluster.py);
#: docker-registry: the local registry the kubeadm node pulls the agent's image from (tests/harness/real/registry.py),
#: and apache2-utils for its bcrypt htpasswd (the only hash it accepts).
PACKAGES = {"containerd": "containerd", "ctr": "containerd", "runc": "runc", "haproxy": "haproxy",
            "docker-registry": "docker-registry", "htpasswd": "apache2-utils"}
#: The CNI loopback plugin: the node's only pod network (tests/harness/real/kubelet_node.py), so the runtime reports its
#: network ready and the kubelet its node Ready. Debian's package puts the plugins here, off PATH.
CNI_PLUGINS = {Path("/usr/lib/cni/loopback"): "containernetworking-plugins"}
OFFLINE_BASE = Path(__file__).resolve().parents[3] / "shared" / "tools" / "offline-base-image.sh"


def missing() -> list[str]:
    return sorted({pkg for program, pkg in PACKAGES.items() if shutil.which(program) is None}
                  | {pkg for path, pkg in CNI_PLUGINS.items() if not path.is_file()})


def image_tools() -> None:
    """podman and the base image's stand-in, for the agent's own image on the real node."""
    if not OFFLINE_BASE.is_file() or os.geteuid() != 0:
        why = f"no {OFFLINE_BASE}" if not OFFLINE_BASE.is_file() else "needs root"
        print(f"real node image tools: not installed ({why}); the agent-pod test will skip", file=sys.stderr)
        return
    subprocess.run(["sh", str(OFFLINE_BASE)], check=True)


def main() -> int:
    packages = missing()
    if not packages:
        print("real node runtime: containerd, runc and the CNI loopback plugin present", flush=True)
    elif os.geteuid() != 0 or shutil.which("apt-get") is None:
        print(f"real node runtime: {', '.join(packages)} missing and cannot be installed here (needs root and "
              "apt-get); the real_kubelet tests will skip", file=sys.stderr)
        return 0
    else:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages], check=True,
                       env=env)
        print(f"real node runtime: installed {', '.join(packages)}", flush=True)
        if "docker-registry" in packages and Path("/run/systemd/system").is_dir():
            # Debian enables and starts the package's service on :5000 of this machine; the tests run their own
            # registry in a node's network namespace only.
            subprocess.run(["systemctl", "disable", "--now", "docker-registry"], check=False)
    image_tools()
    return 0


if __name__ == "__main__":
    sys.exit(main())
