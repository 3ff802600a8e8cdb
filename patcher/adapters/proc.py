"""Find the running kube-scheduler through /proc (hostPID) and tell whether it runs our config since our write.

The restart check that needs no API server (``--no-api``, or while the API is down): a process counts as the
restarted scheduler when its command line runs kube-scheduler (directly, or through ``go-runner`` or
``hyperkube``), carries our ``--config``, and it started after the manifest write. Start times are taken
since boot and converted with the current offset between the wall clock and ``CLOCK_BOOTTIME`` (psutil's
``create_time()`` adds /proc/stat's whole-second boot time, up to a second early); ``(pid, since-boot
start)`` identifies a process across polls even when a pid is reused.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from patcher.core.schedconfig import flags as sched_flags

if TYPE_CHECKING:  # imported at the first scan of the process table (``find_schedulers``), not at start
    import psutil

log = logging.getLogger(__name__)

SCHEDULER = "kube-scheduler"
WRAPPERS = frozenset({"go-runner", "hyperkube"})
#: Start times are whole clock ticks (10 ms at 100 Hz), truncated: a process may look this much older.
CLOCK_TOLERANCE_S = 0.01

ProcessKey = tuple[int, float]


@dataclass(frozen=True)
class SchedulerProcess:
    pid: int
    started_since_boot: float
    started_at: float
    config: str | None
    wrapper: str | None = None

    @property
    def key(self) -> ProcessKey:
        """Identity across polls: a reused pid has a different start time."""
        return (self.pid, self.started_since_boot)


@dataclass(frozen=True)
class LocalCheck:
    """The verdict of one look at the process table."""

    ready: bool
    reason: str
    process: SchedulerProcess | None = None
    starts: int = 0


def _base(path: str) -> str:
    return os.path.basename(path.rstrip("/"))


def scheduler_args(cmdline: Sequence[str], name: str | None = None) -> tuple[tuple[str, ...], str | None] | None:
    """The scheduler's own arguments and the wrapper's name if ``cmdline`` runs kube-scheduler, else ``None``.

    ``name`` is the kernel's process name (``comm``), which differs from ``cmdline[0]`` for scripts.
    """
    if not cmdline:
        return None
    first = _base(cmdline[0])
    if SCHEDULER in (first, name):
        return tuple(cmdline[1:]), None
    wrapper = first if first in WRAPPERS else name if name in WRAPPERS else None
    if wrapper is None:
        return None
    for i, arg in enumerate(cmdline[1:], start=1):
        if _base(arg) == SCHEDULER or (wrapper == "hyperkube" and arg == "scheduler"):
            return tuple(cmdline[i + 1 :]), wrapper
    return None


def config_flag(args: Sequence[str]) -> str | None:
    """The value of the ``--config`` the scheduler runs with, by the one rule (``patcher.core.schedconfig.flags``)."""
    found = sched_flags.config_flag(args)
    return found.value if found else None


def _since_boot(proc: psutil.Process) -> float:
    try:
        return float(proc.create_time(monotonic=True))
    except TypeError:  # psutil < 7.1 has no monotonic flag; boot time cancels out
        import psutil

        return float(proc.create_time() - psutil.boot_time())


def find_schedulers() -> list[SchedulerProcess]:
    """Every live process that runs kube-scheduler. Zombies and processes we may not read are skipped.

    psutil is imported here, at the first scan: the restart watch scans only after a write, so its imports
    stay off the path from exec to the first write."""
    import psutil

    found: list[SchedulerProcess] = []
    offset = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)  # the boot's wall time, unrounded (not btime)
    for proc in psutil.process_iter(["name", "cmdline", "status"]):
        try:
            info = proc.info
            if info.get("status") == psutil.STATUS_ZOMBIE:
                continue
            cmdline = info.get("cmdline")
            if not cmdline:  # None when access is denied, empty for zombies and kernel threads
                continue
            parsed = scheduler_args(cmdline, info.get("name"))
            if parsed is None:
                continue
            since_boot = _since_boot(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        args, wrapper = parsed
        found.append(
            SchedulerProcess(
                pid=proc.pid,
                started_since_boot=since_boot,
                started_at=since_boot + offset,
                config=config_flag(args),
                wrapper=wrapper,
            )
        )
    return found


def check_local(expected_config: str, written_at_ns: int, processes: Iterable[SchedulerProcess]) -> LocalCheck:
    """Ready when a kube-scheduler with ``--config=expected_config`` started after ``written_at_ns``.

    A direct kube-scheduler process is preferred over a wrapper that names it (the wrapper is its parent and
    started first).
    """
    procs = list(processes)
    if not procs:
        return LocalCheck(False, "no kube-scheduler process is running")
    direct = [p for p in procs if p.wrapper is None]
    candidates = direct or procs
    written_at, want = written_at_ns / 1e9, os.path.normpath(expected_config)
    ours = [p for p in candidates if p.config is not None and os.path.normpath(p.config) == want]
    fresh = [p for p in ours if p.started_at >= written_at - CLOCK_TOLERANCE_S]
    if fresh:
        newest = max(fresh, key=lambda p: p.started_at)
        return LocalCheck(True, f"kube-scheduler pid {newest.pid} runs {expected_config} since our write", newest)
    if ours:
        oldest = min(ours, key=lambda p: p.started_at)
        return LocalCheck(
            False,
            f"kube-scheduler pid {oldest.pid} runs {expected_config} but started "
            f"{written_at - oldest.started_at:.3f}s before our write",
            oldest,
        )
    other = candidates[0]
    return LocalCheck(
        False, f"kube-scheduler pid {other.pid} runs --config={other.config}, not {expected_config}", other
    )


class LocalRestartTracker:
    """Polls the process table for one write and counts distinct scheduler starts with our config.

    More than one start after the write means the scheduler died and was restarted: the local equivalent of
    a rising ``restartCount``, i.e. a crash loop when it keeps happening.
    """

    def __init__(self, expected_config: str, written_at_ns: int) -> None:
        self.expected_config = expected_config
        self.written_at_ns = written_at_ns
        self._seen: set[ProcessKey] = set()

    def poll(self, processes: Iterable[SchedulerProcess]) -> LocalCheck:
        """Check once; the result's ``starts`` counts every distinct fresh process seen so far."""
        check = check_local(self.expected_config, self.written_at_ns, processes)
        if check.ready and check.process is not None:
            self._seen.add(check.process.key)
        return LocalCheck(check.ready, check.reason, check.process, starts=len(self._seen))
