"""The operator's hold on the agent's Node: ``<prefix>/hold``, followed by a watch of that one Node.

kured's lock annotation, for one node: while the Node carries it, its agent leaves the node as it is (the decision
is ``patcher.core.lifecycle``); this adapter only reads it, by a watch of that one Node (``listwatch.named``).
``on_update`` is called when the hold appears, changes or goes, and once when the first list answers (``known``:
the agent writes nothing before).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from patcher.adapters.kube.backoff import Backoff
from patcher.adapters.kube.listwatch import Following, ListWatcher, named
from patcher.adapters.kube.transport import NODES, Api
from patcher.core.kubeobj import dig
from patcher.core.status import HOLD_KEY, normalize_prefix


class NodeHoldWatcher(Following):
    def __init__(self, api: Api, node_name: str, prefix: str, *, on_update: Callable[[], None],
                 backoff: Backoff | None = None) -> None:
        self.key = normalize_prefix(prefix) + HOLD_KEY
        self._on_update = on_update
        self._lock = threading.Lock()
        self._hold: str | None = None
        self._known = False
        self._watcher = ListWatcher(
            api, NODES, **named(node_name, self._set),
            name=f"node-hold-{node_name}", backoff=backoff, failure_level=logging.WARNING)

    def hold(self) -> str | None:
        with self._lock:
            return self._hold

    def known(self) -> bool:
        with self._lock:
            return self._known

    def _set(self, node: Any) -> None:
        """The hold annotation's value (may be empty), None when the Node has none (or there is no Node)."""
        value = dig(node, "metadata", "annotations", self.key)
        hold = value if isinstance(value, str) else None
        with self._lock:
            changed, self._hold = hold != self._hold or not self._known, hold
            self._known = True
        if changed:
            self._on_update()
