"""The operator's hold on the agent's Node: ``<prefix>/hold``, followed by a watch of that one Node.

kured's lock annotation, for one node: while the Node carries it, its agent leaves the node as it is (the decision
is ``patcher.core.lifecycle``); this adapter only reads it, by a watch of that one Node (``listwatch.named``).
``on_update`` is called when the hold appears, changes or goes, and once when the first list answers (``known``:
the agent writes nothing before).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

from patcher.adapters.kube.backoff import Backoff
from patcher.adapters.kube.listwatch import NamedListWatcher
from patcher.adapters.kube.transport import NODES, Api
from patcher.core.kubeobj import dig
from patcher.core.status import HOLD_KEY, normalize_prefix


class NodeHoldWatcher(NamedListWatcher):
    def __init__(self, api: Api, node_name: str, prefix: str, *, on_update: Callable[[], None],
                 backoff: Backoff | None = None) -> None:
        self.key = normalize_prefix(prefix) + HOLD_KEY
        super().__init__(api, NODES, None, node_name, label=f"node-hold-{node_name}", keep=self._hold_of,
                         on_change=on_update, backoff=backoff, failure_level=logging.WARNING)

    def hold(self) -> str | None:
        """The hold annotation's value (may be empty), None when the Node has none (or there is no Node)."""
        return cast("str | None", self.state()[1])

    def known(self) -> bool:
        return self.state()[0]

    def _hold_of(self, node: Any) -> str | None:
        value = dig(node, "metadata", "annotations", self.key)
        return value if isinstance(value, str) else None
