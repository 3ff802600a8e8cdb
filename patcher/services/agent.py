"""The node agent's executor: one thread that observes, feeds ``patcher.core.lifecycle.step`` and executes its
actions.

Every decision is in ``patcher.core.lifecycle`` (pure); this module only runs the loop and dispatches. The loop
takes one event at a time from its queue (the folder watch, the API adapters, the probe thread and the agent
itself put them there) and turns it into lifecycle events; ``_feed`` steps each lifecycle event and every event
its actions produce from one local queue: an action that observes something (a write, a rollback, a prune, the
restart check, the Lease's answer, the restore) returns its event instead of feeding the step itself, so each
transition is saved once, before its phase is said, and before the next one begins. The file work lives in
``patcher.services.patching``, the restart checks in ``restartwatch``, the restore on exit in ``stopping``, the
extender probe in ``extcheck``. Like kured it speaks to the cluster only through its Node's annotations and
events. While it runs, the loop never waits for the API (a control plane that is restarting, which is what we
cause, must not stop the file-level work). It does wait for its own file work, and, on the way out, for the
rollout Lease and the final report, each bounded by the deadlines the step computed from the grace period.
``patcher.services.runner.build_agent`` wires it.
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
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from patcher.adapters import fsio, signals
from patcher.adapters.health import Health, Metrics
from patcher.adapters.watch import FolderWatcher, file_fingerprint, folder_fingerprint
from patcher.core import lifecycle
from patcher.core.errors import PatcherError, StateFolderError
from patcher.core.lifecycle import Node
from patcher.core.schedconfig import RenderedConfig
from patcher.core.settings import Settings
from patcher.core.state import LastGood, State
from patcher.core.status import NodeState, NodeStatus
from patcher.services import engine, extcheck, patching
from patcher.services.patching import state_folder_message
from patcher.services.ports import Coordinator, OwnerSource, PodSource, Reporter
from patcher.services.restartwatch import RestartWatch
from patcher.services.stopping import Stopping
from patcher.services.timers import Timers

log = logging.getLogger("patcher.services.agent")

__all__ = ["Agent", "Coordinator", "Event", "OwnerSource", "PodSource", "Reporter",
           "state_folder_message"]

#: The loop's events: "source", "manifest" (a watched folder changed), "pod" (mirror pod update), "lease" (the
#: Lease actor's snapshot changed), "daemonset" (what the agent knows of its DaemonSet changed), "attached" (the
#: API adapters are there), "probe" (a probe's answer is in ``_probe_done``), "replan" (the step's ``Replan``:
#: plan again), "stop"; None: a timer is due.
Event = str


@dataclass(frozen=True)
class _Unsaved:
    """On the local queue after the events of a transition whose record the state folder refused: unless the
    fault is set already or a later transition saved the record, it is that transition's ``StateFolderFailed``."""

    message: str


class Agent:
    def __init__(self, settings: Settings, *, reporter: Reporter | None = None, pods: PodSource | None = None,
                 health: Health | None = None, metrics: Metrics | None = None,
                 fallback_version: Callable[[], str | None] = lambda: None,
                 coordinator: Coordinator | None = None,
                 on_phase: Callable[[NodeState], None] | None = None,
                 coordinated: bool | None = None, api_pending: bool = False,
                 events: queue.SimpleQueue[Event] | None = None) -> None:
        """``api_pending``: the API adapters are being built and come with ``attach`` (no restart verdict
        before that); ``coordinated``: take the rollout turn before a write (default: a coordinator given);
        ``events``: the queue the adapters were handed (``runner.build_agent`` makes it before them)."""
        self.opts = settings.loop
        self.files = settings.files
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
        self.on_phase = on_phase  # e.g. republish the cluster verdict
        self.rules = replace(settings.lifecycle,
                             coordinated=coordinator is not None if coordinated is None else coordinated)
        self._api_pending = api_pending
        self._attached_event = threading.Event()
        self._exit_code = 0
        self.timers = Timers()  # resync, Lease retry, probe retry, periodic probe, state folder retry
        self._lock: contextlib.ExitStack | None = None  # holds the writer lock while run() runs, once taken
        self._lock_held = False
        self._probe_cancel = threading.Event()  # set on stop: a probe in flight is abandoned, never waited for
        self._probe_done: queue.Queue[lifecycle.Probed] = queue.Queue()
        # A SimpleQueue: the stop signal's handler puts on it from the loop's own thread, between any two
        # bytecodes; queue.Queue's put takes a non-reentrant lock its get may hold at that moment (deadlock).
        self.events: queue.SimpleQueue[Event] = events if events is not None else queue.SimpleQueue()
        self.store = engine.state_store(self.files)
        self._node = Node()
        self._saved: State | None = None
        self._plan: engine.Plan | None = None  # the plan an Apply action writes
        self._rollback_plan: engine.Plan | None = None  # CheckLastGood's plan, which RollBack(last-good) writes
        self._pod_before: dict[str, Any] | None = None
        self.watcher: FolderWatcher | None = None
        self._stopping = threading.Event()
        self._why = "start"  # what triggered the current reconcile (for the log lines of its writes)
        self._log_extra = {"node": settings.pod.node_name or "-", "manifest": self.files.manifest_path}
        self.restarts = RestartWatch(self.files, local_check=self.opts.local_check,
                                     crash_restarts=self.opts.crash_restarts)
        self.stopper = Stopping(self.files, self.store, log_extra=self._log_extra)
        self.stopper.restored_hook = self._say_signal

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
        fs = engine.host_fs(self.files)
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

    # -- start-up ---------------------------------------------------------------------------------------------

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
                stack.enter_context(engine.writer_lock(self.files))
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
            self._lock.enter_context(engine.writer_lock(replace(self.files, lock_wait=0.0)))
        except fsio.LockBusy as exc:
            raise StateFolderError(exc.path, exc.problem) from None
        self._lock_held = True

    # -- the loop and its dispatch ---------------------------------------------------------------------------

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
        """One loop event; then the restart check (it reads the mirror pod and the process table) and the
        periodic probe's timer, whatever the event was."""
        if event in ("source", "manifest"):
            self.reconcile(f"{event} changed")
        elif event == "replan":
            self.reconcile("re-plan")
        elif event == "lease":
            self._feed(self._turn_changed())
        elif event == "attached":
            self._attached()
        elif event == "daemonset":
            self._daemonset_changed()
        elif event == "probe":
            self._feed(self._probe_done.get_nowait())
        elif event == "pod" or event is None:  # a pod update also runs a due timer: a busy pod must not starve it
            self._timers()
        else:
            raise AssertionError(f"unknown loop event {event!r}")
        self.check_restart()
        self._schedule_periodic_probe()

    def _feed(self, first: lifecycle.Event | None) -> None:
        """Step ``first`` and every event its actions produce, in order, from one local queue (no action feeds
        the step itself). The restore is prepared once, for the record the queue ends with."""
        todo: deque[lifecycle.Event | _Unsaved] = deque([first] if first is not None else [])
        saved = False
        while todo:
            item = todo.popleft()
            if isinstance(item, _Unsaved):
                if self._node.fault is not None or self._node.record == self._saved:
                    continue  # an action met the fault already, or a later transition saved the record
                item = lifecycle.StateFolderFailed(time.monotonic(), item.message)
            produced, did_save = self._transition(item)
            saved = saved or did_save
            todo.extend(produced)
        if saved and self._node.fault is None:
            self._prepare_restore()

    def _transition(self, event: lifecycle.Event) -> tuple[list[lifecycle.Event | _Unsaved], bool]:
        """One step: save its record (the one save of a transition), then say it and execute its actions.
        Returns the events they produced and whether the record was saved."""
        node, actions = lifecycle.step(self._node, event, self.rules)
        before = self._node.phase
        if node.wait is None:
            self.restarts.forget()
        # The record first: a phase is said (``/readyz``, the Node) only once it is recorded.
        refused, saved = self._save(node)
        if refused is not None:
            # Not through the setter: /readyz keeps what was recorded. Nothing is said or pruned for this
            # transition; the fault's transition says Failed, and this phase again once the folder works.
            self._node = node
            produced: list[lifecycle.Event | _Unsaved] = [
                e for a in actions if not isinstance(a, (lifecycle.Publish, lifecycle.Prune))
                and (e := self._execute(a)) is not None]
            return [*produced, _Unsaved(state_folder_message(refused))], False
        self.node = node
        produced = [e for a in actions if (e := self._execute(a)) is not None]
        if node.phase != before and node.phase is not None and self.on_phase is not None:
            self.on_phase(node.phase)
        return produced, saved

    def _execute(self, action: lifecycle.Action) -> lifecycle.Event | None:
        """Do one action; an action that observes something returns the event it produced."""
        match action:
            case lifecycle.Log(level=level, message=message):
                getattr(log, level)("%s", message, extra=self._log_extra)
            case lifecycle.Count(name=name):
                getattr(self.metrics, name)()
            case lifecycle.Error(kind=kind):
                self.metrics.error(kind)
            case lifecycle.RestartSeen(seconds=seconds):
                self.metrics.restart_seen(seconds)
            case lifecycle.Publish() | lifecycle.Note():
                self._report(action)
            case lifecycle.Apply():
                return self._apply()
            case lifecycle.TakeTurn(source_hash=source_hash):
                return self._take_turn(source_hash)
            case lifecycle.ReleaseTurn(bad_source=bad):
                self._release_turn(bad)
            case lifecycle.Watch():
                return self._watch()
            case lifecycle.Prune():
                return patching.prune(self.files, self._node.record, log_extra=self._log_extra)
            case lifecycle.CheckLastGood():
                answer, self._rollback_plan = patching.check_last_good(self.files, action)
                return answer
            case lifecycle.RollBack():
                plan, self._rollback_plan = self._rollback_plan, None
                return patching.roll_back(self.files, action, plan, self._node.record, expect=self._expect_manifest)
            case lifecycle.Replan():
                self.notify("replan")
            case lifecycle.Probe(config_hash=config_hash):
                self._start_probe(config_hash)
            case lifecycle.RetryLater(delay=delay):
                self.timers.probe_retry_at = time.monotonic() + delay
            case lifecycle.CheckStateFolder(delay=delay):
                self.timers.state_retry_at = time.monotonic() + delay
            case lifecycle.Restore():
                return self.stopper.restore(action, self._node.record, self.coordinator, self.pods)
            case lifecycle.Keep():
                self.stopper.keep(action, self.reporter)
            case lifecycle.Finish():
                self._finish(action)
        return None

    def shutdown(self) -> int:
        """Feed the stop to the lifecycle and execute what it answers, from one local queue: restore or keep,
        release the turn, report, each wait bounded by the deadlines the step computed. Nothing is saved here:
        the record the stop leaves is the restore's (``stopping``). Returns the exit code."""
        now = time.monotonic()
        view = self._daemonset_view()  # with an owner in auto mode: one short API read, which decides
        self._restore_first(view)  # issue 26
        todo: deque[lifecycle.Event] = deque([lifecycle.Stop(now, self._stop_why, view)])
        while todo:
            self.node, actions = lifecycle.step(self._node, todo.popleft(), self.rules)
            for action in actions:
                if not isinstance(action, lifecycle.Restore):
                    self._say_signal()  # issue 26: said before anything but the restore's write
                if (event := self._execute(action)) is not None:
                    todo.append(event)
        self._say_signal()
        return self._exit_code

    # -- timers and the loop's own events ------------------------------------------------------------------

    def _timers(self) -> None:
        """Run the one timer that is due, if any (``timers.Timers.due``)."""
        now = time.monotonic()
        match self.timers.due(now, fault=self._node.fault is not None):
            case "state-folder":
                self._check_state_folder()
            case "resync":
                self.reconcile("resync")
            case "probe-retry":
                self.reconcile("extender probe retry")
            case "periodic-probe":
                self._feed(lifecycle.ProbeDue(now))
            case "lease-retry":
                self.reconcile("rollout lease retry")

    def _timeout(self) -> float:
        """How long the loop may sleep: the next timer, the heartbeat, and while a write waits for its restart
        its deadline (past it, a stale pod view gets one more timeout: the pod watch's update wakes the loop,
        and the bound itself is the next timer, never a busy 50 ms loop) and the local tracker's poll."""
        now, w = time.monotonic(), self._node.wait
        also: tuple[float, ...] = ()
        if w is not None:
            also = (w.deadline if now < w.deadline else w.deadline + self.rules.restart_timeout,
                    *((now + self.opts.local_poll,) if self.restarts.polling else ()))
        return self.timers.timeout(now, fault=self._node.fault is not None, heartbeat=self.opts.heartbeat, also=also)

    def _schedule_periodic_probe(self) -> None:
        """While Ready and no probe runs: the next periodic probe, jittered so that agents started together do
        not call the extender together."""
        n, interval = self._node, self.opts.extender_probe_interval
        if not self.rules.check_extenders or interval <= 0 or n.phase != NodeState.READY or n.wait is not None:
            self.timers.periodic_probe_at = None
        elif self.timers.periodic_probe_at is None and not n.probing:
            self.timers.periodic_probe_at = time.monotonic() + interval * random.uniform(0.8, 1.2)

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
            self._feed(self._take_turn(""))
        self.reconcile("API connected")  # a pending write asks for its turn again, with its source

    # -- the record: one save per transition ------------------------------------------------------------------

    def _save(self, node: Node) -> tuple[PatcherError | None, bool]:
        """Save a transition's record before anything says its phase: (the state folder's refusal, saved). A
        state folder that refuses it is a transition of its own (``StateFolderFailed``); while that lasts
        nothing is saved here: the folder's retry (``_check_state_folder``) is the one that tries."""
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

    def _check_state_folder(self) -> None:
        """The retry: save the record as it stands (the writer lock first, when it could not be taken)."""
        self.timers.state_retry_at = None
        try:
            self._hold_lock()
            self.store.save(self._node.record)
        except PatcherError as exc:
            self._feed(lifecycle.StateFolderFailed(time.monotonic(), state_folder_message(exc)))
            return
        self._saved = self._node.record
        self._feed(lifecycle.StateFolderOk(time.monotonic()))

    def _prepare_restore(self) -> None:
        """While patched, plan the restore now, so that on SIGTERM only the write remains (``stopping``)."""
        self.stopper.prepare(self._node.record, enabled=self.rules.restore_on_exit != "never")

    @property
    def _prepared(self) -> tuple[State, engine.PreparedRestore] | None:
        return self.stopper.prepared

    # -- the executors of the actions that stay here ---------------------------------------------------------

    def reconcile(self, why: str) -> None:
        """Plan the source against the manifest and feed what was found (a refusal keeps the last plan)."""
        self.timers.resync = time.monotonic() + self.opts.resync_interval  # any reconcile is a resync
        self._why = why
        planned, plan = patching.plan(self.files, fallback_version=self.fallback_version(),
                                      bad_hashes=frozenset(self._node.record.bad_hashes))
        if plan is not None:
            self._plan = plan
        self._feed(planned)

    def _apply(self) -> lifecycle.Event:
        plan, self._plan = self._plan, None
        assert plan is not None and plan.config is not None
        self.timers.lease_retry_at = None
        self._pod_before = self.pods.latest() if self.pods else None
        return patching.apply(self.files, plan, self._node.record, why=self._why, expect=self._expect_manifest,
                              log_extra=self._log_extra)

    def _expect_manifest(self) -> None:
        if self.watcher:
            self.watcher.expect("manifest")

    def _watch(self) -> lifecycle.Observed | None:
        """A fresh restart baseline and local tracker for the write the lifecycle now waits on, and its first
        look (it may be proven already, or, with no check at all, taken as live)."""
        w = self._node.wait
        assert w is not None
        pod_now = self.pods.latest() if self.pods and w.adopted else None
        self.restarts.start(w, self._node.record.config_file, pod_now=pod_now, pod_before=self._pod_before)
        return self._observe()

    def check_restart(self) -> None:
        self._feed(self._observe())

    def _observe(self) -> lifecycle.Observed | None:
        w = self._node.wait
        if w is None or (self.pods is None and self._api_pending):
            return None  # the mirror pod will tell, once the API adapters are attached
        return self.restarts.observe(w, self.pods)

    def _take_turn(self, source_hash: str) -> lifecycle.TurnChanged | None:
        """Ask the Lease actor for the turn (never blocks); its answer comes back as a "lease" event, or at once."""
        c = self.coordinator
        if c is None:
            return None  # not attached yet: asked again once it is
        if c.acquire(source_hash) or c.refused_bad:
            return self._turn_changed()
        log.info("waiting for the rollout lease (held by %s)", c.current_holder or "?", extra=self._log_extra)
        self.timers.lease_retry_at = time.monotonic() + self.opts.lease_retry
        return None

    def _turn_changed(self) -> lifecycle.TurnChanged | None:
        c = self.coordinator
        if c is None or self._node.turn != "asked":
            return None
        if c.held:
            log.info("rollout lease acquired", extra=self._log_extra)
        if c.held or c.refused_bad:
            self.timers.lease_retry_at = None
        pending = self._plan.config.config_hash if self._plan is not None and self._plan.config else ""
        return lifecycle.TurnChanged(held=c.held, refused_bad=c.refused_bad, holder=c.current_holder,
                                     config_hash=pending)

    def _start_probe(self, config_hash: str) -> None:
        """The pre-flight (or the canary probe after the restart), in its own thread; the answer comes back as a
        "probe" event."""
        plan = self._plan
        self.timers.probe_retry_at = None
        if plan is not None and plan.config is not None and plan.config.config_hash == config_hash:
            config: RenderedConfig | None = plan.config  # the pre-flight: the config about to be written
        else:  # after the restart: the config that was written, read back from the host folder
            r = self._node.record
            config = engine.saved_config(self.files, LastGood(config_hash=r.config_hash, config_file=r.config_file,
                                                              files=r.files, api_version=r.api_version))
        if config is None or config.config_hash != config_hash:
            self._probed(lifecycle.Probed(time.monotonic(), config_hash, blocking=(
                f"the files of config {config_hash[:12]} cannot be read back to probe its extenders")))
            return
        extcheck.start_probe(self.files, config, cancel=self._probe_cancel, done=self._probed,
                             log_extra=self._log_extra)

    def _probed(self, answer: lifecycle.Probed) -> None:
        self._probe_done.put(answer)
        self.notify("probe")

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
        self.timers.lease_retry_at = None
        if self.coordinator is not None:
            self.coordinator.release(bad_hash=bad_source)
            log.info("rollout lease released", extra=self._log_extra)

    def _status(self) -> NodeStatus:
        phase = self.phase
        assert phase is not None
        r = self._node.record
        return NodeStatus(state=phase, config_hash=r.config_hash or None, source_hash=r.source_hash or None,
                          manifest_mtime_ns=r.manifest_mtime_ns or None,
                          restarted_at_ns=r.restarted_at_ns if phase == NodeState.READY else None,
                          message=r.message)

    # -- the stop: ``lifecycle.stop`` decides, ``stopping`` restores or keeps ---------------------------------

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
        self.stopper.write_first(p[1])

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
