"""Watch one mirror pod (``<static pod name>-<node name>``) and keep its latest state at hand.

The kubelet publishes a static pod's status through its mirror pod; the agent reads the scheduler's restart
from it. Only that one pod is read, through a ``metadata.name`` field selector, so the agent needs no right to
list a namespace's pods and the API server sends it nothing else. The loop is list-then-watch: a list gives the
current pod and a resourceVersion, the watch resumes from the newest version seen after a dropped stream or an
error (with capped backoff), and a ``410 Gone`` (version compacted away) means list again.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from patcher.kube.backoff import Backoff
from patcher.kube.client import describe_error

log = logging.getLogger(__name__)

Pod = dict[str, Any]
UpdateHook = Callable[[Pod | None], None]
#: Consecutive failed watch attempts after which the watcher lists again instead of resuming.
_RELIST_AFTER_FAILURES = 5
_ERRORS = (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError, KeyError, TypeError)


def mirror_pod_name(static_pod_name: str, node_name: str) -> str:
    """The kubelet names a static pod's mirror ``<metadata.name>-<node name>``."""
    return f"{static_pod_name}-{node_name}"


class PodHolder:
    """The latest mirror pod seen (``None``: absent or unknown), with a version to wait for changes."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pod: Pod | None = None
        self._version = 0

    def set(self, pod: Pod | None) -> None:
        """Replace the pod and wake every waiter."""
        with self._cond:
            self._pod = pod
            self._version += 1
            self._cond.notify_all()

    def get(self) -> Pod | None:
        """The latest pod (the same dict the watcher stored: treat it as read-only)."""
        with self._cond:
            return self._pod

    @property
    def version(self) -> int:
        """Increases by one on every ``set``."""
        with self._cond:
            return self._version

    def wait_newer(self, version: int, timeout: float) -> tuple[int, Pod | None]:
        """Block until the version exceeds ``version`` or ``timeout`` passes; return (version, pod)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._version <= version:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return self._version, self._pod


class _Gone(Exception):
    """The resourceVersion we hold is too old: list again."""


def _resource_version(obj: Any) -> str | None:
    if isinstance(obj, dict):
        rv = obj.get("metadata", {}).get("resourceVersion")
        return rv if isinstance(rv, str) and rv else None
    return None


class MirrorPodWatcher:
    """A background thread that keeps ``holder`` (and ``on_update``) fed with one pod's latest state."""

    def __init__(
        self,
        api: k8s.ApiClient,
        namespace: str,
        pod_name: str,
        *,
        on_update: UpdateHook | None = None,
        holder: PodHolder | None = None,
        backoff: Backoff | None = None,
        watch_timeout_s: int = 240,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self._core = k8s.CoreV1Api(api)
        self.namespace = namespace
        self.pod_name = pod_name
        self.holder = holder if holder is not None else PodHolder()
        self._on_update = on_update
        self._backoff = backoff if backoff is not None else Backoff()
        self._watch_timeout = watch_timeout_s
        self._connect_timeout = connect_timeout_s
        self._selector = f"metadata.name={pod_name}"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._watch: k8s_watch.Watch | None = None
        self._thread: threading.Thread | None = None
        #: The resourceVersion to resume the watch from; ``None`` means "list first".
        self._resume_rv: str | None = None
        self._opened_at: float | None = None
        self._events_seen = 0
        self._synced = threading.Event()

    def start(self) -> None:
        """Start watching (idempotent)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"mirror-pod-{self.pod_name}", daemon=True)
                self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the watch; an open stream is shut down so this returns promptly."""
        self._stop.set()
        with self._lock:
            if self._watch is not None:
                self._watch.stop()  # type: ignore[no-untyped-call]
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def __enter__(self) -> MirrorPodWatcher:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def latest(self) -> Pod | None:
        """The latest pod seen, ``None`` when it does not exist or has not been read yet."""
        return self.holder.get()

    def wait_synced(self, timeout: float) -> bool:
        """Wait for the first successful list (the holder then reflects the server, even when ``None``)."""
        return self._synced.wait(timeout)

    # -- loop --------------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._opened_at = None
            self._events_seen = 0
            problem: str | None = None
            try:
                if self._resume_rv is None:
                    self._resume_rv = self._list()
                self._stream(self._resume_rv)
            except _Gone:
                log.info("watch of pod %s/%s: resourceVersion %s expired; listing again",
                         self.namespace, self.pod_name, self._resume_rv)
                self._resume_rv = None
                problem = "410 Gone"
            except _ERRORS as exc:
                problem = describe_error(exc)
            except Exception:  # never let a bug end the watch for the agent's lifetime
                log.exception("watch of pod %s/%s: unexpected error", self.namespace, self.pod_name)
                problem = "unexpected error"
            if self._stop.is_set():
                break
            # A stream that delivered events, or stayed open for a while, proves the API works: whatever
            # ended it (the server's timeout, a proxy cutting idle streams), reconnect without backing off.
            opened = self._opened_at
            if self._events_seen or (opened is not None and time.monotonic() - opened >= 1.0):
                self._backoff.reset()
                if problem is None:
                    continue
            delay = self._backoff.next_delay()
            if self._backoff.failures >= _RELIST_AFTER_FAILURES:
                self._resume_rv = None  # whatever keeps failing, a fresh list is the way out
            log.log(logging.WARNING if self._backoff.failures == 1 and problem else logging.DEBUG,
                    "watch of pod %s/%s ended (%s); again in %.2fs",
                    self.namespace, self.pod_name, problem or "at once, without events", delay)
            self._stop.wait(delay)

    def _list(self) -> str:
        resp: Any = self._core.list_namespaced_pod(  # the raw urllib3 response, given _preload_content
            self.namespace, field_selector=self._selector, _preload_content=False
        )
        body = json.loads(resp.data)
        items = [p for p in body.get("items") or [] if p.get("metadata", {}).get("name") == self.pod_name]
        pod = items[0] if items else None
        self._deliver(pod)
        self._synced.set()
        rv = _resource_version(body)
        if rv is None:
            raise ValueError("pod list without metadata.resourceVersion")
        return rv

    def _stream(self, rv: str) -> None:
        """Follow one watch request from ``rv`` until it ends (counting events in ``_events_seen``).

        Every event's resourceVersion is kept in ``_resume_rv`` as it arrives, so a stream that breaks
        half-way resumes after the last event it delivered rather than replaying it.
        """
        w = k8s_watch.Watch()  # type: ignore[no-untyped-call]
        with self._lock:
            if self._stop.is_set():
                return
            self._watch = w
        try:
            for event in w.stream(  # type: ignore[no-untyped-call]
                self._list_pods_raw,
                self.namespace,
                field_selector=self._selector,
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout,
                _request_timeout=(self._connect_timeout, float(self._watch_timeout + 30)),
            ):
                kind, obj = event.get("type"), event.get("object")
                if kind == "ERROR":  # the client raises for these itself; kept in case a version does not
                    if isinstance(obj, dict) and obj.get("code") == 410:
                        raise _Gone()
                    raise ValueError(f"watch error event: {obj}")
                new_rv = _resource_version(obj)
                if new_rv is not None:
                    self._resume_rv = new_rv
                self._events_seen += 1
                ours = isinstance(obj, dict) and obj.get("metadata", {}).get("name") == self.pod_name
                if ours and kind in ("ADDED", "MODIFIED"):
                    self._deliver(obj)
                elif ours and kind == "DELETED":
                    self._deliver(None)
                if self._stop.is_set():
                    break
        except ApiException as exc:
            if exc.status == 410:
                raise _Gone() from exc
            raise
        finally:
            with self._lock:
                self._watch = None

    def _list_pods_raw(self, *args: Any, **kwargs: Any) -> Any:
        """``list_namespaced_pod`` without its type information, so ``Watch`` hands out plain dicts.

        ``Watch`` picks the model to deserialize into from the function's annotations and docstring; this
        wrapper has neither. (Its ``deserialize=False`` switch is no way out: with it the client fails on
        ``ERROR`` events, the very ones that carry 410 Gone, with a ``KeyError``.)
        """
        resp = self._core.list_namespaced_pod(*args, **kwargs)
        self._opened_at = time.monotonic()  # the server accepted the watch
        return resp

    def _deliver(self, pod: Pod | None) -> None:
        current = self.holder.get()
        if pod is not None and current is not None and _resource_version(pod) == _resource_version(current):
            return
        if pod is None and current is None and self.holder.version > 0:
            return
        self.holder.set(pod)
        if self._on_update is not None:
            try:
                self._on_update(pod)
            except Exception:
                log.exception("mirror pod update hook failed")
