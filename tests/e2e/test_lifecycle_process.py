"""Process-level faults: stop signals at any moment of the start-up, SIGKILL of writers at random moments.

Real ``scheduler-patcher`` processes on a tmp_path node. The tests wait for what the child process shows (its
signal disposition in /proc, its log lines), never for a fixed delay.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from patcher.core.settings import Files
from patcher.services import nodefiles
from tests.harness.childproc import ROOT, Child
from tests.harness.emu.kubeemu import KubeEmulator, wait_until
from tests.harness.emu.kubeletsim import SimKubelet
from tests.harness.helpers import KUBEADM, MANIFEST, NODE, node_folders


def catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler installed for ``sig`` (SigCgt in /proc/<pid>/status)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(int(line.split()[1], 16) for line in text.splitlines() if line.startswith("SigCgt:"))
    return bool(caught & (1 << (sig - 1)))


def patched_node(tmp_path: Path) -> tuple[Path, Path]:
    """A node whose manifest an earlier agent patched (and then died without restoring)."""
    root, src = node_folders(tmp_path)
    opts = Files(source=src, host_root=root)
    nodefiles.apply(opts, nodefiles.plan_apply(opts))
    assert b"--config=" in (root / MANIFEST).read_bytes()
    return root, src


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
@pytest.mark.parametrize("delay", [0.0, 0.4, 1.5, 3.0])
def test_sigterm_at_any_moment_of_the_start_restores_what_an_earlier_agent_patched(
        tmp_path: Path, delay: float) -> None:
    root, src = patched_node(tmp_path)
    with KubeEmulator() as emu:
        emu.add_node(NODE)
        kubelet = SimKubelet(emu, NODE, root).start()
        try:
            child = Child("run", "--host-root", str(root), "--source", str(src), "--listen", "127.0.0.1:0",
                          "--check-extenders=false",
                          env={"NODE_NAME": NODE, "KUBECONFIG": str(emu.write_kubeconfig(tmp_path / "kc"))})
            # From the moment the handler is in, any signal must be honoured: wait for that moment, then let
            # the start-up go on for ``delay`` (imports, API client, mirror-pod sync, first reconcile...).
            assert wait_until(lambda: catches(child.proc.pid, signal.SIGTERM) or child.proc.poll() is not None,
                              60, interval=0.001)
            time.sleep(delay)  # where in the start-up the signal lands; every outcome must pass the asserts
            assert child.terminate() == 0, child.output
        finally:
            kubelet.stop()
    assert (root / MANIFEST).read_bytes() == KUBEADM, child.output
    assert kubelet.stray_files == []
    assert not [p for p in os.listdir(root / "etc/kubernetes/manifests") if p != "kube-scheduler.yaml"]


ENTRY_PROBE = """
import signal, sys, types
stub = types.ModuleType("patcher.commands.cli")  # stands in for the heavy command line: report what is loaded by then
def main():
    from patcher.adapters import signals
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("kubernetes", "ruamel", "urllib3", "yaml")
                   or m in ("patcher.services.nodefiles", "patcher.services.runner"))
    print(signal.getsignal(signal.SIGTERM) is signals._handler, heavy)
    return 0
stub.main = main
sys.modules["patcher.commands.cli"] = stub
sys.argv = ["scheduler-patcher", *sys.argv[1:]]
from patcher.commands import entry
raise SystemExit(entry.main())
"""


def _probe(*argv: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", ENTRY_PROBE, *argv], env=env, capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def test_the_entry_point_catches_stop_signals_before_any_heavy_import() -> None:
    """exec -> signal-safe must not wait for ruamel, ``nodefiles`` or the Kubernetes client (~0.4-2 s)."""
    assert _probe("run", "--no-api") == "True []"


def test_a_one_shot_command_keeps_the_default_signal_disposition() -> None:
    """``apply`` killed by SIGTERM dies at once (its writes are atomic); only the agent restores on exit."""
    assert _probe("apply", "--source", "run") == "False []"


STUCK_WRITER_PROBE = """
import fcntl, struct, sys, termios, threading, time, types
stub = types.ModuleType("patcher.commands.cli")  # the agent's run, done; a daemon thread still inside a write
def main():
    threading.Thread(target=lambda: sys.stderr.write("x" * (4 << 20)), daemon=True).start()
    full = fcntl.fcntl(2, 1032)  # F_GETPIPE_SZ: the thread is blocked in its write, holding stderr's lock
    while struct.unpack("i", fcntl.ioctl(2, termios.FIONREAD, bytes(4)))[0] < full:
        time.sleep(0.001)
    print("stderr full", flush=True)
    return 0
stub.main = main
sys.modules["patcher.commands.cli"] = stub
sys.argv = ["scheduler-patcher", *sys.argv[1:]]
from patcher.commands import entry
raise SystemExit(entry.main())
"""


def test_run_ends_with_its_own_exit_code_while_a_daemon_thread_holds_stderr() -> None:
    """The flake of the SIGTERM test (exit -6 after a successful restore): CPython's shutdown aborts when a
    daemon thread is inside a C call that holds a lock the shutdown needs, e.g. stderr's. Made deterministic
    here: the thread is blocked in a write to a full pipe. Before ``entry.exit_now`` the interpreter's shutdown
    waited on that lock (and aborted, or hung writing its fatal error to the same pipe); now ``run`` ends with
    its own code, its flush bounded."""
    # Buffered stderr (the interpreter's default; PYTHONUNBUFFERED, set where the suite runs, has no lock).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", STUCK_WRITER_PROBE, "run"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # stderr never read: the pipe stays full
    try:
        assert proc.wait(timeout=60) == 0
        assert proc.stdout is not None and proc.stdout.read() == b"stderr full\n"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
