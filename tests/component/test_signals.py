"""Stop signals at the very start of the process ("Early SIGTERM" in docs/operator-contract.md).

The agent runs as PID 1 of its container. For PID 1 the kernel drops a signal whose disposition is the default
one, also when it comes from outside the container: a SIGTERM before ``signals.install`` is lost (the kubelet's
SIGKILL ends the process after the grace period). From ``install`` on it is recorded, and handed to the agent
when it subscribes, however long the start-up takes in between.
"""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from patcher.adapters import signals

CHILD = """
import sys
from patcher.adapters import signals
print("pid", __import__("os").getpid(), flush=True)
sys.stdin.readline()                      # a SIGTERM comes here, before any handler
print("alive", flush=True)
signals.install()
heard = []
signals.subscribe(heard.append)
print("installed", flush=True)
sys.stdin.readline()                      # a SIGTERM comes here, after the handler
print("received", heard[0] if heard else None, flush=True)
"""


@pytest.fixture
def handlers() -> Iterator[None]:
    """Put this process's handlers and the module's memory back after a test that installs its own."""
    before = {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS}
    importlib.reload(signals)  # no signal received, no listener
    yield
    importlib.reload(signals)
    for sig, handler in before.items():
        signal.signal(sig, handler)


def test_a_signal_after_install_and_before_anyone_listens_is_handed_to_the_first_listener(handlers: None) -> None:
    signals.install()
    os.kill(os.getpid(), signal.SIGTERM)  # the handler runs in this (main) thread before the next line
    heard: list[int] = []
    signals.subscribe(heard.append)  # the agent subscribes once it is built, possibly seconds later
    assert heard == [signal.SIGTERM]
    os.kill(os.getpid(), signal.SIGINT)
    assert heard == [signal.SIGTERM, signal.SIGINT]


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


@pytest.mark.skipif(shutil.which("unshare") is None or not Path("/proc/self/task").is_dir(),
                    reason="needs unshare(1) and /proc")
def test_as_pid_1_a_sigterm_before_the_handler_is_dropped_and_one_after_it_is_kept() -> None:
    unshare = [shutil.which("unshare") or "unshare", "--pid", "--fork", "--kill-child"]
    try:
        proc = subprocess.Popen([*unshare, sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"cannot start a PID namespace: {exc}")
    assert proc.stdin is not None and proc.stdout is not None
    try:
        first = proc.stdout.readline().split()
        if first != ["pid", "1"]:
            proc.kill()
            pytest.skip(f"unshare did not give a PID namespace here: {first}")
        (agent,) = _children(proc.pid)  # the interpreter, as this namespace sees it
        os.kill(agent, signal.SIGTERM)  # before the handler: the default disposition, dropped for PID 1
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "alive"
        assert proc.stdout.readline().strip() == "installed"
        os.kill(agent, signal.SIGTERM)
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == f"received {int(signal.SIGTERM)}"
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
