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

from patcher.adapters.proc import LocalCheck, LocalRestartTracker, SchedulerProcess, find_schedulers
from patcher.core import lifecycle, manifestedit, restart
from patcher.core.settings import Files
from patcher.core.timefmt import api_seconds
from patcher.services.ports import PodSource


class RestartWatch:
    def __init__(self, files: Files, *, local_check: bool, crash_restarts: int, settle: float,
                 wall_ns: Callable[[], int] = time.time_ns, monotonic: Callable[[], float] = time.monotonic,
                 scan: Callable[[], list[SchedulerProcess]] = find_schedulers,
                 kubelet_down: Callable[[], str] = lambda: "") -> None:
        """``wall_ns``, ``monotonic``, ``scan``: the clocks and the process table, replaced in tests;
        ``kubelet_down``: why the node's kubelet is not healthy ("" healthy or unknown; ``adapters/kubelet``)."""
        self.files = files
        self.container = files.container_name or "kube-scheduler"
        self.local_check = local_check
        self.crash_restarts = crash_restarts
        self.settle = settle
        self.wall_ns, self.monotonic, self.scan, self.kubelet_down = wall_ns, monotonic, scan, kubelet_down
        self.baseline = restart.Baseline()
        self.tracker: LocalRestartTracker | None = None
        #: Monotonic time of the next look while a check waits only for the settle time.
        self.recheck_at: float | None = None

    def start(self, wait: lifecycle.Wait, config_file: str, *, pod: dict[str, Any] | None) -> None:
        """A fresh baseline (the mirror pod ``pod``) and local tracker for the write the lifecycle now waits on."""
        self.baseline = restart.Baseline.of(pod, self.container)
        config_path = f"{self.files.host_config_dir}/{config_file}"
        self.tracker = LocalRestartTracker(config_path, wait.written_ns) if self.local_check else None

    def forget(self) -> None:
        self.tracker = None
        self.recheck_at = None

    def observe(self, wait: lifecycle.Wait, pods: PodSource) -> lifecycle.Observed:
        """Both checks' verdicts on ``wait`` (the mirror pod's only when one is watched), combined
        (``lifecycle.combine``)."""
        now_ns, now = self.wall_ns(), self.monotonic()
        verdicts: list[tuple[restart.Verdict, str]] = []
        settled_by: list[int] = []  # wall ns at which a check that waits only for the settle time is done
        check = self.tracker.poll(self.scan()) if self.tracker is not None else None
        watched, fresh = bool(pods.pod_name), pods.fresh
        if watched:
            decision = restart.decide(pods.latest(), marker_key=manifestedit.marker_key(self.files.prefix),
                                      expected_hash=wait.config_hash, manifest_mtime_ns=wait.written_ns,
                                      baseline=self.baseline, container_name=self.container,
                                      min_restarts=self.crash_restarts, now_ns=now_ns, settle_s=self.settle)
            verdict, reason = decision.verdict, decision.reason
            if verdict is restart.Verdict.READY and self.settle > 0:
                newer = _newer_process(check, decision.started_at)
                if not fresh:  # the view may be hiding the exit that a settle time is there to see
                    verdict, reason = restart.Verdict.WAITING, f"{reason}, in a pod view that does not follow " \
                                                               "the API server now: the settle is not proven"
                elif newer:
                    verdict, reason = restart.Verdict.WAITING, f"{reason}, but {newer}"
            verdicts.append((verdict, reason))
            if decision.settle_until_ns is not None:
                settled_by.append(decision.settle_until_ns)
        if check is not None:  # the process table answers even while the API server is down
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
        waiting = verdict is restart.Verdict.WAITING
        self.recheck_at = now + (min(settled_by) - now_ns) / 1e9 if settled_by and waiting else None
        # Waiting only for a settle time: the latest of them (a check still waiting otherwise has none).
        only_settle = waiting and len(settled_by) == len(verdicts) and bool(settled_by)
        settle_until = now + (max(settled_by) - now_ns) / 1e9 if only_settle else None
        blind = self.tracker is None and watched and not fresh
        # Only a timeout needs the kubelet: one short look, past the deadline, while the restart is not seen.
        kubelet = self.kubelet_down() if waiting and now >= wait.deadline else ""
        return lifecycle.Observed(now, now_ns, verdict, reason, blind=blind, settle_until=settle_until,
                                  kubelet_down=kubelet)


def _newer_process(check: LocalCheck | None, started_at: str | None) -> str | None:
    """What the process table says against a container the API shows running since ``started_at``: a
    scheduler process that started after that container (its start is whole seconds; the process starts
    just after its container) is a restart the pod view has not shown yet."""
    container_s = api_seconds(started_at)
    if check is None or check.process is None or container_s is None:
        return None
    if check.process.started_at <= container_s + 2:
        return None
    return f"the process table shows pid {check.process.pid} started since"
