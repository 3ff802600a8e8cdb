"""The one ``coordination.k8s.io/v1`` Lease primitive under the rollout turn and the gatekeeper election.

client-go's rules, small: a Lease held by someone else counts as expired only when its record has not changed
for ``leaseDurationSeconds`` on the observer's own monotonic clock since it first saw that record (skewed wall
clocks never decide who writes); every write carries the resourceVersion read (of two racing writers exactly
one wins, the other gets 409); every call has a deadline, so an API server that never answers costs the
remaining budget at most. No threads here: the callers own theirs.
"""

from __future__ import annotations

import enum
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from patcher.adapters.kube.errors import ApiError, Conflict, Denied, NotFound, Unreachable, api_json
from patcher.adapters.kube.transport import LEASES, Api
from patcher.core.timefmt import rfc3339

log = logging.getLogger("patcher.lease")

Obj = dict[str, Any]
#: Longest single request: a renewal must never hang for the client's default socket timeout.
MAX_CALL = 5.0


class Outcome(enum.StrEnum):
    HELD = "held"  # we hold it now (acquired or renewed)
    OTHER = "other"  # someone else validly holds it
    REFUSED = "refused"  # the caller's check on the Lease we read said no (e.g. a source known to be bad)
    ERROR = "error"  # no answer in time or a failure other than a conflict: try again later


def annotations_of(lease: Obj) -> dict[str, str]:
    return dict((lease.get("metadata") or {}).get("annotations") or {})


def _without_nulls(lease: Obj) -> Obj:
    """``lease`` without the spec fields set to None (a released Lease): sent as absent, as the generated
    client's serialisation sent them, rather than as JSON nulls."""
    spec = lease.get("spec")
    if not isinstance(spec, dict):
        return lease
    return {**lease, "spec": {k: v for k, v in spec.items() if v is not None}}


@dataclass
class Lease:
    """One named Lease as seen by one identity."""

    api: Api
    namespace: str
    name: str
    identity: str
    duration: float = 60.0
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self.holder: str | None = None  # the holder seen on the last read
        #: Why the last failed round trip was refused (401/403), None when it failed otherwise: a stop whose
        #: request is refused (an uninstall deleted the RBAC first) must not say the API does not answer.
        self.denied: str | None = None
        #: The Lease as our last write of it left it (ours), for a renewal without a read first.
        self._ours: Obj | None = None

    # -- one round trip each -------------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, deadline: float) -> Obj:
        where = f"{what} Lease {self.namespace}/{self.name}"
        left = deadline - self.clock()
        if left <= 0.01:
            raise Unreachable(where, "no time left")
        timeout = min(left, MAX_CALL)
        return cast(Obj, api_json(where, fn, *args, namespace=self.namespace, timeout=(timeout, timeout)))

    def read(self, *, deadline: float) -> Obj | None:
        try:
            return self._call("read", self.api.get, LEASES, self.name, deadline=deadline)
        except NotFound:
            return None

    def _write(self, lease: Obj, *, deadline: float) -> Obj:
        meta = lease.get("metadata") or {}
        if not meta.get("resourceVersion"):
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace, **meta},
                    "spec": lease.get("spec") or {}}
            return self._call("create", self.api.create, LEASES, _without_nulls(body), deadline=deadline)
        return self._call("update", self.api.update, LEASES, self.name, _without_nulls(lease), deadline=deadline)

    # -- the rules ------------------------------------------------------------------------------------------

    def expired_for_us(self, spec: Obj) -> bool:
        """Free, ours, or unchanged for its duration on our own clock since we first saw this record."""
        holder = spec.get("holderIdentity") or None
        if holder is None or holder == self.identity:
            return True
        record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"), spec.get("leaseDurationSeconds"))
        now = self.clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or self.duration)
        return now >= self._observed_at + duration

    def expires_in(self) -> float:
        """Seconds until the record last seen held by someone else may be taken, on our own clock (0 when no
        such record was seen): a standby that follows the Lease by a watch sleeps this long, no read between."""
        if self._observed is None or self._observed[0] in (None, self.identity):
            return 0.0
        duration = float(self._observed[3] or self.duration)
        return max(0.0, self._observed_at + duration - self.clock())

    def _spec(self, previous: Obj) -> Obj:
        now = rfc3339(time.time_ns(), 6)  # metav1.MicroTime: informational only, expiry never reads it
        mine = previous.get("holderIdentity") == self.identity
        return {**previous,
                "holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, math.ceil(self.duration)),
                "acquireTime": previous.get("acquireTime") if mine and previous.get("acquireTime") else now,
                "renewTime": now,
                "leaseTransitions": int(previous.get("leaseTransitions") or 0)
                + (1 if previous.get("holderIdentity") and not mine else 0)}

    def _renew_unread(self, *, deadline: float) -> bool:
        """Renew with one write of the Lease as our last write left it: its resourceVersion makes it a CAS, so it
        succeeds only if nobody wrote the Lease since, which is what a read would have shown (client-go's
        leader renews so too). False when someone did (409) or it failed: then read, as for a first take."""
        if self._ours is None:
            return False
        try:
            self._ours = self._write({**self._ours, "spec": self._spec(self._ours.get("spec") or {})},
                                     deadline=deadline)
        except ApiError as exc:
            self._ours = None
            log.debug("renewing Lease %s/%s without a read: %s", self.namespace, self.name, exc)
            return False
        self.holder = self.identity
        return True

    def acquire_or_renew(self, *, deadline: float, refuse: Callable[[Obj], bool] | None = None) -> Outcome:
        """One read and at most one CAS write. ``refuse(lease)`` is checked on the very object we would
        replace, so "is it allowed?" and "take it" cannot be split by another writer. Without ``refuse``, a
        holder renews with the write alone (``_renew_unread``): one request a period, not two."""
        if refuse is None and self._renew_unread(deadline=deadline):
            return Outcome.HELD
        try:
            lease = self.read(deadline=deadline)
            if lease is not None and refuse is not None and refuse(lease):
                return Outcome.REFUSED
            spec = (lease or {}).get("spec") or {}
            self.holder = spec.get("holderIdentity") or None
            if not self.expired_for_us(spec):
                return Outcome.OTHER
            if self.holder and self.holder != self.identity:
                log.warning("taking over Lease %s/%s from %s (unchanged for %.0fs on our clock)", self.namespace,
                            self.name, self.holder, float(spec.get("leaseDurationSeconds") or self.duration))
            written = self._write({**(lease or {}), "spec": self._spec(spec)}, deadline=deadline)
            self._ours = written if refuse is None else None
            self.holder = self.identity
            return Outcome.HELD
        except Conflict as exc:  # another writer came first: an answer (the next read tells who)
            log.debug("%s", exc)
            return Outcome.OTHER
        except ApiError as exc:
            log.info("%s", exc)  # no answer in time, or a failure: try again later
            self.denied = exc.detail if isinstance(exc, Denied) else None
            return Outcome.ERROR

    def release(self, *, deadline: float, annotate: Callable[[dict[str, str]], dict[str, str]] | None = None) -> bool:
        """Hand the Lease back (when ours) and/or change its annotations, retrying a 409 with a fresh read."""
        self._ours = None
        for _ in range(5):
            try:
                lease = self.read(deadline=deadline)
                if lease is None:
                    return True
                spec = dict(lease.get("spec") or {})
                ours = spec.get("holderIdentity") == self.identity
                if not ours and annotate is None:
                    return True
                if ours:
                    spec.update(holderIdentity=None, renewTime=None, acquireTime=None)
                    lease["spec"] = spec
                if annotate is not None:
                    meta = dict(lease.get("metadata") or {})
                    meta["annotations"] = annotate(annotations_of(lease))
                    lease["metadata"] = meta
                self._write(lease, deadline=deadline)
                self.holder = None
                return True
            except Conflict:
                continue
            except ApiError as exc:
                log.info("%s (it expires by itself)", exc)
                return False
        return False
