"""The restart watch's settle time (issue 34): both checks, the mirror pod and the local process table, say
Ready only once the scheduler they see has run ``--restart-settle`` without a restart, and the watch names the
moment to look again (the loop's timeout), since nothing else may wake the agent then. Clocks and the process
table are injected: no real time passes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from patcher.adapters.proc import SchedulerProcess
from patcher.core import lifecycle
from patcher.core.restart import Verdict
from patcher.core.settings import Files
from patcher.services.restartwatch import RestartWatch
from tests.kubeemu import make_mirror_pod

NS = 1_000_000_000
HASH = "0123456789ab" + "cd" * 26
WRITE_S = 1795304401
CONFIG = "/etc/kubernetes/scheduler-patcher/scheduler-config-0123456789ab.yaml"


def stamp(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def mirror(started_s: int, restarts: int = 0) -> dict[str, Any]:
    marker = {"scheduler-patcher.io/patch": json.dumps({"hash": HASH[:12]})}
    pod = make_mirror_pod(node_name="cp-1", annotations=marker, started_at=stamp(started_s), restart_count=restarts)
    pod["metadata"]["uid"] = "uid-1"
    return pod


@dataclass
class Pods:
    pod: dict[str, Any] | None
    fresh: bool = True

    def latest(self) -> dict[str, Any] | None:
        return self.pod


class Clock:
    """Wall and monotonic time, moved by the test."""

    def __init__(self, wall_s: float) -> None:
        self.wall = round(wall_s * NS)
        self.mono = 100.0

    def advance(self, seconds: float) -> None:
        self.wall += round(seconds * NS)
        self.mono += seconds


def process(pid: int, started_at: float) -> SchedulerProcess:
    return SchedulerProcess(pid=pid, started_since_boot=started_at - 1e9, started_at=started_at,
                            cmdline=("kube-scheduler", f"--config={CONFIG}"), config=CONFIG)


def watch(clock: Clock, *, local: bool, procs: list[SchedulerProcess] | None = None,
          settle: float = 10.0) -> RestartWatch:
    rw = RestartWatch(Files(), local_check=local, crash_restarts=2, settle=settle,
                      wall_ns=lambda: clock.wall, monotonic=lambda: clock.mono, scan=lambda: list(procs or []))
    rw.start(WAIT, "scheduler-config-0123456789ab.yaml", pod_now=None, pod_before=None)
    return rw


WAIT = lifecycle.Wait(HASH, WRITE_S * NS + 500_000_000, deadline=1e9)


def test_the_mirror_pod_is_ready_once_the_same_container_has_run_the_settle_time() -> None:
    clock = Clock(WRITE_S + 3.2)
    rw = watch(clock, local=False)
    pods = Pods(mirror(WRITE_S + 2))
    seen = rw.observe(WAIT, pods)
    assert seen.verdict is Verdict.WAITING and "without a restart" in seen.reason
    # The look again: the end of its startedAt second plus the settle time, on the monotonic clock.
    assert rw.recheck_at is not None and abs(rw.recheck_at - (clock.mono + (WRITE_S + 13 - (WRITE_S + 3.2)))) < 1e-6
    clock.advance(rw.recheck_at - clock.mono)
    seen = rw.observe(WAIT, pods)
    assert seen.verdict is Verdict.READY and rw.recheck_at is None
    assert seen.wall_ns == clock.wall and seen.now == clock.mono


def test_a_restart_within_the_settle_time_starts_it_again_and_the_second_is_a_crash_loop() -> None:
    clock = Clock(WRITE_S + 3)
    rw = watch(clock, local=False)
    pods = Pods(mirror(WRITE_S + 2))
    first = rw.observe(WAIT, pods).verdict
    clock.advance(2)
    pods.pod = mirror(WRITE_S + 4, restarts=1)  # it exited and the kubelet started it again
    second = rw.observe(WAIT, pods)
    assert rw.recheck_at is not None and abs(rw.recheck_at - (clock.mono + 10)) < 1e-6
    clock.advance(1)
    pods.pod = mirror(WRITE_S + 5, restarts=2)
    assert (first, second.verdict, rw.observe(WAIT, pods).verdict) == (Verdict.WAITING, Verdict.WAITING,
                                                                         Verdict.CRASH_LOOPING)


def test_the_local_process_settles_on_its_own_start_time() -> None:
    """The process table has the start to the tick: no whole-second rounding there. A new pid is a new start."""
    clock = Clock(WRITE_S + 2)
    procs = [process(4242, WRITE_S + 1.5)]
    rw = watch(clock, local=True, procs=procs)
    seen = rw.observe(WAIT, None)
    assert seen.verdict is Verdict.WAITING and "local process" in seen.reason
    assert rw.recheck_at is not None and abs(rw.recheck_at - (clock.mono + 9.5)) < 1e-6
    clock.advance(9.5)
    assert rw.observe(WAIT, None).verdict is Verdict.READY
    procs[0] = process(4243, WRITE_S + 11.4)  # another start: settles again
    assert rw.observe(WAIT, None).verdict is Verdict.WAITING


def test_with_both_checks_the_later_settle_names_the_look_again_until_one_is_ready() -> None:
    clock = Clock(WRITE_S + 2.5)
    rw = watch(clock, local=True, procs=[process(7, WRITE_S + 1.9)])
    seen = rw.observe(WAIT, Pods(mirror(WRITE_S + 1)))
    # The pod settles at WRITE_S + 12, the process at WRITE_S + 11.9: the first of them is the next look.
    assert seen.verdict is Verdict.WAITING and rw.recheck_at is not None
    assert abs(rw.recheck_at - (clock.mono + 9.4)) < 1e-6
    clock.advance(9.4)
    assert rw.observe(WAIT, Pods(mirror(WRITE_S + 1))).verdict is Verdict.READY  # the process proves it
    rw.forget()
    assert rw.recheck_at is None


def test_no_settle_time_is_ready_at_the_first_look() -> None:
    clock = Clock(WRITE_S + 2.1)
    rw = watch(clock, local=False, settle=0.0)
    assert rw.observe(WAIT, Pods(mirror(WRITE_S + 2))).verdict is Verdict.READY and rw.recheck_at is None
