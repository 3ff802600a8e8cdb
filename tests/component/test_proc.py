"""The local restart check with real processes named kube-scheduler (and wrappers), plus its pure parsing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from patcher.adapters.proc import (
    CLOCK_TOLERANCE_S,
    LocalRestartTracker,
    SchedulerProcess,
    check_local,
    config_flag,
    find_schedulers,
    scheduler_args,
)
from tests.harness.emu.kubeemu import wait_until

CONFIG = "/etc/kubernetes/scheduler-patcher/config-0123456789ab.yaml"
SLEEP = "import time; time.sleep(60)"

Spawn = Callable[..., subprocess.Popen[bytes]]


@pytest.mark.parametrize(
    ("cmdline", "name", "expected"),
    [
        (["kube-scheduler", "--config=/a"], None, (("--config=/a",), None)),
        (["/usr/local/bin/kube-scheduler", "--v=2"], "kube-scheduler", (("--v=2",), None)),
        (["/bin/sh", "/opt/kube-scheduler", "--config", "/a"], "kube-scheduler",
         (("/opt/kube-scheduler", "--config", "/a"), None)),
        (["/go-runner", "--log-file=/x.log", "--", "/usr/local/bin/kube-scheduler", "--config=/a"], "go-runner",
         (("--config=/a",), "go-runner")),
        (["/hyperkube", "kube-scheduler", "--config=/a"], "hyperkube", (("--config=/a",), "hyperkube")),
        (["/hyperkube", "scheduler", "--config=/a"], "hyperkube", (("--config=/a",), "hyperkube")),
        (["/go-runner", "/usr/local/bin/kube-apiserver"], "go-runner", None),
        (["kube-scheduler-helper", "--config=/a"], "kube-schedule", None),
        ([], "kube-scheduler", None),
    ],
)
def test_scheduler_args(cmdline: list[str], name: str | None, expected: object) -> None:
    assert scheduler_args(cmdline, name) == expected


@pytest.mark.parametrize(
    ("args", "value"),
    [
        (["--config=/a.yaml"], "/a.yaml"),
        (["--v=2", "--config", "/b.yaml"], "/b.yaml"),
        (["-config=/c.yaml"], None),  # pflag reads -config as shorthands: not the --config flag
        (["--config=/a", "--config=/b"], "/b"),
        (["--kubeconfig=/etc/kubernetes/scheduler.conf"], None),
        (["--config"], None),
        (["--", "--config=/a"], None),
    ],
)
def test_config_flag(args: list[str], value: str | None) -> None:
    assert config_flag(args) == value


def fake(pid: int, started_at: float, config: str | None = CONFIG, wrapper: str | None = None) -> SchedulerProcess:
    return SchedulerProcess(pid, started_at - 1000.0, started_at, config, wrapper)


def test_clock_tolerance_is_one_tick() -> None:
    write_ns = 1_795_304_401_500_000_000
    written = write_ns / 1e9
    assert check_local(CONFIG, write_ns, [fake(1, written - CLOCK_TOLERANCE_S / 2)]).ready
    assert not check_local(CONFIG, write_ns, [fake(1, written - 3 * CLOCK_TOLERANCE_S)]).ready
    assert check_local(CONFIG, write_ns, [fake(1, written + 0.5)]).ready


def test_direct_process_is_preferred_over_its_wrapper() -> None:
    write_ns = 1_795_304_401_000_000_000
    wrapper = fake(1, 1_795_304_402.0, wrapper="go-runner")
    child = fake(2, 1_795_304_402.1, config="/other.yaml")
    check = check_local(CONFIG, write_ns, [wrapper, child])
    assert not check.ready and "--config=/other.yaml" in check.reason
    assert check_local(CONFIG, write_ns, [wrapper]).ready


def test_nothing_running() -> None:
    assert check_local(CONFIG, 0, []).reason == "no kube-scheduler process is running"


# --- real processes ---------------------------------------------------------------------------------


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """Start the Python interpreter under another name (a symlink), so the kernel names the process that."""
    procs: list[subprocess.Popen[bytes]] = []
    python = os.path.realpath(sys.executable)

    def start(name: str, *args: str, code: str = SLEEP) -> subprocess.Popen[bytes]:
        link = tmp_path / name
        if not link.exists():
            link.symlink_to(python)
        proc = subprocess.Popen([str(link), "-c", code, *args])
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def ours(procs: list[subprocess.Popen[bytes]]) -> list[SchedulerProcess]:
    pids = {p.pid for p in procs}
    return [p for p in find_schedulers() if p.pid in pids]


def visible(procs: list[subprocess.Popen[bytes]], count: int | None = None) -> bool:
    """True once every process shows its final command line (after exec) to psutil."""
    return wait_until(lambda: len(ours(procs)) == (count if count is not None else len(procs)), 5)


def test_a_scheduler_started_after_the_write_is_ready(spawn: Spawn) -> None:
    written = time.time_ns()
    proc = spawn("kube-scheduler", f"--config={CONFIG}", "--v=2")
    assert visible([proc])
    [found] = ours([proc])
    assert found.config == CONFIG and found.wrapper is None
    assert abs(found.started_at - psutil.Process(proc.pid).create_time()) < 1.1  # same clock, finer base
    assert written / 1e9 - CLOCK_TOLERANCE_S <= found.started_at <= time.time() + CLOCK_TOLERANCE_S
    check = check_local(CONFIG, written, ours([proc]))
    assert check.ready and check.process is not None and check.process.pid == proc.pid


def test_a_scheduler_started_before_the_write_is_not(spawn: Spawn) -> None:
    proc = spawn("kube-scheduler", "--config", CONFIG)  # the split form
    assert visible([proc])
    [found] = ours([proc])
    written = int((found.started_at + 0.1) * 1e9)  # our write, a tenth of a second after its start: no sleep
    check = check_local(CONFIG, written, [found])
    assert not check.ready and "before our write" in check.reason


def test_a_scheduler_with_another_config_is_not(spawn: Spawn) -> None:
    written = time.time_ns()
    proc = spawn("kube-scheduler", "--config=/etc/kubernetes/scheduler-patcher/config-ffffffffffff.yaml")
    assert visible([proc])
    check = check_local(CONFIG, written, ours([proc]))
    assert not check.ready and "config-ffffffffffff.yaml" in check.reason


def test_wrapped_scheduler_is_found(spawn: Spawn) -> None:
    written = time.time_ns()
    proc = spawn("go-runner", "--log-file=/dev/null", "/usr/local/bin/kube-scheduler", f"--config={CONFIG}")
    other = spawn("go-runner", "/usr/local/bin/kube-apiserver", f"--config={CONFIG}")
    assert visible([proc, other], count=1)
    [found] = ours([proc, other])
    assert found.pid == proc.pid and found.wrapper == "go-runner"
    assert check_local(CONFIG, written, [found]).ready


def test_zombies_are_skipped(spawn: Spawn) -> None:
    proc = spawn("kube-scheduler", f"--config={CONFIG}", code="pass")
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited but not reaped: a zombie
    assert psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE
    assert ours([proc]) == []


def test_tracker_counts_restarts_by_pid_and_start_time(spawn: Spawn) -> None:
    tracker = LocalRestartTracker(CONFIG, time.time_ns())
    first = spawn("kube-scheduler", f"--config={CONFIG}")
    assert visible([first])
    assert tracker.poll(ours([first])).starts == 1
    assert tracker.poll(ours([first])).starts == 1  # the same process seen again
    first.kill()
    first.wait()
    absent = tracker.poll(ours([first]))
    assert not absent.ready and absent.starts == 1
    second = spawn("kube-scheduler", f"--config={CONFIG}")
    assert visible([second])
    check = tracker.poll(ours([second]))
    assert check.ready and check.starts == 2
