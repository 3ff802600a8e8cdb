"""The stop's executor: the restore on exit (``lifecycle.Restore``), the keep (``lifecycle.Keep``) and the
restore prepared while patched, so that on SIGTERM only the write remains. ``lifecycle.stop`` decides which
one and computes every deadline from the grace period; this module only acts within them and reports the
restore back as one ``lifecycle.RestoreDone``."""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import replace
from typing import Final

from patcher.adapters import fsio
from patcher.adapters.statestore import StateStore
from patcher.core import lifecycle, manifest, restart
from patcher.core.errors import PatcherError
from patcher.core.settings import Files, Lifecycle
from patcher.core.state import State
from patcher.services import engine
from patcher.services.ports import Coordinator, PodSource, Reporter

log = logging.getLogger("patcher.services.agent")

#: How many times ``Stopping.settle`` finds one preparation's files changed since its last ask (same bytes,
#: touched) before it leaves the comparison to the restore: the loop must not keep waking for them. Asks
#: that find them unchanged (the loop woken by other events meanwhile) do not count.
SETTLE_ASKS: Final = 5

#: How often a stop that waits for another node's rollout turn asks again (each ask must be answered within
#: the step's confirm wait, so an API that goes black meanwhile ends the wait within a second).
TURN_ASK_INTERVAL: Final = 0.25


class Stopping:
    """Holds the restore prepared for the current record; executes ``Restore`` and ``Keep``."""

    def __init__(self, files: Files, store: StateStore, *, log_extra: dict[str, str]) -> None:
        self.files = files
        self.store = store
        self.prepared: tuple[State, engine.PreparedRestore] | None = None
        self._log_extra = log_extra
        #: The prepared restore written ahead of the stop's transition (``write_first``), with its lines or its
        #: refusal, for the ``Restore`` action to find: it must not be written twice.
        self.written_first: tuple[engine.PreparedRestore, list[str] | PatcherError] | None = None
        #: The view of the DaemonSet ``write_first`` decided by when it wrote (the stop goes on from it).
        self.written_view: lifecycle.DaemonSetView | None = None
        self._signal: int | None = None  # the stop signal received, until its log line is said (after the restore)
        self._unsettled: engine.PreparedRestore | None = None  # a preparation ``settle`` gave up on
        #: The preparation ``settle`` waits for, the identities it saw last and how often they had changed.
        self._settling: tuple[engine.PreparedRestore | None, tuple[fsio.Identity, fsio.Identity] | None, int] = (
            None, None, 0)
        self.clock_ns = time.time_ns  # the wall clock file timestamps are set by (``settle``)

    def heard(self, signum: int) -> None:
        """A stop signal came (``process.install_signal_handlers``). Nothing is said yet: the handler runs on the
        loop's thread, so a line written there would delay the restore behind a log write. ``say_signal`` says
        it, once."""
        if self._signal is None:
            self._signal = signum

    def say_signal(self) -> None:
        """Log the stop signal received, once: after the restore's write (or before a stop that keeps)."""
        signum, self._signal = self._signal, None
        if signum is not None:
            log.info("received %s", signal.Signals(signum).name, extra=self._log_extra)

    def write_first(self, record: State, rules: Lifecycle, view: lifecycle.DaemonSetView, *,
                    held: bool = False) -> None:
        """When this stop restores (``lifecycle.restores``, the rule ``stop`` decides by) and no
        rollout turn is taken before a write, the prepared restore's write comes first, before the stop's
        transition is computed; its ``Restore`` action then finds it done, or meets its refusal as if it had
        written itself. Anything unusual (nothing staged, a stale preparation) is left to that action, which
        plans again and reports. On the loop's thread, holding the writer lock: it races no write of ours,
        like any other write of the loop. Once per stop: at the signal (``Agent.write_at_signal``) or in the
        shutdown."""
        p = self.prepared
        if (self.written_first is not None or p is None or p[1].staged is None or rules.coordinated
                or (p[0] is not record and p[0] != record) or not lifecycle.restores(rules, view, held=held)):
            return
        prepared = p[1]
        self.written_view = view
        try:
            self.written_first = (prepared, engine.restore_prepared(self.files, prepared))
        except PatcherError as exc:
            self.written_first = (prepared, exc)

    def prepare(self, record: State, *, enabled: bool) -> None:
        """While patched, the restored bytes are known already: plan the restore now. It is kept for this
        record only, and written only while the manifest is still byte for byte what we wrote
        (``engine.restore_prepared``); anything else is planned again at exit. The staged file of an earlier
        preparation is kept when it is still the same restore, removed otherwise."""
        previous = self.prepared[1] if self.prepared is not None else None
        prepared = None
        if enabled and record.patched:
            try:  # the restored bytes are staged beside the manifest: at SIGTERM the write is one rename
                prepared = engine.prepare_restore(self.files, stage=True, previous=previous)
            except PatcherError:
                prepared = None  # planned again at exit, where the refusal is reported
        if previous is not None and (prepared is None or prepared.staged != previous.staged):
            engine.discard(previous)
        self.prepared = (record, prepared) if prepared is not None else None

    def settle(self) -> float | None:
        """Once the prepared restore's files have settled, keep their identities, so that the restore's
        comparison before its rename is one ``stat`` each (``engine.settle``). The loop asks before it
        waits; the answer is how soon to ask again (None: nothing left to settle). Files found changed (touched,
        same bytes) at ``SETTLE_ASKS`` asks in a row are left to the restore's full comparison."""
        p = self.prepared
        if p is None or p[1].seen is not None or p[1] is self._unsettled:
            return None
        answer = engine.settle(p[1], self.clock_ns)
        if answer is None:  # not what was prepared: the restore compares in full (and refuses)
            self._unsettled = p[1]
            return None
        seen, wait = answer
        if wait <= 0:
            self.prepared = (p[0], replace(p[1], seen=seen))
            return None
        _, last, changes = self._settling if self._settling[0] is p[1] else (None, None, 0)
        changes += int(last is not None and last != seen)  # touched since the last ask: it may never settle
        if changes >= SETTLE_ASKS:
            self._unsettled = p[1]
            return None
        self._settling = (p[1], seen, changes)
        return wait

    def drop(self) -> None:
        """Forget the prepared restore and remove its staged file (the node is held: nothing of ours is written)."""
        if self.prepared is not None:
            engine.discard(self.prepared[1])
            self.prepared = None

    def keep(self, action: lifecycle.Keep, reporter: Reporter | None) -> None:
        """Leave everything for the successor: only the staged restore goes (hidden, and stale for it)."""
        if self.prepared is not None:
            engine.discard(self.prepared[1])
            self.prepared = None
        if reporter is not None:
            reporter.note("PatchKept", action.reason)

    def restore(self, action: lifecycle.Restore, record: State, coordinator: Coordinator | None,
                pods: PodSource | None) -> lifecycle.RestoreDone:
        """Put back exactly what we changed, the prepared restore first; take the rollout turn before the
        manifest is written (within the action's bounds), and, holding it, wait for the restored scheduler.
        The record left for the next agent keeps only the configs that failed here."""
        try:
            prepared = self.prepared[1] if self.prepared and self.prepared[0] == record else None
            plan = prepared.plan if prepared is not None else engine.plan_restore(self.files)
            writes = any(c.kind == "manifest" for c in plan.changes)
            turn_silent = self._take_turn(action, coordinator) if writes else False
            pods_silent = False
            lines = self._restore_prepared(prepared) if prepared is not None else None
            if lines is None:
                if prepared is not None:  # the prepared plan is stale: plan from what is there now
                    plan = engine.plan_restore(self.files)
                try:
                    lines = engine.restore(self.files, plan)
                except fsio.ChangedUnderneath:  # rewritten since it was planned: plan from what is there now
                    lines = engine.restore(self.files, engine.plan_restore(self.files))
            self.say_signal()  # the manifest is back: the signal's line comes first in the log
            for line in lines:
                log.info("%s (stopping)", line, extra=self._log_extra)
            if writes and coordinator is not None and coordinator.held:
                pods_silent = not self._wait_restored(action.restored_until, pods)
            if record.bad_hashes:  # a failed config stays failed for the next agent here
                try:
                    # What the restore left (config files a static pod still names) stays recorded too.
                    self.store.save(replace(self.store.load(), bad_hashes=record.bad_hashes))
                except PatcherError as exc:  # the manifest is restored: that is what the stop is for
                    log.warning("the manifest is restored, but the configs that failed here cannot be recorded "
                                "for the next agent: %s", exc, extra=self._log_extra)
        except PatcherError as exc:
            return lifecycle.RestoreDone(False, str(exc), held=_holds(coordinator), now=time.monotonic())
        if turn_silent and coordinator is not None and not coordinator.unanswered and coordinator.api_answered:
            # The answer to the stop's own Lease request came after the confirm wait, while we restored: a slow
            # API server (a loaded control plane), not a silent one. The final report gets the rest of the
            # grace period. (Only that request's answer counts: ``api_answered`` from before it is stale.)
            turn_silent = False
        return lifecycle.RestoreDone(True, held=_holds(coordinator), now=time.monotonic(),
                                     api_silent=turn_silent or pods_silent)

    def _take_turn(self, action: lifecycle.Restore, c: Coordinator | None) -> bool:
        """Best effort: hold the rollout Lease while restoring, so that deleting the DaemonSet restarts one
        scheduler at a time. Every request must be answered within ``confirm_wait``: no answer (the control
        plane is down or black-holed: no scheduler schedules then, nothing to serialise) means restore at
        once, also when the API goes black while another node holds the turn. While it answers "held by
        another", ask again until ``turn_until``; the restore itself always happens. True: the API did not
        answer."""
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

    def _wait_restored(self, until: float, pods: PodSource | None) -> bool:
        """While holding the Lease, wait (until ``until``) for the scheduler to run the restored manifest. False:
        the mirror pod's view does not follow the API server (it does not answer): nothing to wait for."""
        if pods is None:
            return True
        local = engine.manifest_local(self.files)
        written = fsio.mtime_ns(local) or 0
        while time.monotonic() < until:
            if not getattr(pods, "fresh", True):
                log.warning("the mirror pod's view does not follow the API server; not waiting for the restored "
                            "scheduler", extra=self._log_extra)
                return False
            if restart.runs_unpatched(pods.latest(), marker_key=manifest.marker_key(self.files.prefix),
                                      manifest_mtime_ns=written,
                                      container_name=self.files.container_name or "kube-scheduler"):
                return True
            time.sleep(0.1)
        log.warning("kube-scheduler not seen back on the restored manifest; releasing the rollout lease",
                    extra=self._log_extra)
        return True

    def _restore_prepared(self, prepared: engine.PreparedRestore) -> list[str] | None:
        """The restore planned while Ready: the manifest first, then the clean-up. None when the manifest is not
        what we wrote any more (a ``kubeadm upgrade`` since): nothing was written, and the caller plans again."""
        try:
            first = self.written_first  # written by ``write_first`` already (or refused): not again
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


def _holds(c: Coordinator | None) -> bool:
    return c is not None and c.held
