"""Does a DaemonSet still want a pod on this node? The part of the DaemonSet controller's decision a stop needs.

On SIGTERM with ``--restore-on-exit=auto`` the agent keeps its patch only when a successor pod will come to the
node, that is while the DaemonSet's pod template still fits the node: its ``nodeSelector``, its required node
affinity, and the node's ``NoSchedule``/``NoExecute`` taints against its tolerations plus those the DaemonSet
controller adds to every daemon pod. Pure, on the raw JSON of the DaemonSet and the Node. Not evaluated:
preferred affinity (it never excludes a node), resources, host ports and pod (anti-)affinity, which a daemon
pod on its own node meets as the one it replaces did.
"""

from __future__ import annotations

from typing import Any

from patcher.core.kubeobj import Obj, dig

#: Tolerations the DaemonSet controller adds to every daemon pod (``util.AddOrUpdateDaemonPodTolerations``).
DAEMON_TOLERATIONS: tuple[Obj, ...] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
HOST_NETWORK_TOLERATION: Obj = {"key": "node.kubernetes.io/network-unavailable", "operator": "Exists",
                                "effect": "NoSchedule"}


def _requirement(value: str | None, operator: str, values: list[Any]) -> bool:
    wanted = [str(v) for v in values]
    if operator == "In":
        return value is not None and value in wanted
    if operator == "NotIn":
        return value is None or value not in wanted
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(wanted) == 1:
        try:
            have, bound = int(value), int(wanted[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False  # an unknown operator matches nothing, as the API server's selector does


def _term(term: Any, labels: dict[str, str], name: str) -> bool:
    if not isinstance(term, dict):
        return False
    expressions = [e for e in term.get("matchExpressions") or [] if isinstance(e, dict)]
    fields = [f for f in term.get("matchFields") or [] if isinstance(f, dict)]
    if not expressions and not fields:
        return False
    for e in expressions:
        if not _requirement(labels.get(str(e.get("key"))), str(e.get("operator")), e.get("values") or []):
            return False
    for f in fields:
        value = name if f.get("key") == "metadata.name" else None
        if str(f.get("operator")) not in ("In", "NotIn") or not _requirement(value, str(f.get("operator")),
                                                                              f.get("values") or []):
            return False
    return True


def _tolerates(toleration: Obj, taint: Obj) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and str(toleration.get("value") or "") == str(taint.get("value") or "")


def selects(daemonset: Obj, node: Obj) -> tuple[bool, str]:
    """Whether the DaemonSet's pod template still fits ``node``, and when not, why (one phrase)."""
    spec = dig(daemonset, "spec", "template", "spec")
    spec = spec if isinstance(spec, dict) else {}
    raw = dig(node, "metadata", "labels")
    labels = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
    name = str(dig(node, "metadata", "name") or "")
    selector = spec.get("nodeSelector")
    for key, value in (selector.items() if isinstance(selector, dict) else []):
        if labels.get(str(key)) != str(value):
            return False, f"nodeSelector {key}={value} does not match the node's labels"
    terms = dig(spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
                "nodeSelectorTerms")
    if isinstance(terms, list) and not any(_term(t, labels, name) for t in terms):
        return False, "no term of its required node affinity matches the node"
    tolerations = [t for t in spec.get("tolerations") or [] if isinstance(t, dict)]
    tolerations += [*DAEMON_TOLERATIONS, *([HOST_NETWORK_TOLERATION] if spec.get("hostNetwork") else [])]
    for taint in dig(node, "spec", "taints") or []:
        if not isinstance(taint, dict) or taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates(t, taint) for t in tolerations):
            return False, f"the node's taint {taint.get('key')}:{taint.get('effect')} is not tolerated"
    return True, ""
