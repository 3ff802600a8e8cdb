"""The latest state of one ConfigMap, followed by a watch: what the admission webhook reads its verdict from.

The MutatingAdmissionPolicy reads the readiness ConfigMap through its binding's ``paramRef`` (the API server
keeps it in an informer); the webhook does the same with a ``ListWatcher`` of that one object
(``listwatch.named``). Three states, because the policy distinguishes two of them and the webhook has a third:
*unknown* (not listed yet), *absent* and *present* (its ``data``). After the first list a failing watch keeps
the last state seen: the verdict changes rarely, and the listwatch logs the failure.
"""

from __future__ import annotations

import logging
import threading

from patcher.adapters.kube.backoff import Backoff
from patcher.adapters.kube.listwatch import Following, ListWatcher, named
from patcher.adapters.kube.transport import CONFIGMAPS, Api
from patcher.core.kubeobj import Obj, dig


class ConfigMapView(Following):
    """Follows ConfigMap ``namespace/name``; ``state()`` is ``(known, params)`` with params ``None`` if absent."""

    def __init__(self, api: Api, namespace: str, name: str, *, backoff: Backoff | None = None,
                 failure_level: int = logging.WARNING) -> None:
        self.namespace, self.name = namespace, name
        self._lock = threading.Lock()
        self._known = False
        self._params: Obj | None = None
        self._watcher = ListWatcher(api, CONFIGMAPS, namespace, **named(name, self._set),
                                    name=f"watch ConfigMap {namespace}/{name}", backoff=backoff,
                                    failure_level=failure_level)

    def _set(self, obj: Obj | None) -> None:
        data = dig(obj, "data")  # what the rules read: the rest of the object (managedFields, ...) is not kept
        with self._lock:
            self._params = None if obj is None else {"data": dict(data)} if isinstance(data, dict) else {}
            self._known = True

    def state(self) -> tuple[bool, Obj | None]:
        with self._lock:
            return self._known, self._params

