"""Scheduling gates on pods (KEP-3521): which pods wait on ours, and the patch that removes exactly it. Pure.

The patch first ``test``s the pod's whole current ``spec.schedulingGates`` array, then ``replace``s it with the
same array minus our gate, so a concurrent change by another controller makes it fail (422) instead of
writing back a stale list that would resurrect or reorder someone else's gates.
"""

from __future__ import annotations

from typing import Final

from patcher.core.kubeobj import Obj, dig
from patcher.core.timefmt import parse_rfc3339_ns

DEFAULT_GATE: Final = "scheduler-patcher.io/extender-ready"


def gate_names(pod: Obj) -> list[str]:
    gates = dig(pod, "spec", "schedulingGates") or []
    return [str(g.get("name")) for g in gates if isinstance(g, dict)]


def waits_on(pod: Obj, gate: str) -> bool:
    """Whether ``pod`` is a Pending, live pod that carries ``gate``."""
    return (gate in gate_names(pod) and not dig(pod, "metadata", "deletionTimestamp")
            and dig(pod, "status", "phase") in (None, "", "Pending") and not dig(pod, "spec", "nodeName"))


def release_patch(pod: Obj, gate: str) -> list[Obj]:
    """The JSON patch that removes ``gate`` from ``pod`` only if its gates are still exactly what we read."""
    gates = dig(pod, "spec", "schedulingGates") or []
    kept = [g for g in gates if not (isinstance(g, dict) and g.get("name") == gate)]
    return [
        {"op": "test", "path": "/spec/schedulingGates", "value": gates},
        {"op": "replace", "path": "/spec/schedulingGates", "value": kept},
    ]


def pod_key(pod: Obj) -> tuple[str, str]:
    """(namespace, name)."""
    return str(dig(pod, "metadata", "namespace") or ""), str(dig(pod, "metadata", "name") or "")


def created(pod: Obj) -> str:
    """The creation time as the API wrote it (RFC 3339 sorts as text): oldest pods are released first."""
    return str(dig(pod, "metadata", "creationTimestamp") or "")


def waited_seconds(pod: Obj, now: float) -> float | None:
    """Seconds from the pod's creation to ``now`` (wall clock), ``None`` without a readable creation time."""
    stamp = dig(pod, "metadata", "creationTimestamp")
    try:
        return now - parse_rfc3339_ns(stamp) / 1e9 if isinstance(stamp, str) else None
    except ValueError:
        return None
