"""The pure parts of the uninstall's restore (``scheduler-patcher restore-nodes``): the pod built for each
control-plane node, and the verdict over the pods seen so far."""

from __future__ import annotations

import copy
import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from patcher.core.kubeobj import Obj, dig

#: Label of every pod of one run (its value is the run's id): the watch follows exactly this run's pods.
RUN_LABEL: Final = "scheduler-patcher.io/restore-run"
#: Annotation naming the node a pod restores (a node name can be longer than a label value may be).
NODE_ANNOTATION: Final = "scheduler-patcher.io/restore-node"
GENERATE_NAME: Final = "scheduler-patcher-restore-"


class Outcome(enum.StrEnum):
    """Where one node's restore stands."""

    RESTORED = "restored"  # its pod succeeded: `restore` exited 0 (a clean node exits 0 too)
    RUNNING = "running"
    WAITING = "waiting"  # no pod seen yet, or Pending
    FAILED = "failed"  # its pod failed for good (restartPolicy Never, or refused by the kubelet)


@dataclass(frozen=True)
class NodeRestore:
    node: str
    outcome: Outcome
    detail: str = ""  # what the pod shows: a container's waiting reason, an exit code, the pod's message

    def line(self) -> str:
        return f"node {self.node}: {self.outcome}" + (f" ({self.detail})" if self.detail else "")


def restore_pod(template: Obj, node: str, run: str, namespace: str, owner: Obj | None = None) -> Obj:
    """The pod that runs ``template``'s spec on ``node`` (a PodTemplate object's ``template``).

    Bound with ``spec.nodeName``: the kubelet runs it without the scheduler, whatever the node's labels; the
    template's tolerations (every taint) keep a ``NoExecute`` taint from evicting it. ``owner`` (the Job this
    run belongs to) makes the pods go when the Job goes (its ``ttlSecondsAfterFinished``), logs kept until then.
    """
    pod_template = template.get("template")
    if not isinstance(pod_template, dict) or not isinstance(pod_template.get("spec"), dict):
        raise ValueError("the PodTemplate has no template.spec")
    meta = pod_template.get("metadata") or {}
    spec = copy.deepcopy(pod_template["spec"])
    metadata: Obj = {"generateName": GENERATE_NAME, "namespace": namespace,
                     "labels": {**(meta.get("labels") or {}), RUN_LABEL: run},
                     "annotations": {**(meta.get("annotations") or {}), NODE_ANNOTATION: node}}
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    spec["nodeName"] = node
    spec.pop("affinity", None)  # nodeName decides; a node affinity the node fails would make the kubelet refuse it
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _container_detail(pod: Obj) -> str:
    statuses = [*(dig(pod, "status", "initContainerStatuses") or []), *(dig(pod, "status", "containerStatuses") or [])]
    for status in statuses:
        if not isinstance(status, dict):
            continue
        waiting = dig(status, "state", "waiting")
        if isinstance(waiting, dict) and waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
            return f"{status.get('name')}: {waiting.get('reason')}" + (
                f": {waiting['message']}" if waiting.get("message") else "")
        last = dig(status, "lastState", "terminated") or dig(status, "state", "terminated")
        if isinstance(last, dict) and last.get("exitCode") not in (None, 0):
            return f"{status.get('name')} exited {last.get('exitCode')}, restarts {status.get('restartCount', 0)}"
    return ""


def node_outcome(node: str, pod: Obj | None) -> NodeRestore:
    """One node's outcome from its pod (``None``: not seen yet)."""
    if pod is None:
        return NodeRestore(node, Outcome.WAITING, "no pod yet")
    phase = dig(pod, "status", "phase")
    name = dig(pod, "metadata", "name") or "?"
    if phase == "Succeeded":
        return NodeRestore(node, Outcome.RESTORED, f"pod {name}")
    detail = ", ".join(x for x in (f"pod {name}", _container_detail(pod),
                                   str(dig(pod, "status", "reason") or ""),
                                   str(dig(pod, "status", "message") or "")) if x)
    outcome = {"Failed": Outcome.FAILED, "Running": Outcome.RUNNING}.get(phase, Outcome.WAITING)  # Pending, Unknown
    return NodeRestore(node, outcome, detail)


def pods_by_node(pods: Iterable[Obj]) -> dict[str, Obj]:
    """The pods of a run keyed by the node each restores (the newest when a node has several)."""
    found: dict[str, Obj] = {}
    for pod in pods:
        node = dig(pod, "metadata", "annotations", NODE_ANNOTATION) or dig(pod, "spec", "nodeName")
        if not isinstance(node, str):
            continue
        old = found.get(node)
        if old is None or str(dig(pod, "metadata", "creationTimestamp") or "") >= str(
                dig(old, "metadata", "creationTimestamp") or ""):
            found[node] = pod
    return found


def finished(outcomes: Sequence[NodeRestore]) -> bool:
    """True once nothing can change any more: every node restored or failed for good."""
    return all(o.outcome in (Outcome.RESTORED, Outcome.FAILED) for o in outcomes)


def job_owner(pod: Obj) -> Obj | None:
    """The ownerReference (not a controller one) to the Job that owns ``pod``, for the pods it creates."""
    for ref in dig(pod, "metadata", "ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("kind") == "Job" and ref.get("name") and ref.get("uid"):
            return {"apiVersion": ref.get("apiVersion", "batch/v1"), "kind": "Job", "name": ref["name"],
                    "uid": ref["uid"], "blockOwnerDeletion": False}
    return None


def describe(outcomes: Sequence[NodeRestore], not_ready: Iterable[str] = ()) -> list[str]:
    """One line per node not restored, with what its pod shows and whether the node is Ready."""
    down = set(not_ready)
    return [o.line() + ("; the node is not Ready: its kubelet runs the pod when it is back" if o.node in down else "")
            for o in outcomes if o.outcome is not Outcome.RESTORED]
