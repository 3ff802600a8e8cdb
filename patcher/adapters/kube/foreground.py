"""The API side of ``scheduler-patcher stop-agents``: delete one DaemonSet in the foreground and follow it by name.

With ``propagationPolicy: Foreground`` the API server keeps the DaemonSet (``deletionTimestamp`` and the
``foregroundDeletion`` finalizer) until the garbage collector has deleted every object it owns with
``blockOwnerDeletion`` (the DaemonSet controller sets it on each of its pods) and those are gone, i.e. the
kubelets ended them. So the DaemonSet's own watch tells when its pods are gone: no pod is read, and RBAC names
the one DaemonSet (``resourceNames``: delete, and list/watch with a ``metadata.name`` field selector).
"""

from __future__ import annotations

from typing import Final

from patcher.adapters.kube.errors import NotFound, api_json
from patcher.adapters.kube.listwatch import NamedListWatcher
from patcher.adapters.kube.transport import DAEMONSETS, Api
from patcher.core.kubeobj import Obj

FOREGROUND: Final = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"}


def delete_foreground(api: Api, namespace: str, name: str) -> Obj | None:
    """Ask for the DaemonSet's foreground deletion; the DaemonSet as the server answers, None when there is none."""
    try:
        body = api_json(f"delete daemonset {namespace}/{name}", api.delete, DAEMONSETS, name, FOREGROUND,
                        namespace=namespace)
    except NotFound:
        return None
    return body if isinstance(body, dict) else {}


def follow(api: Api, namespace: str, name: str) -> NamedListWatcher:
    """The DaemonSet as its watch last saw it (``NamedListWatcher.state``: ``None`` once it is gone)."""
    return NamedListWatcher(api, DAEMONSETS, namespace, name, label=f"watch daemonset {namespace}/{name}")
