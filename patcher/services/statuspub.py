"""The agents' copy of the cluster verdict: ConfigMaps for readers that cannot run our code.

Every agent republishes after each of its own state changes, after a change of a kube-scheduler pod its
``SchedulerIndex`` sees (and at a slow pace otherwise), from its own thread: the verdict reads every
control-plane Node and scheduler pod, which must never delay the agent loop. The index (a metadata-only watch
of the mirror pods' namespace, reduced to the few unlabelled scheduler candidates) keeps a verdict's reads to
the control plane's size, not kube-system's.
``publish_status`` re-reads the ConfigMap before writing and retries on conflicts, so several agents writing
at once always leave the newest verdict behind.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from patcher.adapters.kube.backoff import Backoff
from patcher.adapters.kube.cluster import collect, publish_status
from patcher.adapters.kube.errors import ApiError
from patcher.adapters.kube.schedindex import SchedulerIndex

if TYPE_CHECKING:  # the API is reached through patcher.adapters.kube; the client here is a type only
    from patcher.adapters.kube.transport import Api

log = logging.getLogger("patcher.services.statuspub")


@dataclass(frozen=True)
class StatusTarget:
    namespace: str  # the agent's namespace: scheduler-patcher-status lives there
    prefix: str
    static_pod_name: str
    mirror_namespace: str
    compat_csi_baremetal: bool  # the defaults are the Status settings' (patcher.core.settings)
    compat_namespace: str | None


class StatusPublisher:
    def __init__(self, api: Api, target: StatusTarget, *, backoff: Backoff | None = None,
                 refresh: float = 300.0, index: bool = True) -> None:
        self.api = api
        self.target = target
        self.backoff = backoff or Backoff(1.0, 60.0)
        self.refresh = refresh
        self._kick = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-publisher", daemon=True)
        self.index = SchedulerIndex(api, target.mirror_namespace, target.static_pod_name, on_change=self.kick,
                                    backoff=Backoff(1.0, 60.0)) if index else None

    def start(self) -> None:
        # Publish once at start, not only after a phase change: an agent whose first write is held back (the
        # extender down, its turn not come) starts and stays Pending, and until a verdict is published the
        # admission policy gates nothing (its ConfigMap missing).
        self._kick.set()
        if self.index is not None:
            self.index.start()
        self._thread.start()

    def kick(self) -> None:
        """Something changed here: publish soon."""
        self._kick.set()

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()
        if self.index is not None:
            self.index.stop()
        self._thread.join(3)

    def publish_once(self) -> None:
        t = self.target
        publish_status(
            self.api,
            lambda: collect(self.api, prefix=t.prefix, static_pod_name=t.static_pod_name,
                            mirror_namespace=t.mirror_namespace, index=self.index),
            namespace=t.namespace, compat_csi_baremetal=t.compat_csi_baremetal, compat_namespace=t.compat_namespace)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._kick.wait(self.refresh)
            if self._stop.is_set():
                return
            self._kick.clear()
            if self._stop.wait(1.0):  # let the node reporter deliver the annotation this verdict reads
                return
            if self.index is not None:  # the first verdict: from the index, not a list of its own beside it
                self.index.wait_fresh(10.0)
            try:
                self.publish_once()
                self.backoff.reset()
            except ApiError as exc:
                delay = self.backoff.next_delay()
                log.info("cannot publish the status ConfigMap (%s); again in %.1fs", exc, delay)
                if not self._stop.wait(delay):
                    self._kick.set()
