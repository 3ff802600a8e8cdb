"""The release's own kube-scheduler as a static pod's container, for the simulated kubelet's ``process``.

tests/harness/emu/kubeletsim.py decides when a static pod (re)starts and publishes its mirror pod; with this as its
``process`` the scheduler container is the real kube-scheduler of `make real-k8s`, started from the manifest's
command line, which decides for itself whether it starts (no "reject-me" rule). A static pod names node paths
(`--kubeconfig=/etc/kubernetes/scheduler.conf`, hostPath volumes): the command runs in a private mount namespace
where each hostPath volumeMount is the node folder's file bound at its path (tests/harness/real/mountns.py).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness.real.controlplane import Binaries, die_with_parent, terminate
from tests.harness.real.mountns import command, pod_binds


@dataclass
class SchedulerProcess:
    binaries: Binaries
    scratch: Path  #: the process's log and the mount namespace's scratch folder
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.scratch / "kube-scheduler.log"

    def tail(self) -> str:
        """The end of the scheduler's log, without the line it repeats every few seconds."""
        text = self.log.read_text(errors="replace") if self.log.is_file() else ""
        return "\n".join(line for line in text.splitlines() if "configmap_cafile" not in line)[-4000:]

    def start(self, pod: dict[str, Any], container: dict[str, Any], host_root: Path) -> None:
        """Stops the process running (a new pod replaces the old one), then starts the container's command."""
        self.stop()
        argv = [*container.get("command", []), *container.get("args", [])]
        assert argv and argv[0] == "kube-scheduler", argv
        binds = pod_binds(pod, container, host_root)
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(
                command(binds, [str(self.binaries.path("kube-scheduler")), *argv[1:]], self.scratch / "shadow"),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)

    def exit_code(self) -> int | None:
        """None while the process runs; its exit code once it ended (or -1 before any start)."""
        return -1 if self._proc is None else self._proc.poll()

    def stop(self) -> None:
        terminate(self._proc)
        self._proc = None
