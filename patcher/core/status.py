"""What the agent tells the cluster about its node: states, annotation values and event bodies. Pure, so that
the readiness verdict reads back exactly what the agent wrote.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Final

from patcher.core.timefmt import rfc3339

DEFAULT_PREFIX: Final = "scheduler-patcher.io/"
#: ``<prefix>/hold`` on a Node (any value, e.g. who and why): its agent leaves the node as it is until it goes.
HOLD_KEY: Final = "hold"
COMPONENT: Final = "scheduler-patcher"
#: Node events live in ``default``, like the kubelet's: a Node is cluster-scoped and the events API accepts
#: an event about a cluster-scoped object only in the empty or the ``default`` namespace.
NODE_EVENT_NAMESPACE: Final = "default"
#: Longer event messages are cut: ``events.k8s.io/v1`` caps ``note`` at 1 kB and ``kubectl describe`` shows
#: one line per event anyway.
MAX_EVENT_MESSAGE: Final = 1024


class NodeState(enum.StrEnum):
    """The ``state`` annotation: where the node stands in the patch lifecycle."""

    PENDING = "Pending"
    WAITING_FOR_RESTART = "WaitingForRestart"
    READY = "Ready"
    FAILED = "Failed"
    ROLLED_BACK = "RolledBack"
    RESTORED = "Restored"
    #: Not a phase of the record: what the Node says while an operator holds it (its ``<prefix>/hold``).
    HELD = "Held"


#: The only states whose ``message`` annotation is kept; in every other state a stale sentence would mislead.
#: Pending carries one only while the extender pre-flight holds the write back (which extender, which error);
#: Ready only while the periodic probe finds an extender that stopped answering (the cluster verdict: NotReady);
#: WaitingForRestart only while a restart deadline passed without a healthy kubelet on the node.
STATES_WITH_MESSAGE: Final = frozenset({NodeState.FAILED, NodeState.ROLLED_BACK, NodeState.PENDING,
                                        NodeState.READY, NodeState.HELD, NodeState.WAITING_FOR_RESTART})

#: Per state: the Event reason for entering it (CamelCase, as ``kubectl describe`` shows them) and its message
#: when the state carries none (``{}``: the config's first 12 digits).
_EVENTS: Final[dict[NodeState, tuple[str, str]]] = {
    NodeState.PENDING: ("PatchPending", "Patch of kube-scheduler with config {} is pending."),
    NodeState.WAITING_FOR_RESTART: ("SchedulerPatched", "kube-scheduler manifest patched with config {}; waiting "
                                    "for the scheduler to restart."),
    NodeState.READY: ("SchedulerRestarted", "kube-scheduler restarted and runs config {}."),
    NodeState.FAILED: ("PatchFailed", "Patching kube-scheduler with config {} failed."),
    NodeState.ROLLED_BACK: ("PatchRolledBack", "Config {} was rolled back."),
    NodeState.RESTORED: ("SchedulerRestored", "kube-scheduler manifest restored to its original content."),
    NodeState.HELD: ("NodeHeld", "kube-scheduler manifest held by an operator."),
}

_WARNING_STATES: Final = frozenset({NodeState.FAILED, NodeState.ROLLED_BACK, NodeState.HELD})


@dataclass(frozen=True)
class NodeStatus:
    """The desired content of the node's annotations. Times are integer nanoseconds since the epoch."""

    state: NodeState
    config_hash: str | None = None
    manifest_mtime_ns: int | None = None
    restarted_at_ns: int | None = None
    message: str | None = None
    #: Fingerprint of the source folder (the ConfigMap's data). One ConfigMap renders to different files on
    #: nodes that run different scheduler versions (mid-upgrade), so this is what nodes have in common.
    source_hash: str | None = None


@dataclass(frozen=True)
class EventSpec:
    """One state transition to report as a Kubernetes Event (built into a body only when it is sent)."""

    reason: str
    message: str
    type: str
    at_ns: int


def normalize_prefix(prefix: str) -> str:
    """Accept ``scheduler-patcher.io`` or ``scheduler-patcher.io/`` and return the form ending in ``/``."""
    stripped = prefix.strip().rstrip("/")
    if not stripped:
        raise ValueError("the annotation prefix must not be empty")
    return stripped + "/"


def desired_annotations(status: NodeStatus, prefix: str = DEFAULT_PREFIX) -> dict[str, str | None]:
    """The six annotations for ``status``; ``None`` means "remove" (``null`` in a JSON merge patch).

    Every key is always present so one patch also clears values left behind by an earlier run.
    """
    p = normalize_prefix(prefix)
    keep_message = status.state in STATES_WITH_MESSAGE and bool(status.message)
    return {
        p + "state": str(status.state),
        p + "config-hash": status.config_hash or None,
        p + "source-hash": status.source_hash or None,
        p + "manifest-mtime": (
            rfc3339(status.manifest_mtime_ns) if status.manifest_mtime_ns is not None else None
        ),
        p + "restarted-at": (
            rfc3339(status.restarted_at_ns) if status.restarted_at_ns is not None else None
        ),
        p + "message": status.message if keep_message else None,
    }


def merge_patch(annotations: dict[str, str | None]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) body that sets ``annotations`` on an object's metadata."""
    return {"metadata": {"annotations": dict(annotations)}}


def transition_event(
    status: NodeStatus, at_ns: int, *, reason: str | None = None, message: str | None = None
) -> EventSpec:
    """The event for entering ``status.state``; ``reason``/``message`` override the defaults (the message: the
    state's own, except Ready's, else the state's sentence)."""
    if not message and status.state in STATES_WITH_MESSAGE and status.state != NodeState.READY:
        message = status.message
    config = status.config_hash[:12] if status.config_hash else "none"
    return EventSpec(
        reason=reason or _EVENTS[status.state][0],
        message=(message or _EVENTS[status.state][1].format(config))[:MAX_EVENT_MESSAGE],
        type="Warning" if status.state in _WARNING_STATES else "Normal",
        at_ns=at_ns,
    )


def event_body(spec: EventSpec, *, node_name: str, node_uid: str | None) -> dict[str, Any]:
    """A core/v1 Event about the Node, as the kubelet writes its own node events.

    The name is derived from the transition time (``<node>.<ns in hex>``, the kubelet's scheme), so a retry
    after a lost response collides (409) instead of duplicating the event. Without the node's real uid the
    node name stands in for it, again like the kubelet: ``kubectl describe node`` searches for both.
    """
    stamp = rfc3339(spec.at_ns, 0)  # metav1.Time: whole seconds
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{node_name}.{spec.at_ns:x}", "namespace": NODE_EVENT_NAMESPACE},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid or node_name},
        "reason": spec.reason,
        "message": spec.message,
        "type": spec.type,
        "source": {"component": COMPONENT, "host": node_name},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "reportingComponent": COMPONENT,
        "reportingInstance": node_name,
    }


def annotation_snapshot(node: dict[str, Any], prefix: str = DEFAULT_PREFIX) -> dict[str, str]:
    """The annotations under ``prefix`` on a Node object (as a plain dict), keyed without the prefix."""
    p = normalize_prefix(prefix)
    annotations = node.get("metadata", {}).get("annotations") or {}
    return {k[len(p):]: v for k, v in annotations.items() if k.startswith(p) and isinstance(v, str)}
