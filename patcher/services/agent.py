"""The node agent's reactor: one thread that observes, feeds ``patcher.core.lifecycle.step`` and executes its
actions.

Every decision is in ``patcher.core.lifecycle`` (pure); this module only does the I/O around it: planning and
writing through the engine, reading the mirror pod and the local process table, posting intents to the Lease
actor, saving the record once per transition, and reporting. Like kured it speaks to the cluster only through
its Node's annotations and events. The API adapters run in their own threads and feed the loop through its
event queue; while it runs, the loop never waits for the API (a control plane that is restarting, which is what
we cause, must not stop the file-level work). It does wait for its own file work, and, on the way out, for the
rollout Lease and the final report, each bounded by the grace period. ``patcher.services.runner.build_agent``
wires it.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import queue
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Final, Protocol

from patcher.adapters import fsio, signals
from patcher.adapters.health import Health, Metrics
from patcher.adapters.proc import LocalRestartTracker
from patcher.adapters.watch import FolderWatcher, file_fingerprint, folder_fingerprint
from patcher.core import extprobe, lifecycle, manifest, restart
from patcher.core.errors import ConfigError, PatcherError, StateFolderError
from patcher.core.lifecycle import Node
from patcher.core.schedconfig import RenderedConfig
from patcher.core.state import LastGood, State
from patcher.core.status import NodeState, NodeStatus
from patcher.services import engine, extcheck

log = logging.getLogger("patcher.services.agent")

# "source", "manifest" (a watched folder changed), "pod" (mirror pod update), "lease" (the Lease actor's
# snapshot changed), "daemonset" (what the agent knows of its DaemonSet changed), "attached" (the API adapters
# are there), "stop"
Event = str


class Reporter(Protocol):
    def publish(self, status: NodeStatus, *, reason: str | None = None, message: str | None = None) -> None: ...
    def note(self, reason: str, message: str, *, warning: bool = False) -> None: ...
    def flush(self, timeout: float) -> bool: ...


class PodSource(Protocol):
    def latest(self) -> dict[str, Any] | None: ...


class Coordinator(Protocol):
    """One manifest change at a time across the control plane (see ``patcher.services.rollout``): an actor whose
    methods never wait for the API, except ``settle``/``wait_held``/``close``, which are bounded."""

    held: bool
    refused_bad: bool
    current_holder: str | None
    api_answered: bool | None  # did its last round trip get an answer (None: none finished yet)

    @property
    def unanswered(self) -> bool: ...  # an intent posted and its round trip not ended

    def acquire(self, source_hash: str = "") -> bool: ...
    def release(self, *, bad_hash: str | None = None) -> None: ...
    def settle(self, timeout: float) -> bool: ...
    def wait_held(self, timeout: float) -> bool: ...
    def close(self, timeout: float) -> None: ...


class OwnerSource(Protocol):
    """What the agent knows of the DaemonSet that owns its pod (``patcher.adapters.kube.owner``)."""

    def view(self) -> lifecycle.DaemonSetView: ...
    def confirm(self, timeout: float) -> lifecycle.DaemonSetView: ...


#: How often a stop that waits for another node's rollout turn asks again (each ask must be answered within
#: the step's confirm wait, so an API that goes black meanwhile ends the wait within a second).
TURN_ASK_INTERVAL: Final = 0.25


@dataclass(frozen=True)
class AgentOptions:
    files: engine.Options
    node_name: str = ""
    resync_interval: float = 300.0
    restart_timeout: float = 600.0
    rollback_on_failure: bool = True
    restore_on_exit: lifecycle.RestoreOnExit = "auto"
    local_check: bool = False  # psutil on the node's process table (needs hostPID)
    debounce: float = 0.02  # quiet time after a folder event (open writers are waited for on top: watch.py)
    crash_restarts: int = 2  # restarts after our write that make a crash loop
    grace_period: float = 25.0  # budget for the shutdown path (the pod's grace period minus a margin)
    local_poll: float = 1.0
    lease_retry: float = 2.0  # how often a node waiting for the rollout lease asks again
    heartbeat: float = 15.0  # idle wake-up for /healthz (max age 60 s): a quarter of it, no more wake-ups
    check_extenders: bool = False  # probe the config's extenders before a manifest write (run: on)
    probe_retry: float = 2.0  # first retry of a failed pre-flight; doubles up to probe_retry_max
    probe_retry_max: float = 60.0
    extender_probe_interval: float = 60.0  # while Ready, probe the extenders this often (±20 %); 0: never
    state_retry: float = 2.0  # first retry of a state folder that refused the record; doubles up to state_retry_max
    state_retry_max: float = 60.0


def state_folder_message(exc: PatcherError) -> str:
    """The Node's sentence for a state folder that refused the record: the folder (or its file) and the kernel's
    answer, e.g. ``state folder unusable: /var/lib/scheduler-patcher/state.json: write failed: No space left
    on device``."""
    return f"state folder unusable: {exc}"


class Agent:
    def __init__(self, opts: AgentOptions, *, reporter: Reporter | None = None, pods: PodSource | None = None,
                 health: Health | None = None, metrics: Metrics | None = None,
                 fallback_version: Callable[[], str | None] = lambda: None,
                 coordinator: Coordinator | None = None,
                 on_phase: Callable[[NodeState], None] | None = None,
                 coordinated: bool | None = None, api_pending: bool = False,
                 events: queue.Queue[Event] | None = None) -> None:
        """``api_pending``: the API adapters are being built and come with ``attach`` (no restart verdict
        before that); ``coordinated``: take the rollout turn before a write (default: a coordinator given);
        ``events``: the queue the adapters were handed (``runner.build_agent`` makes it before them)."""
        self.opts = opts
        self.files = opts.files
        self.reporter = reporter
        self.pods = pods
        self.health = health or Health()
        self.metrics = metrics or Metrics()
        self.fallback_version = fallback_version
        self.coordinator = coordinator
        self.owner: OwnerSource | None = None  # set by ``attach`` when the agent knows its pod
        self._owner_said = ""
        self._stop_why: lifecycle.StopWhy = "signal"
        self._signal: int | None = None  # the stop signal received, until its log line is said (issue 26)
        self._written_first: tuple[engine.PreparedRestore, list[str] | PatcherError] | None = None
        self.on_phase = on_phase  # e.g. republish the cluster verdict
        self.rules = lifecycle.Options(restart_timeout=opts.restart_timeout,
                                       rollback_on_failure=opts.rollback_on_failure,
                                       coordinated=coordinator is not None if coordinated is None else coordinated,
                                       check_extenders=opts.check_extenders, probe_retry=opts.probe_retry,
                                       probe_retry_max=opts.probe_retry_max, state_retry=opts.state_retry,
                                       state_retry_max=opts.state_retry_max,
                                       restore_on_exit=opts.restore_on_exit, grace_period=opts.grace_period)
        self._api_pending = api_pending
        self._attached_event = threading.Event()
        self._exit_code = 0
        self._lease_retry_at: float | None = None
        self._probe_retry_at: float | None = None
        self._periodic_probe_at: float | None = None
        self._state_retry_at: float | None = None  # when to try the state folder again (CheckStateFolder)
        self._lock: contextlib.ExitStack | None = None  # holds the writer lock while run() runs, once taken
        self._lock_held = False
        self._probe_cancel = threading.Event()  # set on stop: a probe in flight is abandoned, never waited for
        self._probe_done: queue.Queue[lifecycle.Probed] = queue.Queue()
        self.events: queue.Queue[Event] = events if events is not None else queue.Queue()
        self.store = self.files.store()
        self._node = Node()
        self._saved: State | None = None
        self._plan: engine.Plan | None = None  # the plan an Apply action writes
        self._baseline = restart.Baseline()
        self._tracker: LocalRestartTracker | None = None
        self._pod_before: dict[str, Any] | None = None
        self._prepared: tuple[State, engine.PreparedRestore] | None = None  # the restore, planned while patched
        self.watcher: FolderWatcher | None = None
        self._stopping = threading.Event()
        self._next_resync = 0.0
        self._why = "start"  # what triggered the current reconcile (for the log lines of its writes)
        self._log_extra = {"node": opts.node_name or "-", "manifest": self.files.manifest_path}

    # -- the one state value --------------------------------------------------------------------------------

    @property
    def node(self) -> Node:
        return self._node

    @node.setter
    def node(self, value: Node) -> None:
        """The only place the lifecycle value changes: health (``/readyz``) and the state gauge follow it, so
        no path can set one without the other."""
        self._node = value
        phase = value.phase
        if phase is not None:
            self.health.set_state(phase.value)  # also the metrics' one-hot gauge when attached
            if self.health.metrics is not self.metrics:
                self.metrics.set_state(phase.value)

    @property
    def phase(self) -> NodeState | None:
        return self._node.phase

    @property
    def state(self) -> State:
        return self._node.record

    # -- inputs ---------------------------------------------------------------------------------------------

    def notify(self, event: Event) -> None:
        self.events.put(event)

    def attach(self, *, reporter: Reporter | None, pods: PodSource | None, coordinator: Coordinator | None,
               fallback_version: Callable[[], str | None], on_phase: Callable[[NodeState], None] | None,
               owner: OwnerSource | None = None) -> None:
        """Called from the thread that built the API adapters; the loop picks them up on the next event."""
        self.reporter, self.pods, self.coordinator, self.owner = reporter, pods, coordinator, owner
        self.fallback_version, self.on_phase = fallback_version, on_phase
        self._attached_event.set()
        self.notify("attached")

    def api_unavailable(self) -> None:
        """The API adapters will not come (no usable API config): stop with exit 1, and let the shutdown not
        wait for them to report (it would wait half the grace period for nothing)."""
        self._attached_event.set()
        self.request_stop(code=1, why="api-unavailable")

    def request_stop(self, code: int = 0, why: lifecycle.StopWhy = "signal") -> None:
        self._exit_code = self._exit_code or code
        if self._stopping.is_set():
            log.warning("second stop signal ignored: the restore is running and must finish", extra=self._log_extra)
            return
        self._stop_why = why
        self._stopping.set()
        self._probe_cancel.set()
        self.events.put("stop")

    def install_signal_handlers(self) -> None:
        """Stop on SIGTERM/SIGINT, including one that came before this call (while the process started)."""
        if signals.installed_at is None:
            signals.install()

        def on_signal(signum: int) -> None:
            # Nothing but the stop request here: the handler runs on the loop's thread, so every line of it
            # comes before the restore. The "received" line is said once the manifest is back (``_say_signal``):
            # as the handler's first write it cost SIGTERM -> restored a quarter of a millisecond (issue 26).
            if self._signal is None:
                self._signal = signum
            self.request_stop()

        signals.subscribe(on_signal)

    def _say_signal(self) -> None:
        """Log the stop signal received, once: after the restore's write (or before a stop that keeps)."""
        signum, self._signal = self._signal, None
        if signum is not None:
            log.info("received %s", signal.Signals(signum).name, extra=self._log_extra)

    def start_watching(self) -> None:
        fs = self.files.fs
        manifest_local = fs.local(self.files.manifest_path)
        watcher = FolderWatcher(self.events.put, debounce=self.opts.debounce)
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

    def start(self) -> bool:
        """Load the record, clean up after a killed writer, resume and reconcile once. False: a stop came
        while starting, and only the restore must follow."""
        try:
            record = self.store.load()
        except PatcherError as exc:
            log.error("state record unreadable, starting fresh: %s", exc, extra=self._log_extra)
            record = State()
        self._saved = None  # not yet proven: the first transition saves it, which tests the state folder
        self.node = Node(record=record)
        for leftover in engine.remove_stale_temp_files(self.files):
            log.info("removed %s, left by a writer that was killed mid-write", leftover, extra=self._log_extra)
        if self._stopping.is_set():
            # Stopped while starting: the manifest's state is known now (plan_restore reads it), so restore
            # what carries our marker, and write nothing new.
            log.info("stop requested during start-up; restoring without a reconcile", extra=self._log_extra)
            return False
        self._feed(lifecycle.Resumed(time.monotonic()))
        if self._node.fault is None:  # else the state folder's retry plans, once it works
            self.reconcile("start")
        if self.reporter is not None and self.phase is not None:  # a restarted agent re-asserts what it found
            self.reporter.publish(self._status(), reason="AgentStarted",
                                  message=f"scheduler-patcher started; the node is {self.phase.value}")
        return True

    def run(self) -> int:
        """Reconcile until stopped; then restore (unless told not to). Returns the process exit code.

        The node's writer lock is held for the agent's whole life: a CLI ``apply``/``restore`` run on the node
        meanwhile refuses in one line instead of racing the agent (the lock is reentrant for this thread). It
        lives in the state folder: when that cannot hold it, the agent runs on without it (and writes nothing),
        says so on the Node and takes it with the first save that works (``_hold_lock``)."""
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self.files.lock())
            except fsio.LockBusy as exc:
                self.metrics.error("lock")
                log.error("%s", exc, extra=self._log_extra)
                return 1
            except StateFolderError:
                pass  # the state folder cannot hold it: the first save says so on the Node, and retries
            else:
                self._lock_held = True
            self._lock = stack
            return self._run_locked()

    def _hold_lock(self) -> None:
        """Take the writer lock for the rest of ``run`` if it could not be taken at its start (the state folder
        was unusable), without waiting: another writer that took it meanwhile is a refusal, tried again later.
        Outside ``run`` (tests driving ``start``/``reconcile``) every engine call takes it for itself."""
        if self._lock is None or self._lock_held:
            return
        try:
            self._lock.enter_context(replace(self.files, lock_wait=0.0).lock())
        except fsio.LockBusy as exc:
            raise StateFolderError(exc.path, exc.problem) from None
        self._lock_held = True

    def _run_locked(self) -> int:
        if not self.start():
            return self.shutdown()
        while not self._stopping.is_set():
            self.health.beat()
            try:
                event = self.events.get(timeout=self._timeout())
            except queue.Empty:
                event = None
            if event == "stop" or self._stopping.is_set():
                break
            try:
                self._handle(event)
            except Exception as exc:  # a bug must not take the node's restore-on-exit down with it
                self.metrics.error("internal")
                log.error("internal error while handling %s: %s: %s", event or "timer", type(exc).__name__, exc,
                          extra=self._log_extra)
                log.debug("internal error", exc_info=True)
        return self.shutdown()

    def _handle(self, event: Event | None) -> None:
        if event in ("source", "manifest"):
            self.reconcile(f"{event} changed")
        elif event == "lease":
            self._turn_changed()
        elif event == "attached":
            self._attached()
        elif event == "daemonset":
            self._daemonset_changed()
        elif event == "probe":
            self._feed(self._probe_done.get_nowait())
        elif self._state_retry_at is not None and time.monotonic() >= self._state_retry_at:
            self._check_state_folder()
        elif self._node.fault is not None:
            pass  # nothing is planned while the record cannot be saved: the state folder's retry comes first
        elif time.monotonic() >= self._next_resync:
            self.reconcile("resync")
        elif self._probe_retry_at is not None and time.monotonic() >= self._probe_retry_at:
            self._probe_retry_at = None
            self.reconcile("extender probe retry")
        elif self._periodic_probe_at is not None and time.monotonic() >= self._periodic_probe_at:
            self._periodic_probe_at = None
            self._feed(lifecycle.ProbeDue(time.monotonic()))
        elif self._lease_retry_at is not None and time.monotonic() >= self._lease_retry_at:
            self.reconcile("rollout lease retry")
        self.check_restart()
        self._schedule_periodic_probe()

    def _schedule_periodic_probe(self) -> None:
        """While Ready and no probe runs: the next periodic probe, jittered so that agents started together do
        not call the extender together."""
        n, interval = self._node, self.opts.extender_probe_interval
        if not self.rules.check_extenders or interval <= 0 or n.phase != NodeState.READY or n.wait is not None:
            self._periodic_probe_at = None
        elif self._periodic_probe_at is None and not n.probing:
            self._periodic_probe_at = time.monotonic() + interval * random.uniform(0.8, 1.2)

    def _daemonset_changed(self) -> None:
        """The owner's watch saw a change: say (once per change) what a stop would do now."""
        if self.owner is None or self.rules.restore_on_exit != "auto":
            return
        view = self.owner.view()
        said = f"a stop keeps the patch: {view.successor()}" if view.successor() else f"a stop restores: {view.gone()}"
        if said != self._owner_said:
            self._owner_said = said
            log.info("%s", said, extra=self._log_extra)

    def _attached(self) -> None:
        self._api_pending = False
        log.info("API connected", extra=self._log_extra)
        if self.reporter is not None and self.phase is not None:  # a restarted agent re-asserts what it found
            self.reporter.publish(self._status(), reason="AgentStarted",
                                  message=f"scheduler-patcher started; the node is {self.phase.value}")
        n = self._node
        if self.reporter is not None and n.probe_failures and n.record.message:
            # The pre-flight failed before the API was there: its Warning was not sent, and a retry that fails
            # the same way sends none.
            self.reporter.note("ExtenderUnreachable", n.record.message, warning=True)
        if self._node.turn == "asked":  # asked while the Lease was not there yet
            self._take_turn("")
        self.reconcile("API connected")  # a pending write asks for its turn again, with its source

    def _timeout(self) -> float:
        now = time.monotonic()
        if self._node.fault is not None:
            # Only the state folder's retry acts while the record cannot be saved: the other timers stay due
            # (``_handle`` holds them back), and counting them woke the loop every 50 ms for the whole fault.
            retry = [] if self._state_retry_at is None else [self._state_retry_at - now]
            return max(0.05, min([self.opts.heartbeat, *retry]))
        wake = [self._next_resync - now, self.opts.heartbeat]
        if self._lease_retry_at is not None:
            wake.append(self._lease_retry_at - now)
        if self._probe_retry_at is not None:
            wake.append(self._probe_retry_at - now)
        if self._periodic_probe_at is not None:
            wake.append(self._periodic_probe_at - now)
        if self._state_retry_at is not None:
            wake.append(self._state_retry_at - now)
        w = self._node.wait
        if w is not None:
            # Past the deadline (a stale pod view gets one more timeout): the pod watch's update wakes the loop,
            # and the bound itself is the next timer, never a busy 50 ms loop.
            wake.append(w.deadline - now if now < w.deadline else w.deadline + self.opts.restart_timeout - now)
            if self._tracker is not None:
                wake.append(self.opts.local_poll)
        return max(0.05, min(wake))

    # -- feeding the lifecycle, executing its actions --------------------------------------------------------

    def _feed(self, event: lifecycle.Event, *, pending_config: str = "") -> None:
        node, actions = lifecycle.step(self._node, event, self.rules, pending_config=pending_config)
        before = self._node.phase
        # The record first: a phase is said (``/readyz``, the Node) only once it is recorded. Saving after the
        # actions let a Ready that the folder then refused reach /readyz and the Node before Failed did.
        refused, saved = self._save_first(node)
        if refused is not None:
            # Not through the setter: /readyz keeps what was recorded. Nothing is said or pruned for this
            # transition; the fault's transition says Failed, and this phase again once the folder works.
            self._node = node
            for action in actions:
                if not isinstance(action, (lifecycle.Publish, lifecycle.Prune)):
                    self._execute(action)
            # An action may have met the fault already (the apply), or saved a later transition since.
            if self._node.fault is None and self._node.record != self._saved:
                self._feed(lifecycle.StateFolderFailed(time.monotonic(), state_folder_message(refused)))
            return
        self.node = node
        for action in actions:
            self._execute(action)
        self._commit(before, saved)

    def _save_first(self, node: Node) -> tuple[PatcherError | None, bool]:
        """Save a transition's record before anything says its phase: (the state folder's refusal, saved)."""
        if node.record == self._saved or node.fault is not None:
            return None, False
        try:
            self._hold_lock()
            self.store.save(node.record)
        except StateFolderError as exc:
            return exc, False
        except PatcherError as exc:
            log.error("cannot save the state record: %s", exc, extra=self._log_extra)
            return None, False
        self._saved = node.record
        return None, True

    def _commit(self, before: NodeState | None, saved: bool = False) -> None:
        """Save the record once per transition (again when an action changed it after ``_save_first``), and
        tell whoever listens that the phase changed. A state folder that refuses it is a transition of its
        own (``StateFolderFailed``); while that lasts nothing is saved here: the folder's retry
        (``_check_state_folder``) is the one that tries."""
        refused: PatcherError | None = None
        if saved and (self._node.record == self._saved or self._node.fault is not None):
            if self._node.fault is None:
                self._prepare_restore()
        elif self._node.record != self._saved and self._node.fault is None:
            try:
                self._hold_lock()
                self.store.save(self._node.record)
                self._saved = self._node.record
            except StateFolderError as exc:
                refused = exc
            except PatcherError as exc:
                log.error("cannot save the state record: %s", exc, extra=self._log_extra)
            if refused is None:
                self._prepare_restore()
        if self._node.phase != before and self._node.phase is not None and self.on_phase is not None:
            self.on_phase(self._node.phase)
        if refused is not None:  # one level deep: with the fault set, this transition saves nothing
            self._feed(lifecycle.StateFolderFailed(time.monotonic(), state_folder_message(refused)))

    def _check_state_folder(self) -> None:
        """The retry: save the record as it stands (the writer lock first, when it could not be taken)."""
        self._state_retry_at = None
        try:
            self._hold_lock()
            self.store.save(self._node.record)
        except PatcherError as exc:
            self._feed(lifecycle.StateFolderFailed(time.monotonic(), state_folder_message(exc)))
            return
        self._saved = self._node.record
        self._feed(lifecycle.StateFolderOk(time.monotonic()))

    def _prepare_restore(self) -> None:
        """While patched, the restored bytes are known already: plan the restore now, so that on SIGTERM only
        the write remains. It is kept for this record only, and written only while the manifest is still byte
        for byte what we wrote (``engine.restore_prepared``); anything else is planned again at exit. The
        staged file of an earlier preparation is kept when it is still the same restore, removed otherwise."""
        record = self._node.record
        previous = self._prepared[1] if self._prepared is not None else None
        prepared = None
        if self.opts.restore_on_exit != "never" and record.patched:
            try:  # the restored bytes are staged beside the manifest: at SIGTERM the write is one rename
                prepared = engine.prepare_restore(self.files, stage=True, previous=previous)
            except PatcherError:
                prepared = None  # planned again at exit, where the refusal is reported
        if previous is not None and (prepared is None or prepared.staged != previous.staged):
            engine.discard(previous)
        self._prepared = (record, prepared) if prepared is not None else None

    def _execute(self, action: lifecycle.Action) -> None:
        match action:
            case lifecycle.Log(level=level, message=message):
                getattr(log, level)("%s", message, extra=self._log_extra)
            case lifecycle.Count(name=name):
                self._count(name)
            case lifecycle.Publish() | lifecycle.Note():
                self._report(action)
            case lifecycle.Apply():
                self._apply()
            case lifecycle.TakeTurn(source_hash=source_hash):
                self._take_turn(source_hash)
            case lifecycle.ReleaseTurn(bad_source=bad):
                self._release_turn(bad)
            case lifecycle.Watch():
                self._watch()
            case lifecycle.Prune():
                self._prune()
            case lifecycle.RollBack():
                self._rollback(action)
            case lifecycle.Replan():
                self.notify("manifest")
            case lifecycle.Probe(config_hash=config_hash):
                self._start_probe(config_hash)
            case lifecycle.RetryLater(delay=delay):
                self._probe_retry_at = time.monotonic() + delay
            case lifecycle.CheckStateFolder(delay=delay):
                self._state_retry_at = time.monotonic() + delay
            case lifecycle.Keep():
                self._keep(action)
            case lifecycle.Finish():
                self._finish(action)
            case lifecycle.Restore():
                raise AssertionError("a Restore is executed by shutdown(), which feeds its report back")

    def _report(self, action: lifecycle.Publish | lifecycle.Note) -> None:
        """To the Node's annotations and events; nothing before the API adapters are attached (the agent
        re-publishes its phase when they are)."""
        if self.reporter is None:
            return
        if isinstance(action, lifecycle.Publish):
            self.reporter.publish(self._status(), reason=action.reason)
        else:
            self.reporter.note(action.reason, action.message, warning=action.warning)

    def _release_turn(self, bad_source: str | None) -> None:
        self._lease_retry_at = None
        if self.coordinator is not None:
            self.coordinator.release(bad_hash=bad_source)
            log.info("rollout lease released", extra=self._log_extra)

    def _prune(self) -> None:
        """The new config is live: remove the previous one from the host folder (a failure leaves it for the
        next prune: the record still lists it)."""
        try:
            lines, record = engine.prune(self.files, self._node.record, keep_previous=False)
        except PatcherError as exc:
            log.warning("cannot remove the previous config yet: %s", exc, extra=self._log_extra)
            return
        self.node = replace(self._node, record=record)
        for line in lines:
            log.info("%s (config %s is live)", line, record.config_hash[:12], extra=self._log_extra)

    def _count(self, name: str) -> None:
        kind, _, arg = name.partition(":")
        if kind == "error":
            self.metrics.error(arg)
        elif kind == "restart_seen":
            self.metrics.restart_seen(float(arg))
        else:
            getattr(self.metrics, kind)()

    # -- observations ----------------------------------------------------------------------------------------

    def reconcile(self, why: str) -> None:
        """Plan the source against the manifest and feed what was found."""
        self._next_resync = time.monotonic() + self.opts.resync_interval  # any reconcile is a resync
        self._why = why
        now = time.monotonic()
        try:
            plan = engine.plan_apply(self.files, fallback_version=self.fallback_version(),
                                     bad_hashes=frozenset(self._node.record.bad_hashes))
        except engine.KnownBadConfig as exc:
            self._feed(lifecycle.Planned(now, "known-bad", message=str(exc)))
            return
        except PatcherError as exc:
            log.debug("refused", exc_info=True)
            self._feed(lifecycle.Planned(now, "refused", message=str(exc),
                                         error_kind="config" if isinstance(exc, ConfigError) else "manifest"))
            return
        except Exception as exc:  # issue 13: any failure of a reconcile is a refusal, never a crash
            log.debug("unexpected error while planning", exc_info=True)
            self._feed(lifecycle.Planned(now, "refused", message=f"{self.files.source}: {type(exc).__name__}: {exc}",
                                         error_kind="config"))
            return
        config = plan.config
        assert config is not None
        self._plan = plan
        if not plan.pending:
            self._feed(lifecycle.Planned(
                now, "up-to-date", config_hash=config.config_hash, config_file=config.main,
                api_version=config.api_version, files=tuple(sorted(config.files)), source_hash=plan.source_hash,
                current_sha256=engine.sha256(plan.current), unpatched_sha256=engine.sha256(plan.unpatched),
                mtime_ns=fsio.mtime_ns(plan.manifest_local) or 0))
            return
        self._feed(lifecycle.Planned(now, "pending", config_hash=config.config_hash, config_file=config.main,
                                     api_version=config.api_version, files=tuple(sorted(config.files)),
                                     source_hash=plan.source_hash,
                                     manifest_change=plan.manifest_change() is not None))

    def _apply(self) -> None:
        plan, self._plan = self._plan, None
        assert plan is not None and plan.config is not None
        self._lease_retry_at = None
        self._pod_before = self.pods.latest() if self.pods else None
        try:
            lines, record = engine.apply(self.files, plan, self._node.record)
        except fsio.ChangedUnderneath as exc:
            self._feed(lifecycle.WriteFailed(str(exc), changed_underneath=True))
            return
        except StateFolderError as exc:  # nothing was written: the write waits for the folder
            self._feed(lifecycle.StateFolderFailed(time.monotonic(), state_folder_message(exc)))
            return
        except PatcherError as exc:
            self._feed(lifecycle.WriteFailed(str(exc), changed_underneath=False))
            return
        if self.watcher:
            self.watcher.expect("manifest")
        for note in plan.notes:
            log.info("%s", note, extra=self._log_extra)
        for line in lines:
            log.info("%s (%s)", line, self._why,
                     extra={**self._log_extra, "hash": plan.config.short_hash})
        record = replace(record, source_hash=plan.source_hash)
        self._feed(lifecycle.Wrote(time.monotonic(), record, manifest_change=plan.manifest_change() is not None))

    def _start_probe(self, config_hash: str) -> None:
        """The pre-flight, in a thread of its own: the loop keeps beating and a SIGTERM is handled at once
        (the probe is cancelled, not awaited). The answer comes back as a "probe" event."""
        plan, cancel = self._plan, self._probe_cancel
        self._probe_retry_at = None
        if plan is not None and plan.config is not None and plan.config.config_hash == config_hash:
            config: RenderedConfig | None = plan.config  # the pre-flight: the config about to be written
        else:  # after the restart: the config that was written, read back from the host folder
            r = self._node.record
            config = engine.saved_config(self.files, LastGood(config_hash=r.config_hash, config_file=r.config_file,
                                                              files=r.files, api_version=r.api_version))
        if config is None or config.config_hash != config_hash:
            self._probe_done.put(lifecycle.Probed(time.monotonic(), config_hash, blocking=(
                f"the files of config {config_hash[:12]} cannot be read back to probe its extenders")))
            self.notify("probe")
            return

        def run(config: RenderedConfig = config) -> None:
            try:
                results = extcheck.check(self.files, config, cancel=cancel)
            except Exception as exc:  # a bug in the probe must not pass for an answer
                log.debug("extender probe failed", exc_info=True)
                answer = lifecycle.Probed(time.monotonic(), config_hash,
                                          blocking=f"extender probe failed: {type(exc).__name__}: {exc}")
            else:
                for result in results:
                    log.info("extender %s", result.line(), extra=self._log_extra)
                answer = lifecycle.Probed(time.monotonic(), config_hash,
                                          blocking=extprobe.summary(extprobe.blocking(results)),
                                          ignored=extprobe.summary(r for r in results if r.ignorable))
            self._probe_done.put(answer)
            self.notify("probe")

        threading.Thread(target=run, name="extender-probe", daemon=True).start()

    def _take_turn(self, source_hash: str) -> None:
        """Ask the Lease actor for the turn (never blocks); its answer comes back as a "lease" event."""
        c = self.coordinator
        if c is None:
            return  # not attached yet: asked again once it is
        if c.acquire(source_hash):
            self._turn_changed()
            return
        if c.refused_bad:
            self._turn_changed()
            return
        log.info("waiting for the rollout lease (held by %s)", c.current_holder or "?", extra=self._log_extra)
        self._lease_retry_at = time.monotonic() + self.opts.lease_retry

    def _turn_changed(self) -> None:
        c = self.coordinator
        if c is None or self._node.turn != "asked":
            return
        if c.held:
            self._lease_retry_at = None
            log.info("rollout lease acquired", extra=self._log_extra)
        pending = self._plan.config.config_hash if self._plan is not None and self._plan.config else ""
        self._feed(lifecycle.TurnChanged(held=c.held, refused_bad=c.refused_bad, holder=c.current_holder),
                   pending_config=pending)
        if c.refused_bad:
            self._lease_retry_at = None

    def _container(self) -> str:
        return self.files.container_name or "kube-scheduler"

    def _watch(self) -> None:
        """A fresh restart baseline and local tracker for the write the lifecycle now waits on."""
        w = self._node.wait
        assert w is not None
        if w.adopted:  # restarts that happened before we looked are not ours to judge (a lost election, say)
            self._baseline = restart.Baseline.of(self.pods.latest() if self.pods else None, self._container())
        else:
            self._baseline = restart.Baseline.of(self._pod_before, self._container())
        config_path = f"{self.files.host_config_dir}/{self._node.record.config_file}"
        self._tracker = LocalRestartTracker(config_path, w.written_ns) if self.opts.local_check else None
        self.check_restart()  # it may be proven already (or, with no check at all, taken as live)

    def check_restart(self) -> None:
        w = self._node.wait
        if w is None or (self.pods is None and self._api_pending):
            return  # the mirror pod will tell, once the API adapters are attached
        verdicts: list[tuple[restart.Verdict, str]] = []
        if self.pods is not None:
            decision = restart.decide(self.pods.latest(), marker_key=manifest.marker_key(self.files.prefix),
                                      expected_hash=w.config_hash, manifest_mtime_ns=w.written_ns,
                                      baseline=self._baseline, container_name=self._container(),
                                      min_restarts=self.opts.crash_restarts)
            verdicts.append((decision.verdict, decision.reason))
        if self._tracker is not None:  # the process table answers even while the API server is down
            check = self._tracker.poll()
            if check.starts > self.opts.crash_restarts:
                verdicts.append((restart.Verdict.CRASH_LOOPING, f"started {check.starts} times since our write"))
            else:
                verdicts.append((restart.Verdict.READY if check.ready else restart.Verdict.WAITING,
                                 f"local process: {check.reason}"))
        verdict, reason = lifecycle.combine(verdicts)
        blind = self._tracker is None and self.pods is not None and not getattr(self.pods, "fresh", True)
        self._feed(lifecycle.Observed(time.monotonic(), time.time_ns(), verdict, reason, blind=blind))
        if self._node.wait is None:
            self._tracker = None

    def _rollback(self, action: lifecycle.RollBack) -> None:
        """Back to the last Ready config when it still fits the manifest, else to the original."""
        record = self._node.record
        good_record = action.last_good
        good = engine.saved_config(self.files, good_record) if good_record is not None else None
        try:
            plan = (engine.plan_apply(self.files, config=good)
                    if good is not None and good.config_hash != action.config_hash else None)
            # The last Ready config was rendered for the manifest it ran with (version, flags). After an
            # upgrade it may be an apiVersion the new scheduler does not serve: then only the original is safe.
            if plan is not None and good_record is not None \
                    and engine.sha256(plan.unpatched) != good_record.original_sha256:
                log.warning("the manifest changed since config %s was Ready; rolling back to the original",
                            good_record.config_hash[:12], extra=self._log_extra)
                plan = None
            if plan is not None and good is not None and good_record is not None:
                if plan.pending:
                    _, record = engine.apply(self.files, plan, record)
                target = f"the last Ready config {good.short_hash}"
                record = replace(record, source_hash=good_record.source_hash)
            else:
                engine.restore(self.files, engine.plan_restore(self.files), keep_files=True)
                record = replace(record, patched_sha256="", config_hash="", source_hash="")
                target = "the original manifest"
        except PatcherError as exc:
            self._feed(lifecycle.RollbackFailed(str(exc), action.reason, action.bad_source))
            return
        if self.watcher:
            self.watcher.expect("manifest")
        mtime = fsio.mtime_ns(self.files.fs.local(self.files.fs.resolve(self.files.manifest_path)))
        record = replace(record, manifest_mtime_ns=mtime or record.manifest_mtime_ns)
        self._feed(lifecycle.RollbackDone(record, target, action.reason, action.bad_source))

    def _status(self) -> NodeStatus:
        phase = self.phase
        assert phase is not None
        r = self._node.record
        return NodeStatus(state=phase, config_hash=r.config_hash or None, source_hash=r.source_hash or None,
                          manifest_mtime_ns=r.manifest_mtime_ns or None,
                          restarted_at_ns=r.restarted_at_ns if phase == NodeState.READY else None,
                          message=r.message)

    # -- stopping: the lifecycle decides (``lifecycle.stop``), this executes ---------------------------------

    def shutdown(self) -> int:
        """Feed the stop to the lifecycle and execute what it answers, from one local queue: restore or keep,
        release the turn, report, each wait bounded by the deadlines the step computed. Returns the exit code."""
        now = time.monotonic()
        view = self._daemonset_view()  # with an owner in auto mode: one short API read, which decides
        self._restore_first(view)  # issue 26
        event: lifecycle.Event | None = lifecycle.Stop(now, self._stop_why, view)
        while event is not None:
            self.node, actions = lifecycle.step(self._node, event, self.rules)
            event = None
            for action in actions:
                if isinstance(action, lifecycle.Restore):
                    event = self._restore(action)  # its report is the next event, not a nested feed
                else:
                    self._say_signal()  # issue 26: said before anything but the restore's write
                    self._execute(action)
        self._say_signal()
        return self._exit_code

    def _restore_first(self, view: lifecycle.DaemonSetView) -> None:
        """Issue 26: when this stop restores (``lifecycle.restores``, the rule ``stop`` decides by) and no
        rollout turn is taken before a write, the prepared restore's write comes first, before the stop's
        transition is computed; its ``Restore`` action then finds it done. Anything unusual (nothing staged,
        a stale preparation, a refusal) is left to that action, which plans again and reports. On the loop's
        thread, holding the writer lock: it races no write of ours, like any other write of the loop."""
        p = self._prepared
        if (p is None or p[1].staged is None or self.rules.coordinated
                or (p[0] is not self._node.record and p[0] != self._node.record)
                or not lifecycle.restores(self.rules, view)):
            return
        try:
            self._written_first = (p[1], engine.restore_prepared(self.files, p[1]))
        except PatcherError as exc:  # the Restore action meets it as if it had written now
            self._written_first = (p[1], exc)

    def _daemonset_view(self) -> lifecycle.DaemonSetView:
        """What the agent knows of its DaemonSet now: the watch's view, refreshed by one short read (the
        pod's own deletion may race the watch event of an uninstall). Only ``auto`` reads it."""
        if self.rules.restore_on_exit != "auto":
            return lifecycle.DaemonSetView()
        if self.owner is None:
            why = "the API adapters are not there" if self._api_pending or self.reporter is None else (
                "the agent does not know its pod (POD_NAME, POD_NAMESPACE)")
            return lifecycle.DaemonSetView(detail=why)
        return self.owner.confirm(lifecycle.OWNER_LOOKUP)

    def _restore(self, action: lifecycle.Restore) -> lifecycle.RestoreDone:
        """Put back exactly what we changed, the prepared restore first; take the rollout turn before the
        manifest is written (within the action's bounds), and, holding it, wait for the restored scheduler."""
        try:
            prepared = self._prepared[1] if self._prepared and self._prepared[0] == self._node.record else None
            plan = prepared.plan if prepared is not None else engine.plan_restore(self.files)
            writes = any(c.kind == "manifest" for c in plan.changes)
            silent = self._turn_for_restore(action) if writes else False
            lines = self._restore_prepared(prepared) if prepared is not None else None
            if lines is None:
                if prepared is not None:  # the prepared plan is stale: plan from what is there now
                    plan = engine.plan_restore(self.files)
                try:
                    lines = engine.restore(self.files, plan)
                except fsio.ChangedUnderneath:  # rewritten since it was planned: plan from what is there now
                    lines = engine.restore(self.files, engine.plan_restore(self.files))
            self._say_signal()  # issue 26: the manifest is back; the signal's line comes first in the log
            for line in lines:
                log.info("%s (stopping)", line, extra=self._log_extra)
            if writes:
                silent = not self._wait_restored(action.restored_until) or silent
            if self._node.record.bad_hashes:  # a failed config stays failed for the next agent here
                try:
                    self.store.save(State(bad_hashes=self._node.record.bad_hashes))
                except PatcherError as exc:  # the manifest is restored: that is what the stop is for
                    log.warning("the manifest is restored, but the configs that failed here cannot be recorded "
                                "for the next agent: %s", exc, extra=self._log_extra)
        except PatcherError as exc:
            return lifecycle.RestoreDone(False, str(exc), held=self._holds_turn(), now=time.monotonic())
        return lifecycle.RestoreDone(True, held=self._holds_turn(), now=time.monotonic(), api_silent=silent)

    def _holds_turn(self) -> bool:
        return self.coordinator is not None and self.coordinator.held

    def _turn_for_restore(self, action: lifecycle.Restore) -> bool:
        """Best effort: hold the rollout Lease while restoring, so that deleting the DaemonSet restarts one
        scheduler at a time. Every request must be answered within ``confirm_wait``: no answer (the control
        plane is down or black-holed: no scheduler schedules then, nothing to serialise) means restore at
        once, also when the API goes black while another node holds the turn. While it answers "held by
        another", ask again until ``turn_until``; the restore itself always happens. True: the API did not
        answer."""
        c = self.coordinator
        if c is None or c.held:
            return False
        silent = True
        while True:
            c.acquire()
            if c.settle(action.confirm_wait):
                return False
            if c.unanswered:
                why = f"the API server did not answer within {action.confirm_wait:g} s"
                break
            if not c.api_answered:
                why = "the API server does not answer"
                break
            left = action.turn_until - time.monotonic()
            if left <= 0:
                why, silent = f"held by {c.current_holder or '?'} for the whole share of the grace period", False
                break
            if c.wait_held(min(TURN_ASK_INTERVAL, left)):
                return False  # another node restored first; our turn came
        log.warning("restoring without the rollout lease (%s)", why, extra=self._log_extra)
        return silent

    def _wait_restored(self, until: float) -> bool:
        """While holding the Lease, wait (until ``until``) for the scheduler to run the restored manifest. False:
        the mirror pod's view does not follow the API server (it does not answer): nothing to wait for."""
        if self.pods is None or not self._holds_turn():
            return True
        local = self.files.fs.local(self.files.fs.resolve(self.files.manifest_path))
        written = fsio.mtime_ns(local) or 0
        while time.monotonic() < until:
            if not getattr(self.pods, "fresh", True):
                log.warning("the mirror pod's view does not follow the API server; not waiting for the restored "
                            "scheduler", extra=self._log_extra)
                return False
            if restart.runs_unpatched(self.pods.latest(), marker_key=manifest.marker_key(self.files.prefix),
                                      manifest_mtime_ns=written, container_name=self._container()):
                return True
            time.sleep(0.1)
        log.warning("kube-scheduler not seen back on the restored manifest; releasing the rollout lease",
                    extra=self._log_extra)
        return True

    def _restore_prepared(self, prepared: engine.PreparedRestore) -> list[str] | None:
        """The restore planned while Ready: the manifest first, then the clean-up. None when the manifest is not
        what we wrote any more (a ``kubeadm upgrade`` since): nothing was written, and the caller plans again."""
        try:
            first = self._written_first  # issue 26: written by ``_restore_first`` already (or refused)
            if first is not None and first[0] is prepared:
                if isinstance(first[1], PatcherError):
                    raise first[1]
                lines = first[1]
            else:
                lines = engine.restore_prepared(self.files, prepared)
        except fsio.ChangedUnderneath:
            log.info("the manifest changed since the restore was prepared; planning it again",
                     extra=self._log_extra)
            return None
        return lines + engine.finish_restore(self.files, prepared)

    def _keep(self, action: lifecycle.Keep) -> None:
        """Leave everything for the successor: only the staged restore goes (hidden, and stale for it)."""
        if self._prepared is not None:
            engine.discard(self._prepared[1])
            self._prepared = None
        if self.reporter is not None:
            self.reporter.note("PatchKept", action.reason)

    def _finish(self, action: lifecycle.Finish) -> None:
        """Stop the folder watch, close the Lease (its release sent) and send the pending report, by
        ``action.until``."""
        self._exit_code = self._exit_code or action.code
        if self.watcher:  # after the restore: stopping it joins a thread, and the restore comes first
            self.watcher.stop()
        if self.coordinator is not None:  # the release within a share of what is left, the report gets the rest
            self.coordinator.close(max(0.2, 0.5 * (action.until - time.monotonic())))
        if self._api_pending and self.reporter is None:  # stopped while the API side was still being built:
            # the manifest is restored already; give the report a share of what is left of the grace period
            self._attached_event.wait(max(0.0, 0.5 * (action.until - time.monotonic())))
            if self.reporter is not None and self.phase == NodeState.RESTORED:
                self.reporter.publish(self._status())
        if self.reporter is not None and not self.reporter.flush(max(0.2, action.until - time.monotonic())):
            log.warning("could not publish the final state before the grace period ended", extra=self._log_extra)
