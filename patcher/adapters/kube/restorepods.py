"""The API side of ``scheduler-patcher restore-nodes`` (``patcher.core.restorepods`` builds and judges the pods).

The control-plane Nodes, one read of the PodTemplate and of the command's own pod (for its Job), one create per
node, a watch of this run's pods (a label selector), and one merge patch per restored Node that leaves the
agent's annotations as a restore on exit does (``state: Restored``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from patcher.adapters.kube.errors import NotFound, api_json
from patcher.adapters.kube.listwatch import Following, ListWatcher
from patcher.adapters.kube.transport import MERGE_PATCH, NODES, PODS, PODTEMPLATES, Api
from patcher.core import restorepods
from patcher.core.kubeobj import Obj, dig
from patcher.core.status import NodeState, NodeStatus, desired_annotations, merge_patch


def control_plane_nodes(api: Api, selectors: Sequence[str]) -> list[Obj]:
    """The Nodes matching any of ``selectors`` (Kubernetes has no OR in one selector), each once, by name."""
    found: dict[str, Obj] = {}
    for selector in selectors:
        body = api_json(f"list nodes ({selector})", api.list, NODES, label_selector=selector)
        for item in body.get("items") or []:
            name = dig(item, "metadata", "name")
            if isinstance(item, dict) and isinstance(name, str):
                found.setdefault(name, item)
    return [found[name] for name in sorted(found)]


def read_pod_template(api: Api, namespace: str, name: str) -> Obj:
    body = api_json(f"read podtemplate {namespace}/{name}", api.get, PODTEMPLATES, name, namespace=namespace)
    return body if isinstance(body, dict) else {}


def job_owner_of(api: Api, namespace: str, pod_name: str | None) -> Obj | None:
    """The ownerReference to the Job the command's pod belongs to (None outside a Job, or unknown)."""
    if not pod_name:
        return None
    try:
        pod = api_json(f"read pod {namespace}/{pod_name}", api.get, PODS, pod_name, namespace=namespace)
    except NotFound:
        return None
    return restorepods.job_owner(pod) if isinstance(pod, dict) else None


def create_pod(api: Api, namespace: str, pod: Obj) -> Obj:
    node = dig(pod, "spec", "nodeName")
    body = api_json(f"create the restore pod for node {node}", api.create, PODS, pod, namespace=namespace)
    return body if isinstance(body, dict) else {}


def mark_restored(api: Api, node: str, prefix: str) -> None:
    """The Node's annotations as the agent's own restore leaves them: ``state: Restored``, the rest removed."""
    body = merge_patch(desired_annotations(NodeStatus(NodeState.RESTORED), prefix))
    api_json(f"annotate node {node}", api.patch, NODES, node, body, content_type=MERGE_PATCH)


class RunPods(Following):
    """This run's pods as the watch last saw them; ``changed`` is set on every change."""

    def __init__(self, api: Api, namespace: str, run: str) -> None:
        self.changed = threading.Event()
        self._lock = threading.Lock()
        self._pods: dict[str, Obj] = {}
        self._watcher = ListWatcher(
            api, PODS, namespace, label_selector=f"{restorepods.RUN_LABEL}={run}",
            on_sync=self._sync, on_event=self._event, name=f"restore-pods-{run}")

    def snapshot(self) -> list[Obj]:
        with self._lock:
            return list(self._pods.values())

    def _sync(self, items: list[Any]) -> None:
        with self._lock:
            self._pods = {str(dig(i, "metadata", "name")): i for i in items if isinstance(i, dict)}
        self.changed.set()

    def _event(self, kind: str, obj: Any) -> None:
        if not isinstance(obj, dict):
            return
        name = str(dig(obj, "metadata", "name"))
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(name, None)
            else:
                self._pods[name] = obj
        self.changed.set()
