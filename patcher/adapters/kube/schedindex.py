"""The names of the kube-scheduler pods a label cannot find, kept by a metadata-only watch of their namespace.

The readiness verdict counts a Node-owned mirror pod ``kube-scheduler-<node>`` without kubeadm's
``component=kube-scheduler`` label. Neither the node nor such a pod can be selected on the server, and listing
kube-system whole costs a pod per node per node agent (20 000 pods, 100+ MB a verdict on a large cluster).
Here the namespace is listed once and watched, metadata only, each pod reduced as it arrives to whether it may
be such a scheduler (``core.readiness.may_be_unlabelled_scheduler``); a verdict reads the few kept names by
name (``cluster.collect``). ``on_change`` says when a candidate or a labelled scheduler came, went or changed.
RBAC: ``list`` and ``watch`` on pods in the namespace, what the mirror-pod watch has already.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final

from patcher.adapters.kube.backoff import Backoff
from patcher.adapters.kube.listwatch import Following, ListWatcher, run_hook
from patcher.adapters.kube.transport import PODS, Api
from patcher.core.kubeobj import Obj
from patcher.core.readiness import may_be_unlabelled_scheduler

log = logging.getLogger(__name__)

#: Pods a page of a kube-system list (here and ``cluster``'s): it holds a pod per node for every node agent (CNI,
#: kube-proxy), thousands on a large cluster; pages keep each answer bounded (here metadata only: ~1-4 KB a pod,
#: its managed fields most of it).
PAGE: Final = 500

#: What a pod is reduced to: its name, whether it may be an unlabelled scheduler, and whether it may be any
#: scheduler the verdict counts (a candidate, or a pod with the scheduler's labels): its changes wake ``on_change``.
Reduced = tuple[str, bool, bool]
#: kubeadm's label of the kube-scheduler static pod, the verdict's labelled list.
SCHEDULER_LABELS: Final = {"component": "kube-scheduler"}


class SchedulerIndex(Following):
    """The candidate names (``candidates()``), followed by a metadata-only list and watch of ``namespace``."""

    def __init__(self, api: Api, namespace: str = "kube-system", static_pod_name: str = "kube-scheduler", *,
                 on_change: Callable[[], None] | None = None, backoff: Backoff | None = None,
                 failure_level: int = logging.INFO) -> None:
        self.static_pod_name = static_pod_name
        self._on_change = on_change
        self._lock = threading.Lock()
        self._names: set[str] = set()
        self._schedulers: set[str] = set()
        self._watcher = ListWatcher(
            api, PODS, namespace, on_sync=self._synced, on_event=self._event, name=f"scheduler index ({namespace})",
            backoff=backoff, failure_level=failure_level, page_size=PAGE, transform=self._reduce, metadata_only=True)

    def wait_fresh(self, timeout: float) -> bool:
        """Wait until the view follows the server (listed, and the watch from that list open)."""
        deadline = time.monotonic() + timeout
        if not self._watcher.wait_synced(timeout):
            return False
        while not self._watcher.fresh:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    @property
    def drops(self) -> int:
        """How many times the view stopped following the server (``ListWatcher.drops``)."""
        return self._watcher.drops

    def candidates(self) -> list[str] | None:
        """The candidate pods' names, sorted; ``None`` unless the view follows the server right now (listed and
        watching): then the caller lists the namespace itself, a stale view could miss a scheduler."""
        if not self._watcher.fresh:
            return None
        with self._lock:
            return sorted(self._names)

    def _reduce(self, obj: Obj) -> Reduced:
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        meta = meta if isinstance(meta, dict) else {}
        candidate = may_be_unlabelled_scheduler(meta, self.static_pod_name)
        labels = meta.get("labels")
        labelled = isinstance(labels, dict) and all(labels.get(k) == v for k, v in SCHEDULER_LABELS.items())
        return str(meta.get("name") or ""), candidate, candidate or labelled

    def _synced(self, items: list[Reduced]) -> None:
        names = {name for name, candidate, _ in items if candidate}
        schedulers = {name for name, _, scheduler in items if scheduler}
        with self._lock:
            changed = names != self._names or schedulers != self._schedulers
            self._names, self._schedulers = names, schedulers
        if changed:
            run_hook(log, self._on_change, "scheduler index change")

    def _event(self, kind: str, item: Reduced) -> None:
        name, candidate, scheduler = item
        with self._lock:
            known = name in self._schedulers
            if candidate and kind != "DELETED":
                self._names.add(name)
            else:
                self._names.discard(name)
            if scheduler and kind != "DELETED":
                self._schedulers.add(name)
            else:
                self._schedulers.discard(name)
        if known or scheduler:  # a scheduler came, went, or changed (its status, its owner, its labels)
            run_hook(log, self._on_change, "scheduler index change")

