"""The operator's hold on the agent's Node: ``<prefix>/hold``, followed by a watch of that one Node.

kured's lock annotation, for one node: while the Node carries it, its agent leaves the node as it is (the decision
is ``patcher.core.lifecycle``); this adapter only reads it. A list-then-watch narrowed to the Node by a
``metadata.name`` field selector (RBAC: ``nodes`` list and watch); ``on_update`` is called when the hold appears,
changes or goes, and once when the first list answers (``known``: the agent writes nothing before, see
``patcher.core.lifecycle``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from patcher.adapters.kube.backoff import Backoff
from patcher.adapters.kube.listwatch import ListWatcher
from patcher.adapters.kube.transport import NODES, Api
from patcher.core.kubeobj import dig
from patcher.core.status import HOLD_KEY, normalize_prefix


def hold_of(node: Any, key: str) -> str | None:
    """The hold annotation's value on ``node`` (may be empty), None when it has none."""
    value = dig(node, "metadata", "annotations", key) if isinstance(node, dict) else None
    return value if isinstance(value, str) else None


class NodeHoldWatcher:
    def __init__(self, api: Api, node_name: str, prefix: str, *, on_update: Callable[[], None],
                 backoff: Backoff | None = None) -> None:
        self.key = normalize_prefix(prefix) + HOLD_KEY
        self._node_name = node_name
        self._on_update = on_update
        self._lock = threading.Lock()
        self._hold: str | None = None
        self._known = False
        self._watcher = ListWatcher(
            api, NODES, field_selector=f"metadata.name={node_name}", on_sync=self._sync, on_event=self._event,
            name=f"node-hold-{node_name}", backoff=backoff, failure_level=logging.WARNING)

    def start(self) -> None:
        self._watcher.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._watcher.stop(timeout)

    def wait_synced(self, timeout: float) -> bool:
        return self._watcher.wait_synced(timeout)

    def hold(self) -> str | None:
        with self._lock:
            return self._hold

    def known(self) -> bool:
        with self._lock:
            return self._known

    def _set(self, hold: str | None) -> None:
        with self._lock:
            changed, self._hold = hold != self._hold or not self._known, hold
            self._known = True
        if changed:
            self._on_update()

    def _sync(self, items: list[Any]) -> None:
        self._set(next((hold_of(i, self.key) for i in items if dig(i, "metadata", "name") == self._node_name), None))

    def _event(self, kind: str, obj: Any) -> None:
        if dig(obj, "metadata", "name") == self._node_name:
            self._set(None if kind == "DELETED" else hold_of(obj, self.key))
