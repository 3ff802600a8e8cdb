"""Which kube-scheduler leads, and what the other control-plane nodes say: the view of the leader-aware order.

kube-scheduler's leader election holds the Lease ``kube-system/kube-scheduler`` with ``holderIdentity``
``<hostname>_<uuid>`` (``os.Hostname()`` of the scheduler; a static pod on the host network: the node's
hostname). Three watches, never a poll, keep ``view()`` current, and the agent's loop reads it without waiting:
that one Lease by name (``listwatch.named``: RBAC grants list/watch on that name only), the control-plane Nodes
(the agents' ``state``/``source-hash`` annotations, and ``kubernetes.io/hostname``, which maps the holder to its
Node) and the kube-scheduler pods (their Ready condition). ``on_change`` is called when the view changes, not on
each renewal of the Lease. The order itself is ``patcher.core.lifecycle.order_wait``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from patcher.adapters.kube.backoff import Backoff
from patcher.adapters.kube.listwatch import ListWatcher, named
from patcher.adapters.kube.transport import LEASES, NODES, PODS, Api
from patcher.core.kubeobj import dig, ready
from patcher.core.lifecycle import Peer, Schedulers
from patcher.core.readiness import DEFAULT_MIRROR_SELECTOR, DEFAULT_NODE_SELECTOR
from patcher.core.status import normalize_prefix

NAMESPACE, LEASE = "kube-system", "kube-scheduler"
HOSTNAME_LABEL = "kubernetes.io/hostname"


def holder_host(identity: Any) -> str:
    """The hostname in a leader election's ``<hostname>_<uuid>`` ("" for none; a hostname has no ``_``)."""
    return identity.rpartition("_")[0].lower() if isinstance(identity, str) and "_" in identity else ""


class SchedulerLeader:
    def __init__(self, api: Api, node_name: str, prefix: str, *, on_change: Callable[[], None],
                 retry: tuple[float, float] | None = None) -> None:
        self.node_name, self._on_change = node_name, on_change
        key = normalize_prefix(prefix)
        self._lock = threading.Lock()
        self._host = ""
        self._nodes: dict[str, tuple[str, str, str]] = {}  # name -> (hostname label, state, source-hash)
        self._pods: dict[str, tuple[str, bool]] = {}  # pod name -> (its node, Ready)
        self._last = Schedulers()
        self._listed: set[str] = set()  # the watches that listed once: the view is known when all three did

        def node(obj: Any) -> tuple[str, str, str]:
            ann = dig(obj, "metadata", "annotations") or {}
            return (str(dig(obj, "metadata", "labels", HOSTNAME_LABEL) or "").lower(),
                    str(ann.get(key + "state") or ""), str(ann.get(key + "source-hash") or ""))

        def pod(obj: Any) -> tuple[str, bool]:
            return str(dig(obj, "spec", "nodeName") or ""), ready(obj)

        def opts() -> dict[str, Any]:
            return {"backoff": Backoff(*retry) if retry else None, "failure_level": logging.WARNING}

        self._watchers = [
            ListWatcher(api, LEASES, NAMESPACE, **self._listing("Lease kube-system/kube-scheduler",
                                                                named(LEASE, self._lease)), **opts()),
            ListWatcher(api, NODES, label_selector=DEFAULT_NODE_SELECTOR,
                        **self._listing("control-plane Nodes", self._keyed(self._nodes, node)), **opts()),
            ListWatcher(api, PODS, NAMESPACE, label_selector=DEFAULT_MIRROR_SELECTOR,
                        **self._listing("kube-scheduler pods", self._keyed(self._pods, pod)), **opts())]

    def _listing(self, what: str, callbacks: dict[str, Any]) -> dict[str, Any]:
        """``callbacks`` and a name for the watch of ``what``; its first list counts towards a known view."""
        sync = callbacks["on_sync"]

        def on_sync(items: list[Any]) -> None:
            with self._lock:
                self._listed.add(what)
            sync(items)

        return {**callbacks, "on_sync": on_sync, "name": f"watch {what}"}

    def _keyed(self, store: dict[str, Any], fact: Callable[[Any], Any]) -> dict[str, Any]:
        """``ListWatcher`` callbacks that keep ``store`` as name -> ``fact(object)`` for a whole collection."""
        def on_sync(items: list[Any]) -> None:
            facts = {str(dig(i, "metadata", "name")): fact(i) for i in items}

            def replace_all() -> None:
                store.clear()
                store.update(facts)
            self._update(replace_all)

        def on_event(kind: str, obj: Any) -> None:
            name = str(dig(obj, "metadata", "name"))
            self._update(lambda: store.pop(name, None) if kind == "DELETED" else store.update({name: fact(obj)}))

        return {"on_sync": on_sync, "on_event": on_event}

    def _lease(self, obj: Any) -> None:
        self._update(lambda: setattr(self, "_host", holder_host(dig(obj, "spec", "holderIdentity"))))

    def _update(self, change: Callable[[], Any]) -> None:
        with self._lock:
            change()
        view = self.view()
        with self._lock:
            changed, self._last = view != self._last, view
        if changed:
            self._on_change()

    def view(self) -> Schedulers:
        """The snapshot (never waits); unknown until every watch has listed once."""
        with self._lock:
            if len(self._listed) < len(self._watchers):
                return Schedulers()
            host, nodes, pods = self._host, dict(self._nodes), list(self._pods.values())
        leader = next((n for n, (label, *_) in sorted(nodes.items()) if host and host in (n.lower(), label)),
                      self.node_name if host and host == self.node_name.lower() else "")
        ready = {n for n, ok in pods if ok}
        peers = tuple(Peer(n, state, source, n in ready) for n, (_, state, source) in sorted(nodes.items())
                      if n != self.node_name)
        return Schedulers(True, leader, leader == self.node_name, peers)

    def start(self) -> None:
        for w in self._watchers:
            w.start()

    def stop(self, timeout: float = 2.0) -> None:
        for w in self._watchers:
            w.stop(timeout)
