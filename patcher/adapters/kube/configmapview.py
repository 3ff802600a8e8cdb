"""The latest state of one ConfigMap, followed by a watch: what the admission webhook reads its verdict from.

The MutatingAdmissionPolicy reads the readiness ConfigMap through its binding's ``paramRef`` (the API server
keeps it in an informer); the webhook does the same with a ``ListWatcher`` narrowed to that one object
(``fieldSelector=metadata.name=...``, which RBAC authorizes against ``resourceNames``). Three states, because
the policy distinguishes two of them and the webhook has a third: *unknown* (not listed yet), *absent* and
*present* (its ``data``). After the first list a failing watch keeps the last state seen: the verdict changes
rarely, and the listwatch logs the failure.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from patcher.adapters.kube.backoff import Backoff
from patcher.adapters.kube.listwatch import ListWatcher
from patcher.adapters.kube.transport import CONFIGMAPS, Api
from patcher.core.kubeobj import Obj, dig


class ConfigMapView:
    """Follows ConfigMap ``namespace/name``; ``state()`` is ``(known, params)`` with params ``None`` if absent."""

    def __init__(self, api: Api, namespace: str, name: str, *, backoff: Backoff | None = None,
                 failure_level: int = logging.WARNING) -> None:
        self.namespace, self.name = namespace, name
        self._lock = threading.Lock()
        self._known = False
        self._params: Obj | None = None
        self._watcher = ListWatcher(api, CONFIGMAPS, namespace,
                                    field_selector=f"metadata.name={name}", name=f"watch ConfigMap {namespace}/{name}",
                                    on_sync=self._synced, on_event=self._event, backoff=backoff,
                                    failure_level=failure_level)

    @staticmethod
    def _slim(obj: Any) -> Obj:
        """What the rules read (``data``): the rest of the object (managedFields, ...) is not kept."""
        data = dig(obj, "data")
        return {"data": dict(data)} if isinstance(data, dict) else {}

    def _synced(self, items: list[Obj]) -> None:
        mine = [i for i in items if dig(i, "metadata", "name") == self.name]
        with self._lock:
            self._params = self._slim(mine[0]) if mine else None
            self._known = True

    def _event(self, kind: str, obj: Obj) -> None:
        if dig(obj, "metadata", "name") != self.name:
            return
        with self._lock:
            self._params = None if kind == "DELETED" else self._slim(obj)
            self._known = True

    def state(self) -> tuple[bool, Obj | None]:
        with self._lock:
            return self._known, self._params

    def start(self) -> None:
        self._watcher.start()

    def stop(self) -> None:
        self._watcher.stop()

    def wait_synced(self, timeout: float) -> bool:
        return self._watcher.wait_synced(timeout)
