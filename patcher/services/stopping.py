"""The stop's executor: the restore on exit (``lifecycle.Restore``); a keep is only a ``PatchKept`` note.
``lifecycle.stop`` decides which one and computes every deadline; this module only acts within them and
reports the restore back as one ``lifecycle.RestoreDone``. The restore is planned and written when the stop
comes (``nodefiles.plan_restore``, ``nodefiles.restore``: an atomic write with fsync), whatever the loop was doing."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Final

from patcher.adapters import fsio
from patcher.core import lifecycle, manifestedit, restart
from patcher.core.errors import PatcherError
from patcher.core.settings import Files
from patcher.core.state import State
from patcher.services import nodefiles
from patcher.services.ports import NO_LEADER, Coordinator, LeaderSource, PodSource
from patcher.services.record import StateStore

log = logging.getLogger("patcher.services.agent")

#: How often a stop that waits for another node's rollout turn asks again (each ask must be answered within
#: the step's confirm wait, so an API that goes black meanwhile ends the wait within a second).
TURN_ASK_INTERVAL: Final = 0.25
#: How often the node whose kube-scheduler leads, letting its peers restore first, asks the API again (so an
#: API that stops answering meanwhile ends that wait within a second, as it ends the turn's).
ORDER_ASK_INTERVAL: Final = 1.0


class Stopping:
    def __init__(self, files: Files, store: StateStore, *, log_extra: dict[str, str]) -> None:
        self.files = files
        self.store = store
        self._log_extra = log_extra

    def restore(self, action: lifecycle.Restore, record: State, coordinator: Coordinator,
                pods: PodSource, leaders: LeaderSource = NO_LEADER) -> lifecycle.RestoreDone:
        """Put back exactly what we changed; take the rollout turn before the manifest is written (within the
        action's bounds), and, holding it, wait for the restored scheduler. The record left for the next agent
        keeps only the configs that failed here."""
        try:
            plan = nodefiles.plan_restore(self.files)
            writes = any(c.kind == "manifest" for c in plan.changes)
            turn_silent = writes and self._take_turn(action, coordinator, leaders)
            try:
                lines = nodefiles.restore(self.files, plan, ops=self.store.ops)
            except fsio.ChangedUnderneath:  # rewritten since it was planned (the turn's wait): plan again
                lines = nodefiles.restore(self.files, nodefiles.plan_restore(self.files), ops=self.store.ops)
            for line in lines:
                log.info("%s (stopping)", line, extra=self._log_extra)
            pods_silent = writes and coordinator.held and not self._wait_restored(action.restored_until, pods)
            if record.bad_hashes:  # a failed config stays failed for the next agent here
                try:
                    # What the restore left (config files a static pod still names) stays recorded too.
                    self.store.save(replace(self.store.load(), bad_hashes=record.bad_hashes))
                except PatcherError as exc:  # the manifest is restored: that is what the stop is for
                    log.warning("the manifest is restored, but the configs that failed here cannot be recorded "
                                "for the next agent: %s", exc, extra=self._log_extra)
        except PatcherError as exc:
            return lifecycle.RestoreDone(False, str(exc), held=coordinator.held, now=time.monotonic())
        if turn_silent and not coordinator.unanswered and coordinator.api_answered:
            # The answer to the stop's own Lease request came after the confirm wait, while we restored: a slow
            # API server (a loaded control plane), not a silent one. (Only that request's answer counts:
            # ``api_answered`` from before it is stale.)
            turn_silent = False
        return lifecycle.RestoreDone(True, held=coordinator.held, now=time.monotonic(),
                                     api_silent=turn_silent or pods_silent)

    def _take_turn(self, action: lifecycle.Restore, c: Coordinator, leaders: LeaderSource = NO_LEADER) -> bool:
        """Best effort: hold the rollout Lease while restoring, so that deleting the DaemonSet restarts one
        scheduler at a time. The first request must be answered within ``confirm_wait``, each later one, once the
        API answered this stop, within ``answered_wait`` (slow answers from a loaded control plane are answers):
        no answer (the control plane is down or black-holed: no scheduler schedules then, nothing to serialise)
        means restore at once, also when the API goes black while another node holds the turn. While it answers "held by
        another", ask again until ``turn_until``; the restore itself always happens. True: the API did not
        answer. (``NoCoordinator``'s request settles at once: no turn to wait for.)

        With ``leader_last``, the node whose scheduler leads lets its peers go first while
        ``lifecycle.stop_order_wait`` says so: a turn it got meanwhile is given back at once, and it asks again
        every ``ORDER_ASK_INTERVAL`` (an unanswered ask still means restore at once)."""
        if c.held:
            return False
        silent, said, wait = True, "", action.confirm_wait
        while True:
            why = lifecycle.stop_order_wait(leaders.view()) if action.leader_last else ""
            if why and action.turn_until - time.monotonic() <= 0:
                why = ""  # its share of the grace period is spent: the leader's node goes now
            if why != said and why:
                log.info("rollout turn for the restore held back: %s", why, extra=self._log_extra)
            elif said and not why:
                log.info("the other nodes restored: this node's turn to restore", extra=self._log_extra)
            said = why
            c.acquire()
            if c.settle(wait):
                if not why:
                    return False
                c.release()  # taken before the peers that go first: theirs again
                self._wait_order(action, leaders)
                continue
            if c.unanswered:
                why = f"the API server did not answer within {wait:g} s"
                break
            if not c.api_answered:
                why = f"the API server refused it: {c.denied}" if c.denied else "the API server does not answer"
                break
            wait = max(action.confirm_wait, action.answered_wait)
            if why:
                c.release()  # the ask is withdrawn: the actor must not take the turn from a peer meanwhile
                self._wait_order(action, leaders)
                continue
            left = action.turn_until - time.monotonic()
            if left <= 0:
                why, silent = f"held by {c.current_holder or '?'} for the whole share of the grace period", False
                break
            if c.wait_held(min(TURN_ASK_INTERVAL, left)):
                return False  # another node restored first; our turn came
        log.warning("restoring without the rollout lease (%s)", why, extra=self._log_extra)
        return silent

    @staticmethod
    def _wait_order(action: lifecycle.Restore, leaders: LeaderSource) -> None:
        """Wait (at most ``ORDER_ASK_INTERVAL``, never past ``turn_until``) for the peers that restore first; the
        view is the watch's, read without a request."""
        until = min(time.monotonic() + ORDER_ASK_INTERVAL, action.turn_until)
        while time.monotonic() < until and lifecycle.stop_order_wait(leaders.view()):
            time.sleep(min(TURN_ASK_INTERVAL, max(0.0, until - time.monotonic())))

    def _wait_restored(self, until: float, pods: PodSource) -> bool:
        """While holding the Lease, wait (until ``until``) for the scheduler to run the restored manifest. False:
        the mirror pod's view does not follow the API server (it does not answer): nothing to wait for."""
        if not pods.pod_name:  # no mirror pod watched: nothing to see the restored scheduler in
            return True
        local = nodefiles.manifest_local(self.files)
        written = fsio.mtime_ns(local) or 0
        while time.monotonic() < until:
            if not pods.fresh:
                log.warning("the mirror pod's view does not follow the API server; not waiting for the restored "
                            "scheduler", extra=self._log_extra)
                return False
            if restart.runs_unpatched(pods.latest(), marker_key=manifestedit.marker_key(self.files.prefix),
                                      manifest_mtime_ns=written,
                                      container_name=self.files.container_name or "kube-scheduler"):
                return True
            time.sleep(0.1)
        log.warning("kube-scheduler not seen back on the restored manifest; releasing the rollout lease",
                    extra=self._log_extra)
        return True
