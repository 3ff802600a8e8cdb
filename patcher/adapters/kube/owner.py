"""The DaemonSet that owns the agent's pod, watched: does it still want a pod on this node?

``--restore-on-exit=auto`` keeps the patch on SIGTERM when a successor pod will come and restores it when the
agent leaves the node for good (the DaemonSet deleted, being deleted, or no longer selecting this node). Its
own thread reads the agent's pod, follows its DaemonSet ownerReference, reads this Node, then watches that one
DaemonSet (``listwatch.named``); each change goes to the agent's queue.

At the stop, ``confirm`` reads the DaemonSet and the Node once more with a short deadline (an uninstall may race
the watch; a Node label has no watch here); when nothing answers in time the watch's view stands. A 401/403
there, after the watch worked, is an uninstall (it deletes the ServiceAccount and Role with the DaemonSet).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from patcher.adapters.kube.backoff import Backoff
from patcher.adapters.kube.errors import ApiError, Denied, NotFound, api_json
from patcher.adapters.kube.listwatch import ListWatcher, named, run_hook
from patcher.adapters.kube.transport import DAEMONSETS, NODES, PODS, Api
from patcher.core import placement
from patcher.core.kubeobj import Obj, dig
from patcher.core.lifecycle import DaemonSetView

log = logging.getLogger(__name__)

#: Seconds for a read of the agent's pod or its Node while the watch starts.
READ_TIMEOUT = 5.0


def owner_daemonset(pod: Any) -> str | None:
    """The name of the DaemonSet among the pod's ownerReferences (the controller one first), or None."""
    refs = [r for r in dig(pod, "metadata", "ownerReferences") or [] if isinstance(r, dict)]
    refs.sort(key=lambda r: not r.get("controller"))
    for ref in refs:
        if ref.get("kind") == "DaemonSet" and str(ref.get("apiVersion", "")).startswith("apps/") and ref.get("name"):
            return str(ref["name"])
    return None


def _per_attempt(timeout: float) -> float:
    """The timeout of one attempt, for a call that must end within ``timeout``: the client retries a timed-out
    GET once (``kube.client``: ``retries = 1``), so each attempt gets half."""
    return max(0.01, timeout / 2)


class OwnerWatcher:
    """Keeps what the agent knows of its DaemonSet; ``view`` and ``confirm`` never raise."""

    def __init__(self, api: Api, namespace: str, pod_name: str, node_name: str, *,
                 on_update: Callable[[], None] | None = None, backoff: Backoff | None = None,
                 watch_timeout_s: int = 240) -> None:
        self.namespace, self.pod_name, self.node_name = namespace, pod_name, node_name
        self._api = api
        self._on_update = on_update
        self._backoff = backoff if backoff is not None else Backoff(1.0, 30.0)
        self._watch_timeout = watch_timeout_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._name: str | None = None  # the DaemonSet, once the pod was read
        self._daemonset: Obj | None = None
        self._known = False  # the API answered about the DaemonSet (a 404 included)
        self._node: Obj | None = None
        self._detail = "the agent's pod was not read yet"
        self._revoked = ""  # a 401/403 at the stop: the agent's access went with an uninstall
        self._watcher: ListWatcher | None = None
        self._thread = threading.Thread(target=self._run, name="daemonset-owner", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        with self._lock:
            watcher = self._watcher
        if watcher is not None:
            watcher.stop(timeout)

    # -- what the agent reads ------------------------------------------------------------------------------

    def view(self) -> DaemonSetView:
        with self._lock:
            name, ds, known, node, detail = self._name, self._daemonset, self._known, self._node, self._detail
            revoked = self._revoked
        if name is None:
            return DaemonSetView(detail=detail)
        if revoked:
            return DaemonSetView(known=True, name=name, detail=revoked)
        if not known:
            return DaemonSetView(name=name, detail=f"no answer about DaemonSet {name} yet")
        if ds is None:
            return DaemonSetView(known=True, name=name)
        deleting = bool(dig(ds, "metadata", "deletionTimestamp"))
        if node is None:
            return DaemonSetView(name=name, exists=True, deleting=deleting,
                                 detail=f"Node {self.node_name} was not read yet")
        fits, why = placement.selects(ds, node)
        return DaemonSetView(known=True, exists=True, deleting=deleting, selects=fits, name=name, detail=why)

    def confirm(self, timeout: float) -> DaemonSetView:
        """Read the DaemonSet and the Node once more, both within ``timeout`` seconds; then ``view()``."""
        end = time.monotonic() + timeout
        with self._lock:
            name = self._name
        if name is not None:
            try:
                self._set_daemonset(self._read_daemonset(name, end - time.monotonic()))
            except Denied as exc:
                with self._lock:
                    if self._known:  # it could read the DaemonSet before: the access went with the uninstall
                        self._revoked = f"the agent may no longer read it: {exc.detail}"
            except ApiError as exc:
                log.info("no fresh answer about DaemonSet %s at the stop (%s); using the watch's view", name,
                         exc.detail)
            else:
                self._read_node(max(0.01, end - time.monotonic()))
        return self.view()

    # -- the thread ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        name = self._find_owner()
        if name is None:
            return
        self._read_node(READ_TIMEOUT)
        watcher = ListWatcher(
            self._api, DAEMONSETS, self.namespace, **named(name, self._set_daemonset), name=f"daemonset-{name}",
            backoff=self._backoff.fresh(), watch_timeout_s=self._watch_timeout, failure_level=logging.WARNING)
        with self._lock:
            if self._stop.is_set():
                return
            self._watcher = watcher
        watcher.start()

    def _find_owner(self) -> str | None:
        """Read the agent's pod until its owner is known (retried with backoff); None: stopped, or no owner."""
        what = f"read pod {self.namespace}/{self.pod_name}"
        while not self._stop.is_set():
            try:
                pod = api_json(what, self._api.get, PODS, self.pod_name, namespace=self.namespace,
                               timeout=(READ_TIMEOUT, READ_TIMEOUT))
            except ApiError as exc:
                with self._lock:
                    self._detail = f"cannot {what}: {exc.detail}"
                delay = self._backoff.next_delay()
                log.log(logging.WARNING if self._backoff.failures == 1 else logging.DEBUG,
                        "cannot %s (%s); retrying in %.2fs", what, exc.detail, delay)
                self._stop.wait(delay)
                continue
            name = owner_daemonset(pod)
            with self._lock:
                self._name = name
                self._detail = "" if name else f"pod {self.namespace}/{self.pod_name} has no DaemonSet owner"
            log.info("the agent's pod belongs to %s", f"DaemonSet {name}" if name else "no DaemonSet")
            return name
        return None

    def _read_daemonset(self, name: str, timeout: float) -> Obj | None:
        try:
            body = api_json(f"read DaemonSet {self.namespace}/{name}", self._api.get, DAEMONSETS, name,
                            namespace=self.namespace, timeout=_per_attempt(timeout))
        except NotFound:
            return None
        return body if isinstance(body, dict) else None

    def _read_node(self, timeout: float) -> None:
        try:
            node = api_json(f"read node {self.node_name}", self._api.get, NODES, self.node_name,
                            timeout=_per_attempt(timeout))
        except ApiError as exc:
            log.info("%s", exc)
            return
        if isinstance(node, dict):
            with self._lock:
                self._node = node
            run_hook(log, self._on_update, "DaemonSet update")

    def _set_daemonset(self, ds: Obj | None) -> None:
        with self._lock:
            self._daemonset, self._known = ds, True
            node_unknown = self._node is None
        if node_unknown and ds is not None:  # the read at start failed: the DaemonSet answers, so may the Node
            self._read_node(READ_TIMEOUT)
        run_hook(log, self._on_update, "DaemonSet update")
