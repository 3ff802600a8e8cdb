"""The restart checks of the write the lifecycle waits on: the mirror pod (through the API) and, with
``--local-check``, the node's process table (which answers while the API server is down). ``observe`` reduces
them to one ``lifecycle.Observed``; the judgement (Ready, crash loop, timeout) is the step's."""

from __future__ import annotations

import time
from typing import Any

from patcher.adapters.proc import LocalRestartTracker
from patcher.core import lifecycle, manifest, restart
from patcher.core.settings import Files
from patcher.services.ports import PodSource


class RestartWatch:
    def __init__(self, files: Files, *, local_check: bool, crash_restarts: int) -> None:
        self.files = files
        self.local_check = local_check
        self.crash_restarts = crash_restarts
        self.baseline = restart.Baseline()
        self.tracker: LocalRestartTracker | None = None

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

    def observe(self, wait: lifecycle.Wait, pods: PodSource | None) -> lifecycle.Observed:
        """Both checks' verdicts on ``wait``, combined (``lifecycle.combine``)."""
        verdicts: list[tuple[restart.Verdict, str]] = []
        if pods is not None:
            decision = restart.decide(pods.latest(), marker_key=manifest.marker_key(self.files.prefix),
                                      expected_hash=wait.config_hash, manifest_mtime_ns=wait.written_ns,
                                      baseline=self.baseline, container_name=self.container,
                                      min_restarts=self.crash_restarts)
            verdicts.append((decision.verdict, decision.reason))
        if self.tracker is not None:  # the process table answers even while the API server is down
            check = self.tracker.poll()
            if check.starts > self.crash_restarts:
                verdicts.append((restart.Verdict.CRASH_LOOPING, f"started {check.starts} times since our write"))
            else:
                verdicts.append((restart.Verdict.READY if check.ready else restart.Verdict.WAITING,
                                 f"local process: {check.reason}"))
        verdict, reason = lifecycle.combine(verdicts)
        blind = self.tracker is None and pods is not None and not getattr(pods, "fresh", True)
        return lifecycle.Observed(time.monotonic(), time.time_ns(), verdict, reason, blind=blind)
