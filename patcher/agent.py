"""The node agent's reactor: one thread that owns every decision, fed by watchers, timers and signals.

Like kubeadm's static-pod upgrade it writes, waits for the kubelet to restart the scheduler onto the new
manifest, and rolls back when that does not happen; like kured it speaks to the cluster only through its
Node's annotations and events. The API adapters run in their own threads and never block this loop: a
control plane that is restarting (which is what we cause) must not stop the file-level work.
"""

from __future__ import annotations

import logging
import posixpath
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from patcher import engine, fsio, manifest, restart, signals
from patcher.errors import ConfigError, PatcherError
from patcher.health import Health, Metrics
from patcher.kube.status import NodeState, NodeStatus
from patcher.proc import LocalRestartTracker
from patcher.schedconfig import RenderedConfig
from patcher.state import State
from patcher.watch import FolderWatcher, file_fingerprint, folder_fingerprint

log = logging.getLogger("patcher.agent")

Event = str  # "source", "manifest" (a watched folder changed), "pod" (mirror pod update), "stop"


class Reporter(Protocol):
    def publish(self, status: NodeStatus, *, reason: str | None = None, message: str | None = None) -> None: ...
    def note(self, reason: str, message: str, *, warning: bool = False) -> None: ...
    def flush(self, timeout: float) -> bool: ...


class PodSource(Protocol):
    def latest(self) -> dict[str, Any] | None: ...


class Coordinator(Protocol):
    """One manifest change at a time across the control plane (see ``patcher.rollout``)."""

    held: bool
    refused_bad: bool
    current_holder: str | None

    def acquire(self, source_hash: str = "") -> bool: ...
    def release(self, *, bad_hash: str | None = None) -> None: ...
    def settle(self, timeout: float) -> bool: ...
    def wait_held(self, timeout: float) -> bool: ...
    def close(self, timeout: float) -> None: ...

    api_answered: bool | None


@dataclass(frozen=True)
class AgentOptions:
    files: engine.Options
    node_name: str = ""
    resync_interval: float = 300.0
    restart_timeout: float = 600.0
    rollback_on_failure: bool = True
    restore_on_exit: Literal["always", "never"] = "always"
    local_check: bool = False  # psutil on the node's process table (needs hostPID)
    debounce: float = 0.3
    crash_restarts: int = 2  # restarts after our write that make a crash loop
    grace_period: float = 25.0  # budget for the shutdown path (the pod's grace period minus a margin)
    local_poll: float = 1.0
    lease_retry: float = 2.0  # how often a node waiting for the rollout lease asks again


@dataclass
class Waiting:
    """The write we are waiting on: the kubelet must restart the scheduler onto it."""

    config_hash: str
    config_path: str
    written_ns: int  # manifest mtime after our write
    deadline: float  # monotonic
    baseline: restart.Baseline = field(default_factory=restart.Baseline)
    tracker: LocalRestartTracker | None = None
    source_hash: str = ""  # the ConfigMap content behind it: what other nodes compare, as they render their own


class Agent:
    def __init__(self, opts: AgentOptions, *, reporter: Reporter | None = None, pods: PodSource | None = None,
                 health: Health | None = None, metrics: Metrics | None = None,
                 fallback_version: Callable[[], str | None] = lambda: None,
                 coordinator: Coordinator | None = None,
                 on_phase: Callable[[NodeState], None] | None = None) -> None:
        self.opts = opts
        self.files = opts.files
        self.reporter = reporter
        self.pods = pods
        self.health = health or Health()
        self.metrics = metrics or Metrics()
        self.fallback_version = fallback_version
        self.coordinator = coordinator
        self.on_phase = on_phase  # e.g. republish the cluster verdict
        self._lease_retry_at: float | None = None
        self.events: queue.Queue[Event] = queue.Queue()
        self.store = self.files.store()
        self.state = State()
        self._phase: NodeState | None = None
        self.waiting: Waiting | None = None
        self.message: str | None = None
        self.restarted_at_ns: int | None = None
        self.watcher: FolderWatcher | None = None
        self._stopping = threading.Event()
        self._next_resync = 0.0
        self._log_extra = {"node": opts.node_name or "-", "manifest": self.files.manifest_path}

    @property
    def phase(self) -> NodeState | None:
        return self._phase

    @phase.setter
    def phase(self, value: NodeState | None) -> None:
        """The one place the node state changes: health (``/readyz``) and the state gauge follow it, so no
        path (a resumed record, a rollback, the restore on exit) can set one without the other."""
        self._phase = value
        if value is not None:
            self.health.set_state(value.value)  # also the metrics' one-hot gauge when attached
            if self.health.metrics is not self.metrics:
                self.metrics.set_state(value.value)

    # -- inputs ---------------------------------------------------------------------------------------------

    def notify(self, event: Event) -> None:
        self.events.put(event)

    def request_stop(self) -> None:
        if self._stopping.is_set():
            log.warning("second stop signal ignored: the restore is running and must finish", extra=self._log_extra)
            return
        self._stopping.set()
        self.events.put("stop")

    def install_signal_handlers(self) -> None:
        """Stop on SIGTERM/SIGINT, including one that came before this call (while the process started)."""
        if signals.installed_at is None:
            signals.install()

        def on_signal(signum: int) -> None:
            log.info("received %s", signal.Signals(signum).name, extra=self._log_extra)
            self.request_stop()

        signals.subscribe(on_signal)

    def start_watching(self) -> None:
        fs = self.files.fs
        manifest_local = fs.local(self.files.manifest_path)
        watcher = FolderWatcher(self.notify, debounce=self.opts.debounce)
        targets = [("source", self.files.source, lambda: folder_fingerprint(self.files.source)),
                   ("manifest", fs.local(self.files.manifest_dir), lambda: file_fingerprint(manifest_local))]
        target_dir = posixpath.dirname(fs.resolve(self.files.manifest_path))
        if posixpath.normpath(target_dir) != posixpath.normpath(self.files.manifest_dir):
            # A symlinked manifest is edited at its target: a change there raises no event in the kubelet's folder.
            targets.append(("manifest", fs.local(target_dir), lambda: file_fingerprint(manifest_local)))
        for name, folder, fingerprint in targets:
            try:
                watcher.add(name, folder, fingerprint)
            except PatcherError as exc:  # keep running: the periodic resync still covers it
                self.metrics.error("watch")
                log.error("cannot watch %s: %s; relying on the periodic resync", name, exc, extra=self._log_extra)
        watcher.start()
        self.watcher = watcher

    # -- the loop -------------------------------------------------------------------------------------------

    def run(self) -> int:
        """Reconcile until stopped; then restore (unless told not to). Returns the process exit code."""
        try:
            self.state = self.store.load()
        except PatcherError as exc:
            log.error("state record unreadable, starting fresh: %s", exc, extra=self._log_extra)
            self.state = State()
        for leftover in engine.remove_stale_temp_files(self.files):
            log.info("removed %s, left by a writer that was killed mid-write", leftover, extra=self._log_extra)
        if self._stopping.is_set():
            # Stopped while starting: the manifest's state is known now (plan_restore reads it), so restore
            # what carries our marker, and write nothing new.
            log.info("stop requested during start-up; restoring without a reconcile", extra=self._log_extra)
            return self.shutdown()
        self._resume()
        self.reconcile("start")
        if self.reporter is not None and self.phase is not None:  # a restarted agent re-asserts what it found
            self.reporter.publish(self._status(), reason="AgentStarted",
                                  message=f"scheduler-patcher started; the node is {self.phase.value}")
        while not self._stopping.is_set():
            self.health.beat()
            try:
                event = self.events.get(timeout=self._timeout())
            except queue.Empty:
                event = None
            if event == "stop" or self._stopping.is_set():
                break
            if event in ("source", "manifest"):
                self.reconcile(f"{event} changed")
            elif event == "lease":
                self.reconcile("rollout lease changed")
            elif time.monotonic() >= self._next_resync:
                self.reconcile("resync")
            elif self._lease_retry_at is not None and time.monotonic() >= self._lease_retry_at:
                self.reconcile("rollout lease retry")
            self.check_restart()
        return self.shutdown()

    def _timeout(self) -> float:
        now = time.monotonic()
        wake = [self._next_resync - now, 5.0]  # 5 s: the liveness heartbeat
        if self._lease_retry_at is not None:
            wake.append(self._lease_retry_at - now)
        if self.waiting is not None:
            wake.append(self.waiting.deadline - now)
            if self.waiting.tracker is not None:
                wake.append(self.opts.local_poll)
        return max(0.05, min(wake))

    # -- decisions ------------------------------------------------------------------------------------------

    def _resume(self) -> None:
        """After a crash or restart of the agent: pick up a write that was still waiting for the scheduler."""
        if self.state.phase == NodeState.WAITING_FOR_RESTART and self.state.patched:
            if self.coordinator is not None:
                self.coordinator.acquire()  # still ours after a crash: keep the others waiting
            self._wait_for(self.state.config_hash, self.state.manifest_mtime_ns, adopted=True,
                           baseline=self._baseline_now(), source_hash=self.state.extra.get("source_hash", ""))
        elif self.state.phase in (NodeState.READY, NodeState.ROLLED_BACK, NodeState.FAILED):
            self.phase = NodeState(self.state.phase)
            self.message = self.state.extra.get("message")
            self.restarted_at_ns = self.state.extra.get("restarted_at_ns")

    def reconcile(self, why: str) -> None:
        self.metrics.reconciled()
        self._next_resync = time.monotonic() + self.opts.resync_interval  # any reconcile is a resync
        try:
            plan = engine.plan_apply(self.files, fallback_version=self.fallback_version(),
                                     bad_hashes=frozenset(self.state.bad_hashes))
        except engine.KnownBadConfig as exc:
            log.info("not retrying a config that was rolled back: %s", exc, extra=self._log_extra)
            return
        except ConfigError as exc:
            self._fail(exc, "config")
            return
        except PatcherError as exc:
            self._fail(exc, "manifest")
            return
        config = plan.config
        assert config is not None
        if not plan.pending:
            if self.phase in (None, NodeState.FAILED, NodeState.PENDING) and self.waiting is None:
                self._adopt(plan, config)
            return
        if plan.manifest_change() is not None:
            if not self._take_turn(config.config_hash, plan.source_hash):
                return
            self._set_phase(NodeState.PENDING, None)
        pod_before = self.pods.latest() if self.pods else None
        try:
            lines, new_state = engine.apply(self.files, plan, self.state)
        except fsio.ChangedUnderneath as exc:
            log.info("%s; planning again", exc, extra=self._log_extra)
            self._end_turn()
            self.notify("manifest")
            return
        except PatcherError as exc:
            self._fail(exc, "write")
            self._end_turn()
            return
        if self.watcher:
            self.watcher.expect("manifest")
        self.metrics.wrote()
        self.state = new_state
        self.state.extra = {**self.state.extra, "source_hash": plan.source_hash}
        for note in plan.notes:
            log.info("%s", note, extra=self._log_extra)
        for line in lines:
            log.info("%s (%s)", line, why, extra={**self._log_extra, "hash": config.short_hash})
        if plan.manifest_change() is None:
            return  # only config files were rewritten (same content hash): nothing restarts
        self.restarted_at_ns = None
        self._wait_for(config.config_hash, new_state.manifest_mtime_ns,
                       baseline=restart.Baseline.of(pod_before, self._container()), source_hash=plan.source_hash)

    def _adopt(self, plan: engine.Plan, config: RenderedConfig) -> None:
        """The manifest already carries our current patch (a restarted agent, or a source fixed after Failed)."""
        self.state.config_hash, self.state.config_file = config.config_hash, config.main
        self.state.files = sorted(config.files)
        self.state.patched_sha256 = engine.sha256(plan.current)
        self.state.original_sha256 = engine.sha256(plan.unpatched)
        self.state.extra = {**self.state.extra, "source_hash": plan.source_hash}
        if self.state.last_good.get("config_hash") == config.config_hash:
            # This very config was confirmed Ready here before (e.g. the source had a typo meanwhile, which
            # was refused without touching anything): the scheduler still runs it, nothing to wait for.
            log.info("manifest carries config %s, which was Ready before; back to Ready", config.short_hash,
                     extra=self._log_extra)
            self._set_phase(NodeState.READY, None)
            return
        log.info("manifest already patched with config %s; adopting it without a write", config.short_hash,
                 extra=self._log_extra)
        mtime = fsio.mtime_ns(plan.manifest_local) or self.state.manifest_mtime_ns
        self._wait_for(config.config_hash, mtime, adopted=True, baseline=self._baseline_now(),
                       source_hash=plan.source_hash)

    def _baseline_now(self) -> restart.Baseline:
        """Restarts that happened before we looked are not ours to judge (a lost leader election, say)."""
        return restart.Baseline.of(self.pods.latest() if self.pods else None, self._container())

    def _take_turn(self, config_hash: str, source_hash: str) -> bool:
        """Coordinated rollout: hold the Lease before a manifest change; skip configs that failed elsewhere."""
        self._lease_retry_at = None
        c = self.coordinator
        if c is None or c.held or config_hash == self.state.last_good.get("config_hash"):
            return True  # independent mode, our turn already, or re-applying what was Ready here
        if c.acquire(source_hash):
            log.info("rollout lease acquired for config %s", config_hash[:12], extra=self._log_extra)
            return True
        if c.refused_bad:
            log.warning("this source (%s) was rolled back on another node; not trying config %s here",
                        source_hash[:12], config_hash[:12], extra=self._log_extra)
            if config_hash not in self.state.bad_hashes:
                self.state.bad_hashes.append(config_hash)
                self.store.save(self.state)
                if self.reporter is not None:  # once per config: say why this node keeps its current one
                    self.reporter.note("PatchSkipped", f"config {config_hash[:12]} (source {source_hash[:12]}) was "
                                       "rolled back on another node; this node keeps its current config",
                                       warning=True)
            return False
        log.info("waiting for the rollout lease (held by %s)", c.current_holder or "?", extra=self._log_extra)
        if self.phase is None:
            self._set_phase(NodeState.PENDING, None)
        self._lease_retry_at = time.monotonic() + self.opts.lease_retry
        return False

    def _end_turn(self, bad_hash: str | None = None) -> None:
        if self.coordinator is not None and self.coordinator.held:
            self.coordinator.release(bad_hash=bad_hash)
            log.info("rollout lease released", extra=self._log_extra)

    def _container(self) -> str:
        return self.files.container_name or "kube-scheduler"

    def _wait_for(self, config_hash: str, written_ns: int, *, adopted: bool = False,
                  baseline: restart.Baseline | None = None, source_hash: str = "") -> None:
        config_path = f"{self.files.host_config_dir}/{self.state.config_file}"
        tracker = LocalRestartTracker(config_path, written_ns) if self.opts.local_check else None
        # An adopted write gets the full timeout from now: time spent while the agent was down (a reboot, an
        # eviction) says nothing about the scheduler, and the pod watch may not have caught up yet.
        self.waiting = Waiting(config_hash, config_path, written_ns, time.monotonic() + self.opts.restart_timeout,
                               baseline or restart.Baseline(), tracker, source_hash)
        self.state.manifest_mtime_ns = written_ns
        self._set_phase(NodeState.WAITING_FOR_RESTART, None,
                        reason="SchedulerAdopted" if adopted else None)
        self.check_restart()

    def check_restart(self) -> None:
        w = self.waiting
        if w is None:
            return
        verdicts: list[tuple[restart.Verdict, str]] = []
        if self.pods is not None:
            decision = restart.decide(self.pods.latest(), marker_key=manifest.marker_key(self.files.prefix),
                                      expected_hash=w.config_hash, manifest_mtime_ns=w.written_ns,
                                      baseline=w.baseline, container_name=self._container(),
                                      min_restarts=self.opts.crash_restarts)
            verdicts.append((decision.verdict, decision.reason))
        if w.tracker is not None:  # the process table answers even while the API server is down
            check = w.tracker.poll()
            if check.starts > self.opts.crash_restarts:
                verdicts.append((restart.Verdict.CRASH_LOOPING, f"started {check.starts} times since our write"))
            else:
                verdicts.append((restart.Verdict.READY if check.ready else restart.Verdict.WAITING,
                                 f"local process: {check.reason}"))
        if not verdicts:
            verdicts.append((restart.Verdict.READY, "restart not verified (no API and no local process check)"))
        # A crash loop seen by either check wins; otherwise either check proving the restart is enough.
        order = (restart.Verdict.CRASH_LOOPING, restart.Verdict.READY, restart.Verdict.WAITING)
        verdict, reason = min(verdicts, key=lambda v: order.index(v[0]))
        if verdict == restart.Verdict.READY:
            self._ready(w, reason)
        elif verdict == restart.Verdict.CRASH_LOOPING:
            self._rollback(w, f"kube-scheduler crash-loops with config {w.config_hash[:12]} ({reason})")
        elif time.monotonic() >= w.deadline:
            self._rollback(w, f"kube-scheduler did not come back Ready with config {w.config_hash[:12]} within "
                              f"{self.opts.restart_timeout:.0f}s ({reason})")

    def _ready(self, w: Waiting, reason: str) -> None:
        now = time.time_ns()
        self.waiting = None
        self.restarted_at_ns = now
        self.metrics.restart_seen(max(0.0, (now - w.written_ns) / 1e9))
        self.state.last_good = {"config_hash": self.state.config_hash, "config_file": self.state.config_file,
                                "files": list(self.state.files), "source_hash": w.source_hash,
                                "original_sha256": self.state.original_sha256}
        for line in engine.prune(self.files, self.state, keep_previous=False):
            log.info("%s (config %s is live)", line, w.config_hash[:12], extra=self._log_extra)
        log.info("kube-scheduler runs config %s: %s", w.config_hash[:12], reason, extra=self._log_extra)
        self._set_phase(NodeState.READY, None)
        self._end_turn()

    def _rollback(self, w: Waiting, reason: str) -> None:
        self.waiting = None
        self.metrics.rolled_back()
        if w.config_hash not in self.state.bad_hashes:
            self.state.bad_hashes.append(w.config_hash)
        if not self.opts.rollback_on_failure:
            log.error("%s; rollback disabled", reason, extra=self._log_extra)
            self._set_phase(NodeState.FAILED, reason)
            self._end_turn(bad_hash=w.source_hash or None)
            return
        good = engine.saved_config(self.files, self.state.last_good) if self.state.last_good else None
        try:
            plan = engine.plan_apply(self.files, config=good) if good and good.config_hash != w.config_hash else None
            # The last Ready config was rendered for the manifest it ran with (version, flags). After an
            # upgrade it may be an apiVersion the new scheduler does not serve: then only the original is safe.
            if plan is not None and engine.sha256(plan.unpatched) != self.state.last_good.get("original_sha256"):
                log.warning("the manifest changed since config %s was Ready; rolling back to the original",
                            self.state.last_good.get("config_hash", "")[:12], extra=self._log_extra)
                plan = None
            if plan is not None and good is not None:
                if plan.pending:
                    _, self.state = engine.apply(self.files, plan, self.state)
                target = f"the last Ready config {good.short_hash}"
                self.state.extra = {**self.state.extra, "source_hash": self.state.last_good.get("source_hash", "")}
            else:
                rplan = engine.plan_restore(self.files)
                engine.restore(self.files, rplan, keep_files=True)
                self.state.patched_sha256 = ""
                self.state.config_hash = ""
                self.state.extra = {**self.state.extra, "source_hash": ""}
                target = "the original manifest"
        except PatcherError as exc:
            self.metrics.error("rollback")
            log.error("rollback failed: %s", exc, extra=self._log_extra)
            self._set_phase(NodeState.FAILED, f"{reason}; rollback failed: {exc}")
            self._end_turn(bad_hash=w.source_hash or None)
            return
        if self.watcher:
            self.watcher.expect("manifest")
        self.state.manifest_mtime_ns = fsio.mtime_ns(self.files.fs.local(self.files.fs.resolve(
            self.files.manifest_path))) or self.state.manifest_mtime_ns
        message = f"{reason}; rolled back to {target}"
        log.error("%s", message, extra=self._log_extra)
        self._set_phase(NodeState.ROLLED_BACK, message)
        self._end_turn(bad_hash=w.source_hash or None)

    def _fail(self, exc: PatcherError, kind: str) -> None:
        self.metrics.error(kind)
        log.error("%s", exc, extra={**self._log_extra, "file": exc.path or "-"})
        if self.waiting is None:
            self._set_phase(NodeState.FAILED, f"{exc}; nothing was changed")

    def _set_phase(self, phase: NodeState, message: str | None, reason: str | None = None) -> None:
        changed = phase != self.phase or message != self.message
        self.phase, self.message = phase, message
        self.state.phase = phase.value
        self.state.extra = {**self.state.extra, "message": message, "restarted_at_ns": self.restarted_at_ns}
        try:
            self.store.save(self.state)
        except PatcherError as exc:
            log.error("cannot save the state record: %s", exc, extra=self._log_extra)
        if self.reporter is not None and (changed or phase == NodeState.READY):
            self.reporter.publish(self._status(), reason=reason)
        if changed and self.on_phase is not None:
            self.on_phase(phase)

    def _status(self) -> NodeStatus:
        assert self.phase is not None
        return NodeStatus(state=self.phase, config_hash=self.state.config_hash or None,
                          source_hash=self.state.extra.get("source_hash") or None,
                          manifest_mtime_ns=self.state.manifest_mtime_ns or None,
                          restarted_at_ns=self.restarted_at_ns if self.phase == NodeState.READY else None,
                          message=self.message)

    # -- stopping -------------------------------------------------------------------------------------------

    def _turn_for_restore(self, started: float) -> None:
        """Best effort: hold the rollout Lease while restoring, so that deleting the DaemonSet restarts one
        scheduler at a time. The Lease actor answers within its deadline; when the API does not answer at
        all (the control plane is down) the restore goes ahead at once, and never past 40 % of the grace
        period: the restore itself must happen."""
        c = self.coordinator
        if c is None or c.held:
            return
        c.acquire()
        if c.settle(min(0.5, 0.4 * self.opts.grace_period)):
            return
        # Another node restores right now: wait for our turn, bounded.
        if c.api_answered and c.wait_held(started + 0.4 * self.opts.grace_period - time.monotonic()):
            return
        log.warning("restoring without the rollout lease (%s)",
                    f"held by {c.current_holder or '?'}" if c.api_answered else "the API server does not answer",
                    extra=self._log_extra)

    def _wait_restored(self, started: float) -> None:
        """While holding the Lease, wait (bounded) until the scheduler runs the restored manifest."""
        if self.pods is None or self.coordinator is None or not self.coordinator.held:
            return
        local = self.files.fs.local(self.files.fs.resolve(self.files.manifest_path))
        written = fsio.mtime_ns(local) or 0
        deadline = started + 0.7 * self.opts.grace_period
        while time.monotonic() < deadline:
            if restart.runs_unpatched(self.pods.latest(), marker_key=manifest.marker_key(self.files.prefix),
                                      manifest_mtime_ns=written, container_name=self._container()):
                return
            time.sleep(0.1)
        log.warning("kube-scheduler not seen back on the restored manifest; releasing the rollout lease",
                    extra=self._log_extra)

    def shutdown(self) -> int:
        started = time.monotonic()
        if self.watcher:
            self.watcher.stop()
        code = 0
        if self.opts.restore_on_exit == "always":
            try:
                plan = engine.plan_restore(self.files)
                writes = any(c.kind == "manifest" for c in plan.changes)
                if writes:
                    self._turn_for_restore(started)
                for line in engine.restore(self.files, plan):
                    log.info("%s (stopping)", line, extra=self._log_extra)
                if writes:
                    self._wait_restored(started)
                self.metrics.restored()
                self.waiting = None
                self.state = State(bad_hashes=self.state.bad_hashes)  # a failed config stays failed
                if self.state.bad_hashes:
                    self.store.save(self.state)
                self.phase = NodeState.RESTORED
                self.message = None
                self.restarted_at_ns = None
                if self.reporter is not None:
                    self.reporter.publish(NodeStatus(state=NodeState.RESTORED))
            except PatcherError as exc:
                self.metrics.error("restore")
                log.error("restore on exit failed: %s", exc, extra=self._log_extra)
                code = 1
        self._end_turn()
        if self.coordinator is not None:  # the release within a share of what is left, the report gets the rest
            self.coordinator.close(max(0.2, 0.5 * (self.opts.grace_period - (time.monotonic() - started))))
        if self.reporter is not None:
            left = self.opts.grace_period - (time.monotonic() - started)
            if not self.reporter.flush(max(0.5, left)):
                log.warning("could not publish the final state before the grace period ended", extra=self._log_extra)
        return code
