"""Leader election on a ``coordination.k8s.io/v1`` Lease (``kube.lease``, client-go's rules): one gatekeeper
replica acts at a time.

The leader renews every ``renew_period``; a leader whose renewal failed tries every ``retry_period``. A standby
follows the Lease by a watch of it instead of reading it every ``retry_period``: each renewal it sees restarts
its count of ``lease_duration`` on its own clock, and it sends a request only when the Lease is free or has gone
unchanged for its duration. While the watch does not follow the server it tries every ``retry_period``. RBAC:
``list`` and ``watch`` on the Lease beside ``get``/``update``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from patcher.adapters.kube.lease import Lease, Obj, Outcome
from patcher.adapters.kube.listwatch import ListWatcher, named
from patcher.adapters.kube.transport import LEASES, Api

log = logging.getLogger(__name__)


class LeaderElector:
    """Hold a Lease while alive; ``is_leader()`` says whether to act.

    The leader counts itself leader only until ``renew_deadline`` after its last successful renewal: shorter
    than the lease duration, so it stops acting before anyone else may take over. Unlike client-go, the
    renewal period is its own (``renew_period``, default ``retry_period``): a standby takes over
    ``lease_duration`` after the last change it saw whatever the period, so fewer writes cost nothing, and
    ``renew_period + retry_period < renew_deadline`` keeps a second attempt before the leader stops acting.
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
    ) -> None:
        renew_period = retry_period if renew_period is None else renew_period
        if not 0 < retry_period <= renew_period < renew_deadline < lease_duration:
            raise ValueError("leader election needs 0 < retry period <= renew period < renew deadline < lease "
                             "duration")
        self._lease = Lease(api, namespace, name, identity, lease_duration)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.renew_period = renew_period
        self._on_change = on_change
        self._lock = threading.Lock()
        self._leader = False
        self._renewed = -math.inf
        self.holder: str | None = None
        self._stop = threading.Event()
        self._woken = threading.Event()
        self._thread: threading.Thread | None = None
        #: Guards the Lease's bookkeeping, written by this thread's attempts and by the watch's callbacks.
        self._seen_lock = threading.Lock()
        self._watcher = ListWatcher(
            api, LEASES, namespace, **named(name, self._lease_seen), name=f"watch lease {namespace}/{name}",
        )

    def is_leader(self) -> bool:
        with self._lock:
            return self._leader and time.monotonic() - self._renewed < self.renew_deadline

    def start(self) -> None:
        self._watcher.start()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"lease-{self.name}", daemon=True)
            self._thread.start()

    def stop(self, *, release: bool = True, timeout: float = 3.0) -> None:
        """Stop renewing; with ``release`` hand the Lease back so a standby takes over at once."""
        self._stop.set()
        self._woken.set()
        self._watcher.stop(timeout)
        if self._thread is not None:
            self._thread.join(timeout)
        was_leader = self.is_leader()
        self._set_leader(False)
        if release and was_leader and self._lease.release(deadline=time.monotonic() + self.renew_deadline):
            log.info("lease %s/%s released by %s", self.namespace, self.name, self.identity)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._woken.clear()  # before the attempt: a change the watch sees meanwhile wakes the next wait
            standby = self._standing_by()
            if standby > 0:
                self._woken.wait(standby)
                continue
            # The renew deadline runs from before the request: an answer that arrives late must not extend it.
            attempted = time.monotonic()
            with self._seen_lock:
                outcome = self._lease.acquire_or_renew(deadline=time.monotonic() + self.renew_deadline)
                self.holder = self._lease.holder
            now = time.monotonic()
            if outcome == Outcome.HELD:
                with self._lock:
                    self._renewed = attempted
                self._set_leader(True)
            elif outcome == Outcome.OTHER or now - self._renewed >= self.renew_deadline:
                self._set_leader(False)
            self._woken.wait(self.renew_period if outcome == Outcome.HELD else self.retry_period)

    def _standing_by(self) -> float:
        """Seconds to wait without a request: while another holder's Lease, as the watch follows it, is valid
        on our clock; 0 to send an attempt now (we lead, the watch does not follow, the Lease is free or due)."""
        if not self._watcher.fresh:
            return 0.0
        with self._lock:
            if self._leader:
                return 0.0
        with self._seen_lock:
            return self._lease.expires_in()

    def _lease_seen(self, lease: Obj | None) -> None:
        """A Lease the watch delivered: restart the count of its duration if it changed; wake the thread when
        it is gone, free or due (a handover)."""
        if lease is None:  # no Lease: whoever comes first creates it
            self._woken.set()
            return
        spec = lease.get("spec") or {}
        with self._seen_lock:
            due = self._lease.expired_for_us(spec)
            self.holder = spec.get("holderIdentity") or None
        with self._lock:
            leader = self._leader
        if due and not leader:
            self._woken.set()

    def _set_leader(self, value: bool) -> None:
        with self._lock:
            changed, self._leader = self._leader != value, value
        if changed:
            log.info("lease %s/%s %s by %s", self.namespace, self.name,
                     "acquired" if value else "lost", self.identity)
            if self._on_change is not None:
                self._on_change(value)
