"""What the agent's thread sees, as ``lifecycle`` events: the loop's events and the answers of the actions that
observe. It holds what the API side handed the agent (``attach``) and what the observations carry forward (the
plan an ``Apply`` writes, the rollback's plan, the restart baseline, the timers); what the step says back to the
cluster goes through the same adapters. Nothing here steps the lifecycle: the executor feeds what comes back.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, assert_never

from patcher.adapters.extprobe import start_probe
from patcher.adapters.health import Metrics
from patcher.adapters.kubelet import KubeletHealth
from patcher.core import extprobe, lifecycle
from patcher.core.lifecycle import LoopEvent, Node
from patcher.core.schedconfig import RenderedConfig
from patcher.core.settings import Lifecycle, Settings
from patcher.core.state import LastGood, State
from patcher.core.status import NodeState, NodeStatus
from patcher.services import nodefiles, reconcile
from patcher.services.ports import (
    NO_LEADER,
    NOT_ATTACHED,
    Coordinator,
    HoldSource,
    LeaderSource,
    NoHold,
    NoWatcher,
    OwnerSource,
    PodSource,
    Reporter,
    Watcher,
)
from patcher.services.record import RecordKeeper
from patcher.services.restartwatch import RestartWatch
from patcher.services.timers import Timers

log = logging.getLogger("patcher.services.agent")


def node_status(node: Node) -> NodeStatus:
    """The Node's annotations for ``node`` (it has a phase, or is held: then the hashes the record last said,
    though the operator may have changed the files)."""
    r = node.record
    state = NodeState.HELD if node.hold is not None else node.phase
    assert state is not None
    return NodeStatus(state=state, config_hash=r.config_hash or None, source_hash=r.source_hash or None,
                      manifest_mtime_ns=r.manifest_mtime_ns or None,
                      restarted_at_ns=r.restarted_at_ns if state == NodeState.READY else None,
                      message=r.message if node.hold is None else lifecycle.held_message(node.hold))


class Observations:
    def __init__(self, settings: Settings, timers: Timers, record: RecordKeeper, *, node: Callable[[], Node],
                 notify: Callable[[LoopEvent], None], metrics: Metrics, log_extra: dict[str, str], api_pending: bool,
                 reporter: Reporter, pods: PodSource, coordinator: Coordinator,
                 on_phase: Callable[[NodeState], None]) -> None:
        """``node``: the executor's value as it is now; ``notify``: the loop queue's put; ``api_pending``: the
        API adapters are being built and come with ``attach`` (no restart verdict before that)."""
        self.files, self.opts, self.timers, self.record = settings.files, settings.loop, timers, record
        self.current, self.notify, self.metrics, self._log_extra = node, notify, metrics, log_extra
        self.reporter, self.pods, self.coordinator, self.on_phase = reporter, pods, coordinator, on_phase
        self.owner: OwnerSource = NOT_ATTACHED
        self.holds: HoldSource = NoHold()
        self.leaders: LeaderSource = NO_LEADER
        self.attached = False  # the API adapters are there (``attach``)
        self.fallback_version: Callable[[], str | None] = lambda: None  # the API server's version, once attached
        self.api_pending = api_pending
        self.attached_event = threading.Event()
        self._owner_said = ""
        self.probe_cancel = threading.Event()  # set on stop: a probe in flight is abandoned, never waited for
        self._probe_answers: queue.Queue[lifecycle.Probed] = queue.Queue()
        self._plan: nodefiles.Plan | None = None  # the plan an Apply action writes
        self._rollback_plan: nodefiles.Plan | None = None  # CheckLastGood's plan, which RollBack(last-good) writes
        self._pod_before: dict[str, Any] | None = None
        self._why = "start"  # what triggered the current reconcile (for the log lines of its writes)
        self.watcher: Watcher = NoWatcher()
        self.kubelet = KubeletHealth(self.opts.kubelet_healthz, log_extra=log_extra)
        self.restarts = RestartWatch(self.files, local_check=self.opts.local_check,
                                     crash_restarts=self.opts.crash_restarts,
                                     settle=settings.lifecycle.restart_settle, kubelet_down=self.kubelet.down)

    def attach(self, *, reporter: Reporter, pods: PodSource, coordinator: Coordinator,
               fallback_version: Callable[[], str | None], on_phase: Callable[[NodeState], None],
               owner: OwnerSource, holds: HoldSource, leaders: LeaderSource = NO_LEADER,
               announce: bool = True) -> None:
        """Called from the thread that built the API adapters; the loop picks them up on the next event (not
        ``announce``: adapters there from the start, before ``Agent.start``, which says everything once)."""
        self.reporter, self.pods, self.coordinator, self.owner = reporter, pods, coordinator, owner
        self.holds, self.leaders = holds, leaders
        self.attached = True
        self.fallback_version, self.on_phase = fallback_version, on_phase
        if announce:
            self.notify(LoopEvent.ATTACHED)

    def started(self) -> None:
        """The attached adapters run: a report handed to them now is delivered (``finish`` waits for this, not for
        ``attach``, which comes first so that an adapter's first event finds the agent holding it)."""
        self.attached_event.set()

    # -- the loop's events ------------------------------------------------------------------------------------

    def events(self, event: LoopEvent | None, rules: Lifecycle) -> Iterator[lifecycle.Event | None]:
        """One loop event (None: a timer is due) as lifecycle events, lazily (a re-plan reads the record the turn
        left); then, whatever the event, the restart check and the periodic probe's timer."""
        match event:
            case LoopEvent.SOURCE | LoopEvent.MANIFEST:
                yield self.plan(f"{event} changed")
            case LoopEvent.CONFIG:
                yield self.plan("config folder changed")
            case LoopEvent.REPLAN:
                yield self.plan("re-plan")
            case LoopEvent.LEASE:
                yield self.turn_changed()
            case LoopEvent.ATTACHED:
                yield from self._attached()
            case LoopEvent.DAEMONSET:
                self._daemonset_changed(rules)
            case LoopEvent.HOLD:
                yield self.hold_changed()
            case LoopEvent.PROBE:
                yield self._probe_answers.get_nowait()
            case LoopEvent.POD | None:  # a pod update also runs a due timer: a busy pod must not starve it
                yield from self._due()
            case LoopEvent.STOP:  # the loop ends at it; nothing to observe
                return
            case _ as unknown:
                assert_never(unknown)
        yield self.observe()
        self._schedule_periodic_probe(rules)
        if self.current().hold_known:
            self.timers.hold_wait_at = None

    def _due(self) -> Iterator[lifecycle.Event]:
        match self.timers.due(time.monotonic(), fault=self.current().fault is not None):
            case "hold-wait":
                yield lifecycle.HoldUnknown(self.opts.hold_wait)
            case "state-folder":
                yield self.record.retry(self.current().record)  # the state folder's retry
            case "resync":
                yield self.plan("resync")
            case "probe-retry":
                yield self.plan("extender probe retry")
            case "periodic-probe":
                yield lifecycle.ProbeDue()
            case "lease-retry":
                yield self.plan("rollout lease retry")

    def timeout(self, rules: Lifecycle) -> float:
        """How long the loop may sleep: the next timer, the heartbeat, and while a write waits for its restart
        its deadline (past it, the bound of a blind view or a kubelet seen down: never a busy loop), the local
        poll and the settle end."""
        now, n = time.monotonic(), self.current()
        w = n.wait
        also: tuple[float | None, ...] = ()
        if w is not None:
            also = (w.deadline if now < w.deadline else w.deadline + rules.restart_timeout,
                    now + self.opts.local_poll if self.restarts.tracker is not None else None,
                    self.restarts.recheck_at)
        return self.timers.timeout(now, fault=n.fault is not None, heartbeat=self.opts.heartbeat, also=also)

    def _schedule_periodic_probe(self, rules: Lifecycle) -> None:
        """While Ready and no probe runs: the next periodic probe, jittered so that agents started together do
        not call the extender together."""
        n, interval = self.current(), self.opts.extender_probe_interval
        if not rules.check_extenders or interval <= 0 or n.phase != NodeState.READY or n.wait is not None:
            self.timers.periodic_probe_at = None
        elif self.timers.periodic_probe_at is None and not n.probing:
            self.timers.periodic_probe_at = time.monotonic() + interval * random.uniform(0.8, 1.2)

    def _attached(self) -> Iterator[lifecycle.Event | None]:
        self.api_pending = False
        log.info("API connected", extra=self._log_extra)
        self.say_started()
        n = self.current()
        if n.probe_failures and n.record.message:
            # The pre-flight failed before the API was there: its Warning was not sent, and a retry that fails
            # the same way sends none.
            self.reporter.note("ExtenderUnreachable", n.record.message, warning=True)
        yield self.hold_changed()  # seen before the adapters were attached (None: not known yet)
        if n.turn == "asked":  # asked while the Lease was not there yet
            yield self.take_turn("")
        yield self.plan("API connected")  # a pending write asks for its turn again, with its source

    def hold_changed(self) -> lifecycle.HoldChanged | None:
        """The Node's hold as the watch sees it now; None before its first list answered."""
        if not self.holds.known():
            return None
        return lifecycle.HoldChanged(self.holds.hold())

    def say_started(self) -> None:
        """A restarted agent re-asserts what it found (at its start, and once the API adapters are there)."""
        phase = self.current().phase
        if phase is not None:
            self.reporter.publish(node_status(self.current()), reason="AgentStarted",
                                  message=f"scheduler-patcher started; the node is {phase.value}")

    def _daemonset_changed(self, rules: Lifecycle) -> None:
        """The owner's watch saw a change: say (once per change) what a stop would do now."""
        if rules.restore_on_exit != "auto":
            return
        view = self.owner.view()
        said = f"a stop keeps the patch: {view.successor()}" if view.successor() else f"a stop restores: {view.gone()}"
        if said != self._owner_said:
            self._owner_said = said
            log.info("%s", said, extra=self._log_extra)

    # -- the plan and the file work ---------------------------------------------------------------------------

    def plan(self, why: str) -> lifecycle.Planned:
        """Plan the source against the manifest (a refusal keeps the last plan); any reconcile is a resync."""
        self.timers.resync = time.monotonic() + self.opts.resync_interval
        self._why = why
        planned, plan = reconcile.plan(self.files, fallback_version=self.fallback_version(),
                                       bad_hashes=frozenset(self.current().record.bad_hashes))
        if plan is not None:
            self._plan = plan
            planned = replace(planned, schedulers=self.leaders.view())  # the leader-aware order's view
        # Every plan looks (under a millisecond when healthy): the check is armed at the start's plan, while the
        # kubelet that started this pod is up, not first at a write that may come while it is down.
        kubelet_down = self.kubelet.down()
        if planned.kind == "pending" and planned.manifest_change:  # a write restarts the scheduler: needs a kubelet
            planned = replace(planned, kubelet_down=kubelet_down)
        self.metrics.source_refused(planned.kind == "refused" and planned.error_kind == "config")
        self.metrics.config_missing(bool(planned.missing))
        return planned

    def apply(self) -> lifecycle.Event:
        plan, self._plan = self._plan, None
        assert plan is not None and plan.config is not None
        self.timers.lease_retry_at = None
        self._pod_before = self.pods.latest()
        return reconcile.apply(self.files, plan, self.current().record, why=self._why, expect=self._expect_manifest,
                               log_extra=self._log_extra, ops=self.record.store.ops)

    def check_last_good(self, action: lifecycle.CheckLastGood) -> lifecycle.LastGoodChecked:
        answer, self._rollback_plan = reconcile.check_last_good(self.files, action)
        return answer

    def roll_back(self, action: lifecycle.RollBack) -> lifecycle.RollbackDone:
        plan, self._rollback_plan = self._rollback_plan, None
        return reconcile.roll_back(self.files, action, plan, self.current().record, expect=self._expect_manifest,
                                   ops=self.record.store.ops)

    def _expect_manifest(self) -> None:
        """Our own write: the folder watch takes the manifest and the config folder as they are now as seen."""
        self.expect_config()
        self.watcher.expect(LoopEvent.MANIFEST)

    def expect_config(self) -> None:
        """We wrote or removed config files: their folder's events that follow are ours."""
        self.watcher.expect(LoopEvent.CONFIG)

    # -- the restart ------------------------------------------------------------------------------------------

    def watch(self) -> lifecycle.Observed | None:
        """A fresh restart baseline and local tracker for the write waited on, and a first look. The baseline is
        the mirror pod seen before our write; an adopted write (a restarted agent, a manifest found patched) takes
        the pod as it is now: restarts that happened before we looked are not ours to judge (a lost election, say)."""
        w = self.current().wait
        assert w is not None
        pod = self.pods.latest() if w.adopted else self._pod_before
        self.restarts.start(w, self.current().record.config_file, pod=pod)
        return self.observe()

    def observe(self) -> lifecycle.Observed | None:
        w = self.current().wait
        if w is None or (self.api_pending and not self.attached):
            return None  # the mirror pod will tell, once the API adapters are attached
        return self.restarts.observe(w, self.pods)

    # -- the rollout turn -------------------------------------------------------------------------------------

    def take_turn(self, source_hash: str) -> lifecycle.TurnChanged | None:
        """Ask the Lease actor for the turn (never blocks); its answer comes back as a "lease" event, or at once."""
        c = self.coordinator
        if self.api_pending:
            return None  # not attached yet: asked again once it is (``_attached``)
        if c.acquire(source_hash) or c.refused_bad:
            return self.turn_changed()
        log.info("waiting for the rollout lease (held by %s)", c.current_holder or "?", extra=self._log_extra)
        self.timers.lease_retry_at = time.monotonic() + self.opts.lease_retry
        return None

    def turn_changed(self) -> lifecycle.TurnChanged | None:
        c = self.coordinator
        if self.current().turn != "asked":
            return None
        if c.held:
            log.info("rollout lease acquired", extra=self._log_extra)
        if c.held or c.refused_bad:
            self.timers.lease_retry_at = None
        pending = self._plan.config.config_hash if self._plan is not None and self._plan.config else ""
        return lifecycle.TurnChanged(held=c.held, refused_bad=c.refused_bad, config_hash=pending)

    def release_turn(self, bad_source: str | None) -> None:
        self.timers.lease_retry_at = None
        self.coordinator.release(bad_hash=bad_source)
        log.info("rollout lease released", extra=self._log_extra)

    # -- the extender probe -----------------------------------------------------------------------------------

    def start_probe(self, config_hash: str) -> None:
        """The pre-flight (or the probe after the restart) in its own thread; its answer is a "probe" event."""
        plan = self._plan
        self.timers.probe_retry_at = None
        if plan is not None and plan.config is not None and plan.config.config_hash == config_hash:
            config: RenderedConfig | None = plan.config  # the pre-flight: the config about to be written
        else:  # after the restart: the config that was written, read back from the host folder
            r: State = self.current().record
            config = nodefiles.saved_config(self.files, LastGood(config_hash=r.config_hash, config_file=r.config_file,
                                                                 files=r.files, api_version=r.api_version))
        if config is None or config.config_hash != config_hash:
            self.probe_done(lifecycle.Probed(config_hash, blocking=(
                f"the files of config {config_hash[:12]} cannot be read back to probe its extenders")))
            return
        start_probe(self.files, config, cancel=self.probe_cancel, done=self.probe_done,
                             log_extra=self._log_extra, observe=self._probe_metrics)

    def _probe_metrics(self, results: list[extprobe.Result]) -> None:
        """Each extender's time, and how many did not answer (blocking ones apart from ignorable ones)."""
        probed = [r for r in results if not r.skipped]
        self.metrics.extenders_probed((r.seconds for r in probed),
                                      unreachable=len(extprobe.blocking(probed)),
                                      unreachable_ignorable=sum(1 for r in probed if r.ignorable and not r.answered))

    def probe_done(self, answer: lifecycle.Probed) -> None:
        """A probe's answer, from its thread: the loop takes it with the "probe" event."""
        self._probe_answers.put(answer)
        self.notify(LoopEvent.PROBE)

    # -- the stop ---------------------------------------------------------------------------------------------

    def daemonset_view(self, rules: Lifecycle) -> lifecycle.DaemonSetView:
        """What the agent knows of its DaemonSet now: the watch's view, refreshed by one short read (the
        pod's own deletion may race the watch event of an uninstall). Only ``auto`` reads it."""
        if rules.restore_on_exit != "auto":
            return lifecycle.DaemonSetView()
        return self.owner.confirm(lifecycle.OWNER_LOOKUP)

    # -- what the step says back to the cluster ---------------------------------------------------------------

    def report(self, action: lifecycle.Publish | lifecycle.Note) -> None:
        """To the Node's annotations and events (before ``attach``: nowhere; its phase is said again then)."""
        if isinstance(action, lifecycle.Publish):
            self.reporter.publish(node_status(self.current()), reason=action.reason)
        else:
            self.reporter.note(action.reason, action.message, warning=action.warning)

    def finish(self, action: lifecycle.Finish) -> None:
        """Stop the folder watch, close the Lease (its release sent) and send the pending report, all by
        ``action.until``: past it, nothing waits for the API."""
        self.watcher.stop()  # after the restore: stopping it joins a thread, and the restore comes first
        until = action.until
        # The release within a share of what is left, the report gets the rest.
        self.coordinator.close(max(0.0, 0.5 * (until - time.monotonic())))
        if self.api_pending:  # the API client was built while the agent ran: maybe during this stop
            # Still being built (imports, TLS; no network): the manifest is restored already; the report waits.
            waited = not self.attached_event.is_set()
            if waited and self.attached_event.wait(max(0.0, 0.5 * (action.build_until - time.monotonic()))):
                until = max(until, time.monotonic() + lifecycle.FINAL_REPORT)
            if self.attached and self.attached_event.is_set():
                # A phase published before the adapters came went nowhere (they may come between that report and
                # this one): the state as it is now, once more; the same state again changes nothing.
                self.reporter.publish(node_status(self.current()))
        if not self.reporter.flush(max(0.0, until - time.monotonic())):
            log.warning("could not publish the final state before the stop's deadline", extra=self._log_extra)
