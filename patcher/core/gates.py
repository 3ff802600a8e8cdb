"""Scheduling gates on pods (KEP-3521): which pods wait on ours, and the patch that removes exactly it. Pure.

The patch first ``test``s the pod's whole current ``spec.schedulingGates`` array, then ``replace``s it with the
same array minus our gate, so a concurrent change by another controller makes it fail (422) instead of
writing back a stale list that would resurrect or reorder someone else's gates.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from patcher.core.kubeobj import Obj, dig
from patcher.core.timefmt import parse_rfc3339_ns

DEFAULT_GATE: Final = "scheduler-patcher.io/extender-ready"


@dataclass(frozen=True, slots=True)
class GatedPod:
    """What the gatekeeper keeps of a pod: a backlog of 10 000 gated pods must fit a small Deployment's memory
    limit, and the release needs only the pod's identity, age and gates (a ``PodSchedulingGate`` has no field but
    ``name``, so the names rebuild the array the ``test`` op compares)."""

    namespace: str
    name: str
    uid: str
    created: str  #: ``metadata.creationTimestamp`` as the API wrote it (RFC 3339 sorts as text)
    gates: tuple[str, ...]
    unbound: bool  #: live, Pending and not bound to a node: a gate on it still holds it back

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    def waits_on(self, gate: str) -> bool:
        return self.unbound and gate in self.gates


def slim(pod: Obj) -> GatedPod:
    """The ``GatedPod`` of a pod as the API serves it."""
    uid = dig(pod, "metadata", "uid")
    ns, name = str(dig(pod, "metadata", "namespace") or ""), str(dig(pod, "metadata", "name") or "")
    # Namespaces and gate names repeat across thousands of pods: one copy of each string.
    return GatedPod(sys.intern(ns), name, str(uid or ""),
                    str(dig(pod, "metadata", "creationTimestamp") or ""),
                    tuple(sys.intern(str(g.get("name"))) for g in dig(pod, "spec", "schedulingGates") or []
                          if isinstance(g, dict)),
                    not dig(pod, "metadata", "deletionTimestamp")
                    and dig(pod, "status", "phase") in (None, "", "Pending") and not dig(pod, "spec", "nodeName"))


def release_patch(pod: GatedPod, gate: str) -> list[Obj]:
    """The JSON patch that removes ``gate`` from ``pod`` only if its gates are still exactly what we read."""
    gates: list[Obj] = [{"name": g} for g in pod.gates]
    kept = [g for g in gates if g["name"] != gate]
    return [
        {"op": "test", "path": "/spec/schedulingGates", "value": gates},
        {"op": "replace", "path": "/spec/schedulingGates", "value": kept},
    ]


def waited_seconds(pod: GatedPod, now: float) -> float | None:
    """Seconds from the pod's creation to ``now`` (wall clock), ``None`` without a readable creation time."""
    try:
        return now - parse_rfc3339_ns(pod.created) / 1e9 if pod.created else None
    except ValueError:
        return None


class ReleaseFeed:
    """The pods of one drain, oldest first (creation time, then namespace and name), handed out one at a time,
    each only once ``may_send`` allowed it.

    ``take(may_send)`` calls ``may_send(boundary)`` and returns the next pod if it answered True; ``None`` when
    no pod is left, or once ``may_send`` answered False (then for every later call too: the drain is over).
    ``boundary`` is True for the first pod of every batch of ``batch_size`` but the first: the caller checks
    there whether the verdict may have changed (and reads it again if so); before any other pod it checks only
    what is cheap. There is no barrier at a boundary: a pod of the next batch may go while pods of the one
    before are still in flight.

    Not thread-safe, on purpose: the gatekeeper's workers call ``take`` under one lock, ``may_send`` included.
    That lock is the guarantee: once ``may_send`` has answered False, or while it is reading the verdict again,
    no worker starts a send, so what still goes after the verdict turned NotReady (as far as the gatekeeper has
    learned) is the sends already in flight, at most one per worker.
    """

    def __init__(self, pods: Iterable[GatedPod], batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError("the batch size must be at least 1")
        self._pods = sorted(pods, key=lambda p: (p.created, p.namespace, p.name))
        self.batch_size = batch_size
        self.taken = 0  #: pods handed out so far
        self.stopped = False  #: ``may_send`` answered False

    @property
    def left(self) -> int:
        """Pods not handed out."""
        return len(self._pods) - self.taken

    @property
    def batches(self) -> int:
        """Batches begun: the first pod of each was handed out."""
        return -(-self.taken // self.batch_size)

    def take(self, may_send: Callable[[bool], bool]) -> GatedPod | None:
        if self.stopped or self.taken >= len(self._pods):
            return None
        if not may_send(self.taken > 0 and self.taken % self.batch_size == 0):
            self.stopped = True
            return None
        self.taken += 1
        return self._pods[self.taken - 1]
