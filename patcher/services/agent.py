"""The node agent's executor: one thread that feeds ``patcher.core.lifecycle.step`` and executes its actions.

Every decision is in ``lifecycle``. Each transition's record is saved once before its phase is said, and no
action steps the lifecycle itself (one local queue), so the record and what the node says never disagree. The
loop never waits for the API; only the stop does, within the deadlines the step computed.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from patcher.adapters.health import Health, Metrics
from patcher.core import lifecycle
from patcher.core.lifecycle import LoopEvent, Node
from patcher.core.settings import Settings
from patcher.core.status import NodeState
from patcher.services import ports, reconcile
from patcher.services.observations import Observations
from patcher.services.ports import Coordinator, PodSource, Reporter
from patcher.services.record import REAL_FILE_OPS, FileOps, RecordKeeper, state_folder_message
from patcher.services.stopping import Stopping
from patcher.services.timers import Timers

log = logging.getLogger("patcher.services.agent")

__all__ = ["Agent"]


@dataclass(frozen=True)
class _Unsaved:
    """On the local queue after the events of a transition whose record the state folder refused: unless the
    fault is set already or a later transition saved the record, it is that transition's ``StateFolderFailed``."""

    message: str


class Agent:
    def __init__(self, settings: Settings, *, reporter: Reporter = ports.NO_REPORTER, pods: PodSource = ports.NO_PODS,
                 health: Health | None = None, metrics: Metrics | None = None,
                 coordinator: Coordinator = ports.NO_COORDINATOR,
                 on_phase: Callable[[NodeState], None] = lambda _: None,
                 coordinated: bool = False, api_pending: bool = False, learns_hold: bool = False,
                 events: queue.SimpleQueue[LoopEvent] | None = None, file_ops: FileOps = REAL_FILE_OPS) -> None:
        """``coordinated``: take the rollout turn before a write (from ``coordinator``); ``learns_hold``:
        nothing is written before the hold watch answered or ``Loop.hold_wait`` ran out; ``events``: the queue
        the adapters were handed; ``file_ops``: every file write of the agent; the rest: ``Observations``
        (none given: one that does nothing, ``ports``)."""
        self.files, self.opts = settings.files, settings.loop
        self.health, self.metrics = health or Health(), metrics or Metrics()
        self.rules = replace(settings.lifecycle, coordinated=coordinated)
        self._exit_code = 0
        self._learns_hold = learns_hold
        self._stop_why: lifecycle.StopWhy = "signal"
        self._signal: int | None = None  # the stop signal received, said when the stop begins
        self._stopping = threading.Event()
        # A SimpleQueue: the stop signal's handler puts on it from the loop's own thread, between any two
        # bytecodes; queue.Queue's put takes a non-reentrant lock its get may hold at that moment (deadlock).
        self.events: queue.SimpleQueue[LoopEvent] = events if events is not None else queue.SimpleQueue()
        self._node = Node()
        log_extra = {"node": settings.pod.node_name or "-", "manifest": self.files.manifest_path}
        self.log_extra, self.timers = log_extra, Timers()
        self.record = RecordKeeper(self.files, log_extra=log_extra, ops=file_ops)
        self.stopper = Stopping(self.files, self.record.store, log_extra=log_extra)
        self.world = Observations(settings, self.timers, self.record, node=lambda: self._node, notify=self.notify,
                                  metrics=self.metrics, log_extra=log_extra, api_pending=api_pending,
                                  reporter=reporter, pods=pods, coordinator=coordinator, on_phase=on_phase)

    @property
    def node(self) -> Node:
        return self._node

    @node.setter
    def node(self, value: Node) -> None:
        """The only place the lifecycle value changes: health (``/readyz``) and the state gauge follow it."""
        self._node = value
        if value.phase is not None:
            self.health.set_state(value.phase.value)
            self.metrics.set_state(value.phase.value)
            self.metrics.set_config(value.record.config_hash, value.record.source_hash)
        self.metrics.set_held(value.hold is not None)

    # -- inputs from other threads (``process`` installs the signals and starts the watch) --------------------

    def notify(self, event: LoopEvent) -> None:
        self.events.put(event)

    def request_stop(self, code: int = 0, why: lifecycle.StopWhy = "signal", *, signum: int | None = None) -> None:
        """From any thread or the signal handler (which runs on the loop's thread, between two bytecodes: it
        only puts on the queue; the loop ends after the event it is handling, and ``shutdown`` decides)."""
        self._exit_code = self._exit_code or code
        if self._stopping.is_set():
            log.warning("second stop signal ignored: the restore is running and must finish", extra=self.log_extra)
            return
        self._stop_why, self._signal = why, signum
        self._stopping.set()
        self.world.probe_cancel.set()
        self.events.put(LoopEvent.STOP)

    def api_unavailable(self) -> None:
        """The API adapters will not come (no usable API config): stop with exit 1, and let the shutdown not
        wait for them to report (it would wait half the grace period for nothing)."""
        self.world.attached_event.set()
        self.request_stop(code=1, why="api-unavailable")

    # -- the executor -------------------------------------------------------------------------------------------

    def loop(self, settled: Callable[[], object] | None = None) -> None:
        """One ``turn`` at a time, until stopped. ``settled`` is called once, the first time the loop would wait
        with nothing to do and no pre-flight running: what can wait (the probes' server) starts then."""
        while not self._stopping.is_set():
            self.health.beat()
            if settled is not None and self.events.empty() and not self._node.probing:
                then, settled = settled, None
                then()
            if self.turn(self.world.timeout(self.rules)) is LoopEvent.STOP:
                return

    def turn(self, timeout: float = 0.0) -> LoopEvent | None:
        """One turn of the loop: the next event on the queue, waiting at most ``timeout`` (none: the timers that
        are due), fed to the step. Returns it; ``STOP``: nothing was done, the loop ends."""
        try:
            event = self.events.get(timeout=timeout)
        except queue.Empty:
            event = None
        if event is LoopEvent.STOP or self._stopping.is_set():
            return LoopEvent.STOP
        try:
            for made in self.world.events(event, self.rules):  # made lazily: each is fed before the next is made
                self._feed(made)
        except Exception as exc:  # a bug must not take the node's restore-on-exit down with it
            self.metrics.error("internal")
            log.error("internal error while handling %s: %s: %s", event or "timer", type(exc).__name__, exc,
                      extra=self.log_extra)
            log.debug("internal error", exc_info=True)
        return event

    def start(self) -> bool:
        """Resume from the record and reconcile once. False: a stop came while starting; only the stop follows."""
        self.node = Node(record=self.record.load(), hold_known=not self._learns_hold)
        if self._learns_hold:
            self.timers.hold_wait_at = time.monotonic() + self.opts.hold_wait
            log.info("nothing is written before the node's hold is known (at most %gs)", self.opts.hold_wait,
                     extra=self.log_extra)
        if self._stopping.is_set():  # the manifest's state is known now: restore what carries our marker
            log.info("stop requested during start-up; restoring without a reconcile", extra=self.log_extra)
            return False
        self._feed(lifecycle.Resumed(time.monotonic()))
        if self._node.fault is None:  # else the state folder's retry plans, once it works
            self.reconcile("start")
        self.world.say_started()
        return True

    def reconcile(self, why: str) -> None:
        self._feed(self.world.plan(why))

    def _feed(self, first: lifecycle.Event | None) -> None:
        """Step ``first`` and every event its actions produce, in order, from one local queue."""
        todo: deque[lifecycle.Event | _Unsaved] = deque([first] if first is not None else [])
        while todo:
            item = todo.popleft()
            if isinstance(item, _Unsaved):
                if self._node.fault is not None or self._node.record == self.record.saved:
                    continue  # an action met the fault already, or a later transition saved the record
                item = lifecycle.StateFolderFailed(item.message)
            todo.extend(self._transition(item))

    def _transition(self, event: lifecycle.Event) -> list[lifecycle.Event | _Unsaved]:
        """One step: save its record (the one save of a transition), then say it and execute its actions.
        Returns the events they produced."""
        node, actions = lifecycle.step(self._node, event, self.rules)
        # What the cluster verdict reads of this node: its phase, and its message (Ready with a message is an
        # extender that stopped answering: NotReady for the cluster, though the phase stays Ready).
        before = (self._node.phase, self._node.record.message)
        if node.wait is None:
            self.world.restarts.forget()
        refused = self.record.save(node)  # the record first: a phase is said only once it is recorded
        if refused is not None:
            # Not through the setter: /readyz keeps what was recorded. Nothing is said or pruned for this
            # transition; the fault's transition says Failed, and this phase again once the folder works.
            self._node = node
            produced: list[lifecycle.Event | _Unsaved] = [
                e for a in actions if not isinstance(a, (lifecycle.Publish, lifecycle.Prune))
                and (e := self._execute(a)) is not None]
            return [*produced, _Unsaved(state_folder_message(refused))]
        self.node = node
        produced = [e for a in actions if (e := self._execute(a)) is not None]
        if (node.phase, node.record.message) != before and node.phase is not None:
            self.world.on_phase(node.phase)
        return produced

    def _execute(self, action: lifecycle.Action) -> lifecycle.Event | None:
        """Do one action; an action that observes something returns the event it produced."""
        w = self.world
        match action:
            case lifecycle.Log(level=level, message=message):
                getattr(log, level)("%s", message, extra=self.log_extra)
            case lifecycle.Count(name=name):
                self.metrics.count(name)
            case lifecycle.Error(kind=kind):
                self.metrics.error(kind)
            case lifecycle.RestartSeen(seconds=seconds):
                self.metrics.restart_seen(seconds)
            case lifecycle.Publish() | lifecycle.Note():
                w.report(action)
            case lifecycle.Apply():
                return w.apply()
            case lifecycle.TakeTurn(source_hash=source_hash):
                return w.take_turn(source_hash)
            case lifecycle.ReleaseTurn(bad_source=bad):
                w.release_turn(bad)
            case lifecycle.Watch():
                return w.watch()
            case lifecycle.Prune():
                pruned = reconcile.prune(self.files, self._node.record, log_extra=self.log_extra)
                w.expect_config()
                return pruned
            case lifecycle.CheckLastGood():
                return w.check_last_good(action)
            case lifecycle.RollBack():
                return w.roll_back(action)
            case lifecycle.Replan():
                self.notify(LoopEvent.REPLAN)
            case lifecycle.Probe(config_hash=config_hash):
                w.start_probe(config_hash)
            case lifecycle.RetryLater(timer=timer, delay=delay):
                self.timers.later(timer, delay)
            case lifecycle.Restore():
                return self.stopper.restore(action, self._node.record, w.coordinator, w.pods, w.leaders)
            case lifecycle.LetGo():
                self.record.let_go()
            case lifecycle.Reclaim():
                return lifecycle.Reclaimed(time.monotonic(), self.record.reclaim())
            case lifecycle.Finish():
                self._exit_code = self._exit_code or action.code
                w.finish(action)
        return None

    def shutdown(self) -> int:
        """Feed the stop to the lifecycle and execute what it answers; returns the exit code. Nothing is saved
        here: the record a stop leaves is the restore's (``stopping``)."""
        now = time.monotonic()
        if self._signal is not None:
            log.info("received %s", signal.Signals(self._signal).name, extra=self.log_extra)
        view = self.world.daemonset_view(self.rules)  # auto with an owner: one short read, within the deadline
        todo: deque[lifecycle.Event] = deque([lifecycle.Stop(now, self._stop_why, view)])
        while todo:
            self.node, actions = lifecycle.step(self._node, todo.popleft(), self.rules)
            for action in actions:
                if (event := self._execute(action)) is not None:
                    todo.append(event)
        return self._exit_code
