"""The restart checks of the write the lifecycle waits on: the mirror pod (through the API) and, with
``--local-check``, the node's process table (which answers while the API server is down). ``observe`` reduces
them to one ``lifecycle.Observed``; the judgement (Ready, crash loop, timeout) is the step's.

Either check says Ready only once the scheduler it sees has run ``restart_settle`` without a restart
(``restart.decide``): until then ``recheck_at`` tells the loop when to look again, since no event may come
when nothing changes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from patcher.adapters.proc import LocalRestartTracker, SchedulerProcess, find_schedulers
from patcher.core import lifecycle, manifest, restart
from patcher.core.settings import Files
from patcher.services.ports import PodSource


class RestartWatch:
    def __init__(self, files: Files, *, local_check: bool, crash_restarts: int, settle: float,
                 wall_ns: Callable[[], int] = time.time_ns, monotonic: Callable[[], float] = time.monotonic,
                 scan: Callable[[], list[SchedulerProcess]] = find_schedulers) -> None:
        """``wall_ns``, ``monotonic``, ``scan``: the clocks and the process table, replaced in tests."""
        self.files = files
        self.local_check = local_check
        self.crash_restarts = crash_restarts
        self.settle = settle
        self.wall_ns, self.monotonic, self.scan = wall_ns, monotonic, scan
        self.baseline = restart.Baseline()
        self.tracker: LocalRestartTracker | None = None
        #: Monotonic time of the next look while a check waits only for the settle time.
        self.recheck_at: float | None = None

    @property
    def container(self) -> str:
        return self.files.container_name or "kube-scheduler"

    @property
    def polling(self) -> bool:
        """The local tracker runs: the loop must wake to poll it."""
        return self.tracker is not None

    def start(self, wait: lifecycle.Wait, config_file: str, *, pod_now: dict[str, Any] | None,
              pod_before: dict[str, Any] | None) -> None:
        """A fresh baseline and local tracker for the write the lifecycle now waits on. An adopted write
        (a restarted agent, a manifest found patched) takes the pod as it is now: restarts that happened before
        we looked are not ours to judge (a lost election, say)."""
        self.baseline = restart.Baseline.of(pod_now if wait.adopted else pod_before, self.container)
        config_path = f"{self.files.host_config_dir}/{config_file}"
        self.tracker = LocalRestartTracker(config_path, wait.written_ns) if self.local_check else None

    def forget(self) -> None:
        """Nothing is waited on any more."""
        self.tracker = None
        self.recheck_at = None

    def observe(self, wait: lifecycle.Wait, pods: PodSource | None) -> lifecycle.Observed:
        """Both checks' verdicts on ``wait``, combined (``lifecycle.combine``)."""
        now_ns, now = self.wall_ns(), self.monotonic()
        verdicts: list[tuple[restart.Verdict, str]] = []
        settled_by: list[int] = []  # wall ns at which a check that waits only for the settle time is done
        if pods is not None:
            decision = restart.decide(pods.latest(), marker_key=manifest.marker_key(self.files.prefix),
                                      expected_hash=wait.config_hash, manifest_mtime_ns=wait.written_ns,
                                      baseline=self.baseline, container_name=self.container,
                                      min_restarts=self.crash_restarts, now_ns=now_ns, settle_s=self.settle)
            verdicts.append((decision.verdict, decision.reason))
            if decision.settle_until_ns is not None:
                settled_by.append(decision.settle_until_ns)
        if self.tracker is not None:  # the process table answers even while the API server is down
            check = self.tracker.poll(self.scan())
            left = restart.settle_left_ns(round(check.process.started_at * 1e9), now_ns, self.settle) \
                if check.ready and check.process is not None else 0
            if check.starts > self.crash_restarts:
                verdicts.append((restart.Verdict.CRASH_LOOPING, f"started {check.starts} times since our write"))
            elif left:
                settled_by.append(now_ns + left)
                verdicts.append((restart.Verdict.WAITING, f"local process: {check.reason}; Ready once it has run "
                                                          f"{self.settle:g}s without a restart"))
            else:
                verdicts.append((restart.Verdict.READY if check.ready else restart.Verdict.WAITING,
                                 f"local process: {check.reason}"))
        verdict, reason = lifecycle.combine(verdicts)
        self.recheck_at = now + (min(settled_by) - now_ns) / 1e9 if settled_by and verdict is restart.Verdict.WAITING \
            else None
        blind = self.tracker is None and pods is not None and not getattr(pods, "fresh", True)
        return lifecycle.Observed(now, now_ns, verdict, reason, blind=blind)
