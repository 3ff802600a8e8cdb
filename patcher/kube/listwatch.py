"""List a collection, then follow it with a watch: the informer pattern in small, shared by every watcher.

The API server is expected to drop streams, time them out, compact old versions (410 Gone) and be away for
minutes while control-plane pods restart; this loop turns all of that into "the latest full state, then
every change", with capped backoff and no lost events (it resumes from the newest resourceVersion seen).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import urllib3
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from patcher.kube.backoff import Backoff
from patcher.kube.client import describe_error

log = logging.getLogger(__name__)

Obj = dict[str, Any]
_API_ERRORS = (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError)


def dig(obj: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


class _Gone(Exception):
    """The resourceVersion we hold was compacted away: list again."""


#: Consecutive failed watch attempts after which the watcher lists again instead of resuming.
_RELIST_AFTER_FAILURES = 5


class ListWatcher:
    """List a collection, then follow it with a watch; calls ``on_sync(items)`` and ``on_event(type, obj)``.

    The informer pattern in small, for the readiness wait (Nodes) and the gatekeeper (Nodes and Pods): a list
    gives the whole state and a resourceVersion, the watch resumes from the newest version seen after a stream
    ends or breaks (with capped backoff), and a ``410 Gone`` or repeated failures mean "list again" — after
    which ``on_sync`` delivers the full state again, so a consumer never depends on having seen every event.
    Callbacks run on the watcher's thread. Objects are plain dicts (the client's models are not used).
    """

    def __init__(
        self,
        list_fn: Callable[..., Any],
        *args: Any,
        on_sync: Callable[[list[Obj]], None],
        on_event: Callable[[str, Obj], None],
        label_selector: str | None = None,
        field_selector: str | None = None,
        name: str = "list-watch",
        backoff: Backoff | None = None,
        watch_timeout_s: int = 240,
        connect_timeout_s: float = 5.0,
        failure_level: int = logging.INFO,
    ) -> None:
        self._list_fn = list_fn
        self._args = args
        self._selectors: dict[str, str] = {}
        if label_selector:
            self._selectors["label_selector"] = label_selector
        if field_selector:
            self._selectors["field_selector"] = field_selector
        self._on_sync = on_sync
        self._on_event = on_event
        self.name = name
        self._backoff = backoff if backoff is not None else Backoff()
        self._watch_timeout = watch_timeout_s
        self._connect_timeout = connect_timeout_s
        self._failure_level = failure_level
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._lock = threading.Lock()
        self._watch: k8s_watch.Watch | None = None
        self._thread: threading.Thread | None = None
        self._resume_rv: str | None = None

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop; an open stream is shut down so this returns promptly."""
        self._stop.set()
        with self._lock:
            if self._watch is not None:
                self._watch.stop()  # type: ignore[no-untyped-call]
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def wait_synced(self, timeout: float) -> bool:
        """Wait for the first successful list."""
        return self._synced.wait(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._resume_rv is None:
                    self._resume_rv = self._list()
                started = time.monotonic()
                events = self._stream(self._resume_rv)
                if events > 0 or time.monotonic() - started >= 1.0:
                    self._backoff.reset()
                    continue
                delay = self._backoff.next_delay()
            except _Gone:
                log.debug("%s: resourceVersion expired; listing again", self.name)
                self._resume_rv = None
                delay = self._backoff.next_delay()
            except (*_API_ERRORS, KeyError, TypeError) as exc:
                if self._stop.is_set():
                    break
                delay = self._backoff.next_delay()
                if self._backoff.failures >= _RELIST_AFTER_FAILURES:
                    self._resume_rv = None
                # The first failure of a series at ``failure_level`` (INFO by default: an unreachable API is
                # normal during a control-plane restart, and the readiness command reports errors itself).
                log.log(self._failure_level if self._backoff.failures == 1 else logging.DEBUG,
                        "%s failed (%s); retrying in %.2fs", self.name, describe_error(exc), delay)
            except Exception:  # a bug in a callback must not end the watch for the process's lifetime
                log.exception("%s: unexpected error", self.name)
                delay = self._backoff.next_delay()
            self._stop.wait(delay)

    def _list(self) -> str:
        resp: Any = self._list_fn(*self._args, _preload_content=False, **self._selectors)
        body = json.loads(resp.data)
        items = [i for i in body.get("items") or [] if isinstance(i, dict)]
        rv = dig(body, "metadata", "resourceVersion")
        if not isinstance(rv, str) or not rv:
            raise ValueError(f"{self.name}: list without metadata.resourceVersion")
        self._on_sync(items)
        self._synced.set()
        return rv

    def _raw(self, *args: Any, **kwargs: Any) -> Any:
        return self._list_fn(*args, **kwargs)  # no return type to read: ``Watch`` hands out plain dicts

    def _stream(self, rv: str) -> int:
        w = k8s_watch.Watch()  # type: ignore[no-untyped-call]
        with self._lock:
            if self._stop.is_set():
                return 0
            self._watch = w
        events = 0
        try:
            for event in w.stream(  # type: ignore[no-untyped-call]
                self._raw, *self._args, resource_version=rv, allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout,
                _request_timeout=(self._connect_timeout, float(self._watch_timeout + 30)), **self._selectors,
            ):
                kind, obj = event.get("type"), event.get("object")
                if kind == "ERROR":
                    if dig(obj, "code") == 410:
                        raise _Gone()
                    raise ValueError(f"watch error event: {obj}")
                new_rv = dig(obj, "metadata", "resourceVersion")
                if isinstance(new_rv, str) and new_rv:
                    self._resume_rv = new_rv
                events += 1
                if kind in ("ADDED", "MODIFIED", "DELETED") and isinstance(obj, dict):
                    self._on_event(kind, obj)
                if self._stop.is_set():
                    break
        except ApiException as exc:
            if exc.status == 410:
                raise _Gone() from exc
            raise
        finally:
            with self._lock:
                self._watch = None
        return events
