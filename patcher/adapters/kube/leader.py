"""Leader election on a ``coordination.k8s.io/v1`` Lease: one replica acts at a time.

A thread around ``patcher.adapters.kube.lease.Lease`` (the one Lease primitive, shared with the agents'
rollout coordinator): the leader renews every ``renew_period``, a standby or a leader whose renewal failed tries
every ``retry_period``, and ``is_leader()`` answers. Used by the gatekeeper.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from patcher.adapters.kube.lease import Lease, Outcome
from patcher.adapters.kube.transport import Api

log = logging.getLogger(__name__)


class LeaderElector:
    """Hold a ``coordination.k8s.io/v1`` Lease while alive; ``is_leader()`` says whether to act.

    client-go's algorithm, small: a Lease held by someone else counts as expired only when its record has not
    changed for ``lease_duration`` *as measured on our own clock* since we first saw that record, so skewed
    node clocks cannot make two replicas leaders. The leader renews every ``retry_period`` and considers
    itself leader only until ``renew_deadline`` after its last successful renewal — shorter than the lease
    duration, so it stops acting before anyone else may take over. Writes carry the resourceVersion that was
    read: of two replicas racing for an expired Lease, exactly one wins.

    Unlike client-go, the leader's renewal period is its own (``renew_period``, default ``retry_period`` as in
    client-go): a renewal every 2 s is 30 writes a minute for a Lease whose holder is replaced only after
    ``lease_duration`` anyway. Renewing every few seconds less often moves nothing a standby sees (it takes
    over ``lease_duration`` after the last change it saw, whatever the period), and a failed renewal is tried
    again every ``retry_period`` until ``renew_deadline``, so ``renew_period + retry_period < renew_deadline``
    keeps a second attempt before the leader stops acting.
    """

    def __init__(
        self,
        api: Api,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        renew_period: float | None = None,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        renew_period = retry_period if renew_period is None else renew_period
        if not 0 < retry_period <= renew_period < renew_deadline < lease_duration:
            raise ValueError("leader election needs 0 < retry period <= renew period < renew deadline < lease "
                             "duration")
        self._lease = Lease(api, namespace, name, identity, lease_duration, clock=clock, wall=wall)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.renew_period = renew_period
        self._on_change = on_change
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._leader = False
        self._renewed = -math.inf
        self.holder: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def is_leader(self) -> bool:
        with self._lock:
            return self._leader and self._clock() - self._renewed < self.renew_deadline

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"lease-{self.name}", daemon=True)
            self._thread.start()

    def stop(self, *, release: bool = True, timeout: float = 3.0) -> None:
        """Stop renewing; with ``release`` hand the Lease back so a standby takes over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        was_leader = self.is_leader()
        self._set_leader(False)
        if release and was_leader:
            self._release()

    def _run(self) -> None:
        while not self._stop.is_set():
            # The renew deadline runs from before the request: an answer that arrives late must not extend it.
            attempted = self._clock()
            outcome = self._try_acquire_or_renew()
            now = self._clock()
            if outcome == "held":
                with self._lock:
                    self._renewed = attempted
                self._set_leader(True)
            elif outcome == "other" or now - self._renewed >= self.renew_deadline:
                self._set_leader(False)
            self._stop.wait(self.renew_period if outcome == "held" else self.retry_period)

    def _set_leader(self, value: bool) -> None:
        with self._lock:
            changed, self._leader = self._leader != value, value
        if changed:
            log.info("lease %s/%s %s by %s", self.namespace, self.name,
                     "acquired" if value else "lost", self.identity)
            if self._on_change is not None:
                self._on_change(value)

    def _try_acquire_or_renew(self) -> str:
        """``held`` (we hold it now), ``other`` (someone else validly does) or ``error``."""
        outcome = self._lease.acquire_or_renew(deadline=self._clock() + self.renew_deadline)
        self.holder = self._lease.holder
        return {Outcome.HELD: "held", Outcome.OTHER: "other"}.get(outcome, "error")

    def _release(self) -> None:
        if self._lease.release(deadline=self._clock() + self.renew_deadline):
            log.info("lease %s/%s released by %s", self.namespace, self.name, self.identity)
