"""What the agent publishes in the cluster, in the background so the API being down never blocks the agent loop:
its Node's state (``NodeReporter``: annotations and events) and the cluster verdict (``StatusPublisher``:
ConfigMaps for readers that cannot run our code). The vocabulary is pure, in ``patcher.core.status``.

``NodeReporter.publish()`` only records the desired state; a worker thread sends one JSON merge patch when it
differs from what was last published, then the queued transition events (kept in order, bounded: each is a
line in ``kubectl describe node``), retrying with capped backoff. A ``Conflict`` on the Node (the kubelet and
controllers write it too) is not an outage: the Node is read and patched again at once. ``Forbidden``/
``Unauthorized`` are logged as an error naming the right and, after a few ordinary retries (a restarting API
server denies until its RBAC caches synced), wait the longest delay (``backoff.DENIED_QUICK_RETRIES``).

``StatusPublisher``: every agent republishes the verdict after its own state changes and after a change its
``SchedulerIndex`` sees (and slowly otherwise), from its own thread; ``publish_status`` re-reads the ConfigMap
before writing, so several agents always leave the newest verdict behind.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from patcher.adapters.kube.backoff import Backoff
from patcher.adapters.kube.cluster import collect, publish_status
from patcher.adapters.kube.errors import ApiError, Conflict, Denied, api_json
from patcher.adapters.kube.listwatch import run_hook
from patcher.adapters.kube.schedindex import SchedulerIndex
from patcher.adapters.kube.transport import EVENTS, MERGE_PATCH, NODES, Api
from patcher.core.status import (
    DEFAULT_PREFIX,
    MAX_EVENT_MESSAGE,
    NODE_EVENT_NAMESPACE,
    EventSpec,
    NodeState,
    NodeStatus,
    desired_annotations,
    event_body,
    merge_patch,
    normalize_prefix,
    transition_event,
)

log = logging.getLogger(__name__)

#: An event rejected with one of these will never be accepted; it is dropped instead of blocking the queue.
_PERMANENT_EVENT_ERRORS = frozenset({400, 403, 404, 415, 422})
#: Events queued while the API does not take them (each a line in ``kubectl describe node``): the oldest go first.
MAX_PENDING_EVENTS = 64
#: Patches of the Node refused with 409 in a row before the reporter backs off like for any failure.
MAX_CONFLICTS = 3


class NodeReporter:
    """Keeps the Node's annotations and events in line with the agent's state, without ever blocking it.

    Thread-safe. ``on_error(kind, exc)`` is called (from the worker thread) for each failed request, with
    ``kind`` ``"annotations"`` or ``"event"``, so the agent can count errors by kind.
    """

    def __init__(
        self,
        api: Api,
        node_name: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        backoff: Backoff | None = None,
        on_error: Callable[[str, BaseException], None] | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._api = api
        self._node = node_name
        self._prefix = normalize_prefix(prefix)
        self._backoff = backoff if backoff is not None else Backoff()
        self._on_error = on_error
        self._clock_ns = clock_ns

        self._cond = threading.Condition()
        self._desired: dict[str, str | None] | None = None
        self._published: dict[str, str | None] | None = None
        self._last_state: NodeState | None = None
        self._events: collections.deque[EventSpec] = collections.deque(maxlen=MAX_PENDING_EVENTS)
        self._node_uid: str | None = None
        self._retry_at = 0.0
        self._last_failure: tuple[str, type[ApiError]] | None = None  # what was logged last in this series
        self._stopping = False
        self._busy = False
        self._thread: threading.Thread | None = None

    # -- caller side -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the background publisher (idempotent)."""
        with self._cond:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name=f"node-reporter-{self._node}", daemon=True)
            self._thread.start()

    def publish(self, status: NodeStatus, *, reason: str | None = None, message: str | None = None) -> None:
        """Make ``status`` the desired state; returns at once. A state change also queues an Event, whose
        defaults ``reason``/``message`` override (``SchedulerAdopted``: a restarted agent found it Ready)."""
        annotations = desired_annotations(status, self._prefix)
        with self._cond:
            self._desired = annotations
            if status.state != self._last_state:
                if len(self._events) == self._events.maxlen:
                    log.warning("node %s: too many undelivered events; dropping the oldest", self._node)
                self._events.append(transition_event(status, self._clock_ns(), reason=reason, message=message))
                self._last_state = status.state
            self._cond.notify_all()

    def note(self, reason: str, message: str, *, warning: bool = False) -> None:
        """An Event that is not a state transition (e.g. a config skipped because it failed elsewhere)."""
        spec = EventSpec(reason=reason, message=message[:MAX_EVENT_MESSAGE], type="Warning" if warning else "Normal",
                         at_ns=self._clock_ns())
        with self._cond:
            self._events.append(spec)
            self._cond.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait until everything desired so far is delivered, the backoff restarted so several attempts fit a
        shutdown's grace period; ``False`` at the deadline (delivery goes on until ``close()``)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._backoff.reset(denials=False)  # a flush is no answer: a persisting denial still waits longest
            self._retry_at = 0.0
            self._cond.notify_all()
            while self._busy or self._events or self._desired != self._published:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._thread is None or self._stopping:
                    return False
                self._cond.wait(remaining)
            return True

    def close(self, timeout: float = 2.0) -> None:
        """Stop the worker (pending work is abandoned; call ``flush`` first to deliver it)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def __enter__(self) -> NodeReporter:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- worker side -------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._stopping:
                        return
                    if not self._events and self._desired == self._published:
                        self._cond.wait()
                        continue
                    delay = self._retry_at - time.monotonic()
                    if delay <= 0:
                        break
                    self._cond.wait(delay)
                desired = self._desired if self._desired != self._published else None  # None: nothing to patch
                self._busy = True
            ok = denied = False
            try:
                if desired is not None:
                    self._send_annotations(desired)
                self._send_events()
                ok = True
            except ApiError as exc:  # already logged and counted by _failed
                denied = isinstance(exc, Denied)
            except Exception:  # a bug here must not silently end publishing for the agent's lifetime
                log.exception("node %s: unexpected error while publishing; retrying with backoff", self._node)
            finally:
                with self._cond:
                    self._busy = False
                    if ok:
                        if self._backoff.failures:
                            log.info("node %s: API reachable again, state delivered", self._node)
                        self._backoff.reset()
                        self._last_failure = None
                        self._retry_at = 0.0
                    else:
                        self._retry_at = time.monotonic() + self._backoff.next_delay(denied=denied)
                    self._cond.notify_all()

    def _send_annotations(self, annotations: dict[str, str | None]) -> None:
        """Patch the Node until it carries ``annotations``; raises ``ApiError`` (logged) when it cannot."""
        what = f"patch the annotations of node {self._node}"
        try:
            for _ in range(MAX_CONFLICTS):
                try:
                    node = api_json(what, self._api.patch, NODES, self._node, merge_patch(annotations),
                                    content_type=MERGE_PATCH)
                except Conflict as exc:
                    # The Node changed under the server's own retries (busy Nodes do): not an outage. Read it;
                    # the patch may have landed before its answer was lost, else send it again at once.
                    log.debug("node %s: %s; reading the Node again", self._node, exc.detail)
                    node = api_json(f"read node {self._node}", self._api.get, NODES, self._node)
                    if not _carries(node, annotations):
                        continue
                uid = node.get("metadata", {}).get("uid") if isinstance(node, dict) else None
                with self._cond:
                    self._published = annotations
                    if isinstance(uid, str) and uid:
                        self._node_uid = uid
                log.debug("node %s: annotations published: %s", self._node, annotations)
                return
            raise Conflict(what, f"the Node kept changing ({MAX_CONFLICTS} conflicts in a row)", 409)
        except ApiError as exc:
            self._failed("annotations", exc)
            raise

    def _send_events(self) -> None:
        """Send the queued events in order; raises ``ApiError`` (logged) on one worth retrying."""
        while True:
            with self._cond:
                if not self._events:
                    return
                spec = self._events[0]
                uid = self._node_uid
            body = event_body(spec, node_name=self._node, node_uid=uid)
            try:
                api_json(f"create event {spec.reason} about node {self._node}",
                         self._api.create, EVENTS, body, namespace=NODE_EVENT_NAMESPACE)
            except Conflict:  # the name is derived from the time: an earlier attempt was stored
                log.debug("node %s: event %s was already delivered", self._node, spec.reason)
            except ApiError as exc:
                self._failed("event", exc)
                if exc.status not in _PERMANENT_EVENT_ERRORS:
                    raise
                log.error("node %s: event %s rejected for good (%s); dropped", self._node, spec.reason, exc.detail)
            else:
                log.debug("node %s: event %s sent", self._node, spec.reason)
            with self._cond:
                if self._events and self._events[0] is spec:
                    self._events.popleft()

    def _failed(self, kind: str, exc: ApiError) -> None:
        """Log a failure once per series and kind of failure (then at DEBUG), and count it through the hook."""
        seen = (kind, type(exc))
        level = logging.DEBUG if self._last_failure == seen else logging.WARNING
        self._last_failure = seen
        if isinstance(exc, Denied):
            log.log(logging.ERROR if level == logging.WARNING else level,
                    "node %s: cannot publish %s (%s): not allowed, check the agent's token and RBAC rights",
                    self._node, kind, exc.detail)
        else:
            log.log(level, "node %s: cannot publish %s (%s); retrying with backoff", self._node, kind, exc.detail)
        run_hook(log, self._on_error, "error", kind, exc)  # a metrics hook must never kill the publisher


def _carries(node: object, annotations: dict[str, str | None]) -> bool:
    """Whether ``node`` (raw JSON) has ``annotations`` as the merge patch would leave them (``None``: absent)."""
    if not isinstance(node, dict):
        return False
    current = (node.get("metadata") or {}).get("annotations") or {}
    return isinstance(current, dict) and all(current.get(k) == v for k, v in annotations.items())


@dataclass(frozen=True)
class StatusTarget:
    namespace: str  # the agent's namespace: scheduler-patcher-status lives there
    prefix: str
    static_pod_name: str
    mirror_namespace: str
    compat_csi_baremetal: bool  # the defaults are the Status settings' (patcher.core.settings)
    compat_namespace: str | None


class StatusPublisher:
    def __init__(self, api: Api, target: StatusTarget) -> None:
        self.api = api
        self.target = target
        self.backoff = Backoff(1.0, 60.0)
        self._kick = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-publisher", daemon=True)
        self.index = SchedulerIndex(api, target.mirror_namespace, target.static_pod_name, on_change=self.kick,
                                    backoff=Backoff(1.0, 60.0))

    def start(self) -> None:
        # Publish once at start, not only after a phase change: an agent whose first write is held back (the
        # extender down, its turn not come) starts and stays Pending, and until a verdict is published the
        # admission policy gates nothing (its ConfigMap missing).
        self._kick.set()
        self.index.start()
        self._thread.start()

    def kick(self) -> None:
        """Something changed here: publish soon."""
        self._kick.set()

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()
        self.index.stop()
        self._thread.join(3)

    def _run(self) -> None:
        t = self.target
        while not self._stop.is_set():
            self._kick.wait(300.0)  # unkicked, a slow refresh
            if self._stop.is_set():
                return
            self._kick.clear()
            if self._stop.wait(1.0):  # let the node reporter deliver the annotation this verdict reads
                return
            self.index.wait_fresh(10.0)  # the first verdict: from the index, not a list of its own beside it
            try:
                publish_status(
                    self.api,
                    lambda: collect(self.api, prefix=t.prefix, static_pod_name=t.static_pod_name,
                                    mirror_namespace=t.mirror_namespace, index=self.index),
                    namespace=t.namespace, compat_csi_baremetal=t.compat_csi_baremetal,
                    compat_namespace=t.compat_namespace)
                self.backoff.reset()
            except ApiError as exc:
                delay = self.backoff.next_delay()
                log.info("cannot publish the status ConfigMap (%s); again in %.1fs", exc, delay)
                if not self._stop.wait(delay):
                    self._kick.set()
