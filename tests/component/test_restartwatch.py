"""The restart watch's settle time: both checks, the mirror pod and the local process table, say
Ready only once the scheduler they see has run ``--restart-settle`` without a restart, and the watch names the
moment to look again (the loop's timeout), since nothing else may wake the agent then. Clocks and the process
table are injected: no real time passes."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from patcher.adapters.proc import SchedulerProcess
from patcher.core import lifecycle
from patcher.core.restart import Verdict
from patcher.core.settings import Files, Lifecycle
from patcher.core.state import State
from patcher.core.status import NodeState
from patcher.services.ports import NoPods
from patcher.services.restartwatch import RestartWatch
from tests.harness.emu.kubeemu import make_mirror_pod

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
    pod_name: str = "kube-scheduler-cp-1"

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
    return SchedulerProcess(pid=pid, started_since_boot=started_at - 1e9, started_at=started_at, config=CONFIG)


def watch(clock: Clock, *, local: bool, procs: list[SchedulerProcess] | None = None,
          settle: float = 10.0) -> RestartWatch:
    rw = RestartWatch(Files(), local_check=local, crash_restarts=2, settle=settle,
                      wall_ns=lambda: clock.wall, monotonic=lambda: clock.mono, scan=lambda: list(procs or []))
    rw.start(WAIT, "scheduler-config-0123456789ab.yaml", pod=None)
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
    seen = rw.observe(WAIT, NoPods())
    assert seen.verdict is Verdict.WAITING and "local process" in seen.reason
    assert rw.recheck_at is not None and abs(rw.recheck_at - (clock.mono + 9.5)) < 1e-6
    clock.advance(9.5)
    assert rw.observe(WAIT, NoPods()).verdict is Verdict.READY
    procs[0] = process(4243, WRITE_S + 11.4)  # another start: settles again
    assert rw.observe(WAIT, NoPods()).verdict is Verdict.WAITING


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


# --- found in review: a stale view, a restart only the process table saw, a late start near the deadline -----

def test_a_stale_pod_view_cannot_prove_the_settle() -> None:
    """The watch broke right after the container started; a refused scheduler exits a second later, which the
    stale view does not show: still "running and Ready since" its start. It proves nothing about the settle."""
    clock = Clock(WRITE_S + 3.2)
    rw = watch(clock, local=False)
    pods = Pods(mirror(WRITE_S + 2), fresh=False)
    assert rw.observe(WAIT, pods).verdict is Verdict.WAITING
    clock.advance(10)
    seen = rw.observe(WAIT, pods)
    assert seen.verdict is Verdict.WAITING and "does not follow the API server" in seen.reason and seen.blind
    pods.fresh = True  # the watch is back and shows the same container: it did run the settle time
    assert rw.observe(WAIT, pods).verdict is Verdict.READY


def test_a_restart_the_process_table_saw_overrules_the_pod_views_ready() -> None:
    """--local-check: the pod shows the container started at WRITE_S+2, the process table a scheduler started at
    WRITE_S+11.5 (the first died within the settle; the kubelet started another), fresh view or not."""
    for fresh in (True, False):
        clock = Clock(WRITE_S + 2.2)
        procs = [process(100, WRITE_S + 2.1)]
        rw = watch(clock, local=True, procs=procs)
        pods = Pods(mirror(WRITE_S + 2), fresh=fresh)
        assert rw.observe(WAIT, pods).verdict is Verdict.WAITING
        procs[:] = [process(101, WRITE_S + 11.5)]
        clock.advance(10.9)  # WRITE_S + 13.1: the pod's settle is over, the new process's is not
        seen = rw.observe(WAIT, pods)
        assert seen.verdict is Verdict.WAITING, (fresh, seen.reason)
        clock.advance(10)
        assert rw.observe(WAIT, pods).verdict is Verdict.READY  # the new process ran its settle time


def test_a_healthy_scheduler_that_starts_late_is_not_rolled_back_for_its_settle() -> None:
    """Timeout 60 s, settle 10 s: a container started 55 s after the write has run 4 s at the deadline. The
    deadline waits for its settle (bounded by it); a wait for anything else still fails there."""
    clock = Clock(WRITE_S + 60.4)
    rw = watch(clock, local=False)
    seen = rw.observe(WAIT, Pods(mirror(WRITE_S + 55)))
    assert seen.verdict is Verdict.WAITING and seen.settle_until is not None
    assert abs(seen.settle_until - (clock.mono + (WRITE_S + 66 - (WRITE_S + 60.4)))) < 1e-6
    opts = Lifecycle(restart_timeout=60.0, restart_settle=10.0, check_extenders=False)
    record = State(phase=NodeState.WAITING_FOR_RESTART.value, config_hash=WAIT.config_hash, patched_sha256="cd" * 32)
    node = lifecycle.Node(record=record, wait=lifecycle.Wait(WAIT.config_hash, WAIT.written_ns,
                                                             deadline=clock.mono - 0.4))

    def rolls_back(ev: lifecycle.Observed) -> bool:
        _, acts = lifecycle.step(node, ev, opts)
        return any(isinstance(a, (lifecycle.RollBack, lifecycle.CheckLastGood)) for a in acts)
    assert not rolls_back(seen)
    clock.advance(5.6)
    assert rw.observe(WAIT, Pods(mirror(WRITE_S + 55))).verdict is Verdict.READY
    assert rolls_back(replace(seen, now=seen.settle_until))  # past the settle's end: no more slack
    assert rolls_back(replace(seen, settle_until=None))  # waiting for anything else: fails at the deadline


def test_the_kubelet_is_looked_at_only_past_the_deadline_while_the_restart_is_not_seen() -> None:
    """One short look at its healthz, when a timeout would be judged: not on every poll of a healthy wait."""
    clock, looks = Clock(WRITE_S + 3), []

    def kubelet_down() -> str:
        looks.append(clock.mono)
        return "refused"

    rw = RestartWatch(Files(), local_check=False, crash_restarts=2, settle=0.0, wall_ns=lambda: clock.wall,
                      monotonic=lambda: clock.mono, scan=list, kubelet_down=kubelet_down)
    wait = replace(WAIT, deadline=clock.mono + 5)
    rw.start(wait, "scheduler-config-0123456789ab.yaml", pod=None)
    assert rw.observe(wait, Pods(None)).kubelet_down == "" and looks == []  # before the deadline
    clock.advance(5)
    assert rw.observe(wait, Pods(None)).kubelet_down == "refused" and looks == [clock.mono]
    ready = rw.observe(wait, Pods(mirror(WRITE_S + 2)))  # the restart is seen: no look
    assert ready.verdict is Verdict.READY and ready.kubelet_down == "" and len(looks) == 1
