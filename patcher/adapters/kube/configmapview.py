"""The latest state of one ConfigMap, followed by a watch: what the admission webhook reads its verdict from.

The MutatingAdmissionPolicy reads the readiness ConfigMap through its binding's ``paramRef`` (the API server
keeps it in an informer); the webhook does the same with a ``ListWatcher`` of that one object
(``listwatch.named``). Three states, because the policy distinguishes two of them and the webhook has a third:
*unknown* (not listed yet), *absent* and *present* (its ``data``). After the first list a failing watch keeps
the last state seen: the verdict changes rarely, and the listwatch logs the failure.
"""

from __future__ import annotations

import logging

from patcher.adapters.kube.listwatch import NamedListWatcher
from patcher.adapters.kube.transport import CONFIGMAPS, Api
from patcher.core.kubeobj import Obj, dig


def _params(obj: Obj) -> Obj:
    """What the rules read: the rest of the object (managedFields, ...) is not kept."""
    data = dig(obj, "data")
    return {"data": dict(data)} if isinstance(data, dict) else {}


class ConfigMapView(NamedListWatcher):
    """Follows ConfigMap ``namespace/name``; ``state()`` is ``(known, params)`` with params ``None`` if absent."""

    def __init__(self, api: Api, namespace: str, name: str) -> None:
        super().__init__(api, CONFIGMAPS, namespace, name, label=f"watch ConfigMap {namespace}/{name}",
                         keep=_params, failure_level=logging.WARNING)
