"""One scheduler restart at a time across the control plane, through a ``coordination.k8s.io/v1`` Lease.

Without it every agent writes its manifest the moment the ConfigMap changes, so a config the scheduler
rejects takes every scheduler down together. With it, the agent that wants to change its manifest holds the
Lease until its scheduler is Ready again (or it rolled back); the others wait their turn. The first node is
the canary: a config hash that rolled back is recorded on the Lease and no other node tries it.

A holder that dies is superseded once ``renewTime + leaseDurationSeconds`` has passed. All calls are short
and never raise: an unreachable API means "not acquired", and the file-level work waits rather than acting
uncoordinated.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from patcher.kube.client import describe_error

log = logging.getLogger("patcher.rollout")

BAD_HASHES_SUFFIX = "bad-source-hashes"  # source fingerprints: comparable across scheduler versions
MAX_BAD = 20  # the annotation keeps the most recent ones: enough for any real history, bounded in size


def _now_micro(clock: Callable[[], float]) -> dt.datetime:
    return dt.datetime.fromtimestamp(clock(), tz=dt.UTC)


def _as_dt(value: Any) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, str) and value:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return None


class RolloutLease:
    """Acquire, renew and release the rollout Lease; read and extend its list of configs that failed."""

    def __init__(self, api: k8s.ApiClient, namespace: str, name: str, holder: str, *, duration: int = 60,
                 prefix: str = "scheduler-patcher.io", clock: Callable[[], float] = time.time) -> None:
        self.api = k8s.CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name
        self.holder = holder
        self.duration = duration
        self.bad_key = f"{prefix.rstrip('/')}/{BAD_HASHES_SUFFIX}"
        self.clock = clock
        self.held = False
        self.refused_bad = False
        self.last_renew = 0.0
        self.current_holder: str | None = None

    # -- reading ---------------------------------------------------------------------------------------

    def _get(self) -> k8s.V1Lease | None:
        try:
            lease: k8s.V1Lease = self.api.read_namespaced_lease(self.name, self.namespace)
            return lease
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _expired(self, lease: k8s.V1Lease) -> bool:
        spec = lease.spec
        if spec is None or not spec.holder_identity:
            return True
        renewed = _as_dt(spec.renew_time) or _as_dt(spec.acquire_time)
        if renewed is None:
            return True
        duration = spec.lease_duration_seconds or self.duration
        return _now_micro(self.clock) > renewed + dt.timedelta(seconds=duration)

    def _bad_of(self, lease: k8s.V1Lease) -> set[str]:
        annotations = (lease.metadata.annotations or {}) if lease.metadata else {}
        return {h for h in str(annotations.get(self.bad_key, "")).split(",") if h}

    # -- holding ---------------------------------------------------------------------------------------

    def acquire(self, source_hash: str = "") -> bool:
        """Take the Lease if it is free, expired or already ours. False (never raises) otherwise.

        ``source_hash``: the source about to be rolled out. When the Lease read here lists it as bad, the
        Lease is not taken and ``refused_bad`` is set: checking the list on the very object we replace (the
        resourceVersion guards the replace) closes the gap between "is it bad?" and "take the Lease".
        """
        now = _now_micro(self.clock)
        self.refused_bad = False
        try:
            lease = self._get()
            if source_hash and lease is not None and source_hash in self._bad_of(lease):
                self.refused_bad = True
                self.held = False
                return False
            if lease is None:
                body = k8s.V1Lease(
                    metadata=k8s.V1ObjectMeta(name=self.name, namespace=self.namespace),
                    spec=k8s.V1LeaseSpec(holder_identity=self.holder, lease_duration_seconds=self.duration,
                                         acquire_time=now, renew_time=now, lease_transitions=0))
                self.api.create_namespaced_lease(self.namespace, body)
            else:
                spec = lease.spec or k8s.V1LeaseSpec()
                mine = spec.holder_identity == self.holder
                if not mine and not self._expired(lease):
                    self.current_holder = spec.holder_identity
                    self.held = False  # it was taken over while we thought we held it
                    return False
                if not mine:
                    spec.lease_transitions = (spec.lease_transitions or 0) + 1
                    spec.acquire_time = now
                    if spec.holder_identity:
                        log.warning("taking over the rollout lease from %s (expired)", spec.holder_identity)
                spec.holder_identity = self.holder
                spec.renew_time = now
                spec.lease_duration_seconds = self.duration
                lease.spec = spec
                self.api.replace_namespaced_lease(self.name, self.namespace, lease)  # resourceVersion: CAS
        except (ApiException, HTTPError, OSError) as exc:
            log.info("rollout lease not acquired: %s", describe_error(exc))
            if isinstance(exc, ApiException) and exc.status == 409:
                self.held = False  # someone replaced it between our read and our write
            return False
        self.held = True
        self.current_holder = self.holder
        self.last_renew = time.monotonic()
        return True

    def renew_if_due(self) -> None:
        if self.held and time.monotonic() - self.last_renew >= self.duration / 3:
            self.acquire()

    def release(self, *, bad_hash: str | None = None) -> None:
        """Give the Lease up (and record a config that failed, for every other node to skip)."""
        for _ in range(5):
            try:
                lease = self._get()
                if lease is None:
                    break
                if bad_hash:
                    meta = lease.metadata or k8s.V1ObjectMeta()
                    annotations = dict(meta.annotations or {})
                    known = [h for h in str(annotations.get(self.bad_key, "")).split(",") if h]
                    if bad_hash not in known:
                        annotations[self.bad_key] = ",".join([*known, bad_hash][-MAX_BAD:])
                    meta.annotations = annotations
                    lease.metadata = meta
                if lease.spec is not None and lease.spec.holder_identity == self.holder:
                    lease.spec.holder_identity = None
                    lease.spec.renew_time = None
                    lease.spec.acquire_time = None
                self.api.replace_namespaced_lease(self.name, self.namespace, lease)
                break
            except ApiException as exc:
                if exc.status == 409:
                    continue  # someone else updated it in between: read again
                log.warning("cannot release the rollout lease: %s", describe_error(exc))
                break
            except (HTTPError, OSError) as exc:
                log.warning("cannot release the rollout lease: %s (it expires by itself)", describe_error(exc))
                break
        self.held = False
