"""One scheduler restart at a time across the control plane, through a ``coordination.k8s.io/v1`` Lease.

Without it every agent writes its manifest the moment the ConfigMap changes, so a config the scheduler
rejects takes every scheduler down together. With it, the agent that wants to change its manifest holds the
Lease until its scheduler is Ready again (or it rolled back); the others wait their turn. The first node is
the canary: a source that rolled back is recorded on the Lease and no other node tries it.

The Lease is a background actor, like the node reporter: the agent's loop posts intents ("my turn for source
X", "release, bad=Y") and reads a snapshot that never blocks; this thread does the API round trips, each with
a deadline, and renews while held. An API server that accepts connections and never answers therefore stalls
nothing but this thread. Expiry follows ``patcher.adapters.kube.lease`` (the observer's own clock, never the remote
``renewTime`` against the local wall clock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from patcher.adapters.kube.lease import MAX_CALL, Lease, Obj, Outcome, annotations_of

if TYPE_CHECKING:  # the API is reached through patcher.adapters.kube; the client here is a type only
    from patcher.adapters.kube.transport import Api

BAD_HASHES_SUFFIX = "bad-source-hashes"  # source fingerprints: comparable across scheduler versions
MAX_BAD = 20  # the annotation keeps the most recent ones: enough for any real history, bounded in size


class RolloutLease:
    """The rollout turn as an actor. Every public method returns at once (``settle``/``close`` wait, bounded)."""

    def __init__(self, api: Api, namespace: str, name: str, holder: str, *, duration: int = 60,
                 prefix: str = "scheduler-patcher.io", clock: Callable[[], float] = time.monotonic,
                 retry: float = 2.0, on_change: Callable[[], None] | None = None) -> None:
        self.lease = Lease(api, namespace, name, holder, float(duration), clock=clock)
        self.holder = holder
        self.duration = duration
        self.bad_key = f"{prefix.rstrip('/')}/{BAD_HASHES_SUFFIX}"
        self.clock = clock
        self.retry = retry
        self.on_change = on_change
        self._cond = threading.Condition()
        # the snapshot the loop reads
        self.held = False
        self.refused_bad = False
        self.current_holder: str | None = None
        self.api_answered: bool | None = None  # did the last round trip get an answer (None: none tried yet)
        # intents
        self._want: str | None = None  # the source we want a turn for ("" for any); None: no turn wanted
        self._refused: set[str] = set()
        self._releases: list[str | None] = []  # pending releases, each with the bad source it records
        self._posted = 0  # generations: settle() waits until every posted intent was tried once
        self._answered = 0
        self._next_try = 0.0
        self._last_renew = 0.0
        self._budget_end: float | None = None  # set by close(): no call may run past it
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="rollout-lease", daemon=True)
        self._thread.start()

    # -- intents (the agent's loop) ---------------------------------------------------------------------

    def acquire(self, source_hash: str = "") -> bool:
        """True when the turn is ours now; otherwise ask for it and return False at once."""
        with self._cond:
            if self.held:
                return True
            self.refused_bad = bool(source_hash) and source_hash in self._refused
            if self.refused_bad:
                return False
            self._want = source_hash  # asked again: try now (the loop asks on a reconcile or its retry timer)
            self._next_try = 0.0
            self._posted += 1
            self._cond.notify_all()
            return False

    def release(self, *, bad_hash: str | None = None) -> None:
        """Give the turn up (and record a source that failed, for every other node to skip)."""
        with self._cond:
            self.held = False
            self._want = None
            self._releases.append(bad_hash)
            self._posted += 1
            self._cond.notify_all()

    def _wait(self, waiting: Callable[[], bool], timeout: float) -> bool:
        """Wait (bounded) while ``waiting()``; True when the turn is ours."""
        end = self.clock() + timeout
        with self._cond:
            while waiting() and not self._stop and (left := end - self.clock()) > 0:
                self._cond.wait(min(left, 0.5))
            return self.held

    def settle(self, timeout: float) -> bool:
        """Wait (bounded) until every intent posted so far was tried once; True when the turn is ours."""
        with self._cond:
            target = self._posted
        return self._wait(lambda: self._answered < target, timeout)

    @property
    def denied(self) -> str | None:
        """The refusal (401/403) of the last failed request, None when it failed otherwise."""
        return self.lease.denied

    @property
    def unanswered(self) -> bool:
        """An intent was posted and its round trip has not ended: the API did not answer it (yet). After a
        ``settle`` that timed out, this tells "no answer" from a stale ``api_answered`` of an earlier call."""
        with self._cond:
            return self._answered < self._posted

    def wait_held(self, timeout: float) -> bool:
        return self._wait(lambda: not self.held and self._want is not None, timeout)

    def close(self, timeout: float) -> None:
        """Finish pending releases within ``timeout``, then stop the thread."""
        with self._cond:
            self._budget_end = self.clock() + timeout
            self._want = None
            self._cond.notify_all()
        self.settle(timeout)
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(max(0.0, min(1.0, timeout)))

    # -- the actor ----------------------------------------------------------------------------------------

    def _deadline(self) -> float:
        end = self.clock() + MAX_CALL
        return end if self._budget_end is None else min(end, self._budget_end)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop:
                    now = self.clock()
                    if self._releases:
                        break
                    due = self._next_try if (self._want is not None and not self.held) else (
                        self._last_renew + self.duration / 3 if self.held else None)
                    if due is not None and now >= due:
                        break
                    self._cond.wait(None if due is None else due - now)
                if self._stop:
                    return
                release = self._releases.pop(0) if self._releases else ...
                want, posted = self._want, self._posted
                before = (self.held, self.refused_bad)
            tried = False
            if release is not ...:
                self._release(release)
            elif want is not None or self.held:
                self._acquire(want or "")
                tried = True
            with self._cond:
                if not self._releases and (self._want is None or tried):
                    self._answered = max(self._answered, posted)
                self._cond.notify_all()
                changed = (self.held, self.refused_bad) != before
            if changed and self.on_change is not None:
                self.on_change()  # the loop re-plans: its turn came, or its source is known to be bad

    def _acquire(self, source_hash: str) -> None:
        def bad(lease: Obj) -> bool:
            listed = {h for h in annotations_of(lease).get(self.bad_key, "").split(",") if h}
            return bool(source_hash) and source_hash in listed

        outcome = self.lease.acquire_or_renew(deadline=self._deadline(), refuse=bad)
        with self._cond:
            self.api_answered = outcome != Outcome.ERROR
            if outcome == Outcome.HELD:
                self.held, self._want, self._last_renew = True, None, self.clock()
                self.current_holder = self.holder
            elif outcome == Outcome.REFUSED:
                self._refused.add(source_hash)
                self.refused_bad, self.held, self._want = True, False, None
            else:
                if outcome == Outcome.OTHER:
                    self.held = False  # taken over while we thought we held it, or simply not our turn
                    self.current_holder = self.lease.holder
                self._next_try = self.clock() + self.retry
                if self.held:  # a failed renewal: try again soon, the Lease is ours until it expires
                    self._last_renew = self.clock() - self.duration / 3 + self.retry

    def _release(self, bad_hash: str | None) -> None:
        def annotate(annotations: dict[str, str]) -> dict[str, str]:
            known = [h for h in annotations.get(self.bad_key, "").split(",") if h]
            if bad_hash and bad_hash not in known:
                annotations[self.bad_key] = ",".join([*known, bad_hash][-MAX_BAD:])
            return annotations

        ok = self.lease.release(deadline=self._deadline(), annotate=annotate if bad_hash else None)
        with self._cond:
            self.api_answered = ok
