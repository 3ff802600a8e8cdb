"""List a collection, then follow it with a watch: the informer pattern in small, shared by every watcher.

The API server drops streams, compacts old versions (410 Gone) and is away while control-plane pods restart;
this loop turns that into "the latest full state, then every change", with capped backoff, resuming from the
newest resourceVersion seen. A stream that ends right after it started counts as a failure (a proxy that
closes every watch costs a request per backoff period, not a busy loop); undecodable data means events may be
lost, so the collection is listed again. ``Forbidden``/``Unauthorized`` back off like any failure for a few
tries (a restarting API server denies until its RBAC caches synced), then wait the longest delay
(``backoff.DENIED_QUICK_RETRIES``). A consumer's exception is a bug, logged with its traceback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from patcher.adapters.kube.backoff import Backoff
from patcher.adapters.kube.errors import ApiError, Denied, api_call, api_json, error_class
from patcher.adapters.kube.transport import METADATA_LIST, METADATA_WATCH, Api, Resource
from patcher.core.kubeobj import dig

log = logging.getLogger(__name__)

Obj = dict[str, Any]


class _Undecodable(Exception):
    """The watch sent data that is not a watch event: the stream cannot be trusted, list again."""


#: Consecutive failed watch attempts after which the watcher lists again instead of resuming.
_RELIST_AFTER_FAILURES = 5


def decode_event(line: bytes) -> tuple[str, Obj] | None:
    """One line of a watch stream as ``(type, object)``; ``None`` for a keep-alive blank line.

    Raises ``_Undecodable`` for anything else: not UTF-8 JSON, not an object, no string ``type``, or an
    ``object`` that is not a JSON object.
    """
    if not line.strip():
        return None
    try:
        event = json.loads(line)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise _Undecodable(f"not JSON ({exc})") from None
    if not isinstance(event, dict):
        raise _Undecodable(f"a JSON {type(event).__name__}, not an event")
    kind, obj = event.get("type"), event.get("object")
    if not isinstance(kind, str) or not isinstance(obj, dict):
        raise _Undecodable("an event without a type or an object")
    return kind, obj


def split_records(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Newline-delimited records from a chunked body (a record may span chunks; a trailing one, from a stream
    that broke off mid-record, is kept: its decode fails, and the collection is listed again)."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        yield from lines
    if buffer:
        yield buffer


class ListWatcher:
    """List ``resource`` in ``namespace`` (None: cluster-scoped or all), then watch it; calls ``on_sync(items)``
    after each list and ``on_event(type, obj)`` for each change, on the watcher's thread.

    A consumer never depends on having seen every event: after a relist ``on_sync`` delivers the full state
    again. Objects are plain dicts, or what ``transform`` makes of each one as it arrives; with ``page_size``
    the list comes in pages (one snapshot), so a page is the most ever held at once. ``metadata_only`` asks for
    ``PartialObjectMetadata``, what a cache of a large namespace needs when it looks for a few objects in it.

    ``fresh`` is true while the view follows the server (listed, and a watch from it open or being resumed);
    any failure turns it false until a watch is open again. ``drops`` counts the times it turned false, so a
    consumer can tell whether events may have been missed since.
    """

    def __init__(
        self,
        api: Api,
        resource: Resource,
        namespace: str | None = None,
        *,
        on_sync: Callable[[list[Any]], None],
        on_event: Callable[[str, Any], None],
        label_selector: str | None = None,
        field_selector: str | None = None,
        name: str = "list-watch",
        backoff: Backoff | None = None,
        watch_timeout_s: int = 240,
        failure_level: int = logging.INFO,
        min_healthy_s: float = 1.0,
        page_size: int | None = None,
        transform: Callable[[Obj], Any] | None = None,
        metadata_only: bool = False,
    ) -> None:
        self._api = api
        self._accept = {"list": METADATA_LIST, "watch": METADATA_WATCH} if metadata_only else {}
        self._resource = resource
        self._namespace = namespace
        self._page_size = page_size
        self._transform = transform
        self._selectors: dict[str, str | None] = {"label_selector": label_selector or None,
                                                  "field_selector": field_selector or None}
        self._on_sync = on_sync
        self._on_event = on_event
        self.name = name
        self._backoff = backoff if backoff is not None else Backoff()
        self._watch_timeout = watch_timeout_s
        self._failure_level = failure_level
        self._min_healthy = min_healthy_s
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._lock = threading.Lock()
        self._resp: Any = None
        self._thread: threading.Thread | None = None
        self._resume_rv: str | None = None
        self._fresh = False
        self._undecodable_logged = False
        self.drops = 0  # how many times the view stopped following the server (see the class docstring)

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop; an open stream is shut down so this returns promptly."""
        self._stop.set()
        with self._lock:
            resp = self._resp
            thread = self._thread
        if resp is not None:
            _shutdown(resp)
        if thread is not None:
            thread.join(timeout)

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    @property
    def fresh(self) -> bool:
        """Whether the view follows the server right now (see the class docstring)."""
        with self._lock:
            return self._fresh

    def _set_fresh(self, fresh: bool) -> None:
        with self._lock:
            if self._fresh and not fresh:
                self.drops += 1
            self._fresh = fresh

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._resume_rv is None:
                    self._resume_rv = self._list()
                started = time.monotonic()
                self._stream(self._resume_rv)
                if self._stop.is_set():
                    break
                if time.monotonic() - started >= self._min_healthy:
                    self._backoff.reset()  # a stream that lived: the server's own timeout, resume at once
                    self._undecodable_logged = False
                    continue
                # Ended as soon as it began, events or not: a proxy or a sick server. Back off like a failure.
                delay = self._backoff.next_delay()
                log.log(self._failure_level if self._backoff.failures == 1 else logging.DEBUG,
                        "%s: the watch ended at once; resuming in %.2fs", self.name, delay)
            except _Undecodable as exc:
                self._resume_rv = None  # events lost in what could not be read
                delay = self._backoff.next_delay()
                if not self._undecodable_logged:
                    self._undecodable_logged = True
                    log.warning("%s: undecodable watch data (%s); listing again (logged once until the "
                                "watch is healthy again)", self.name, exc)
                else:
                    log.debug("%s: undecodable watch data again (%s)", self.name, exc)
            except ApiError as exc:
                if self._stop.is_set():
                    break
                delay = self._backoff.next_delay(denied=isinstance(exc, Denied))
                # 410 Gone (an answer or an ERROR event): the version we hold, or a list's continue token, was
                # compacted away
                if exc.status == 410 or self._backoff.failures >= _RELIST_AFTER_FAILURES:
                    self._resume_rv = None
                if exc.status == 410:
                    log.debug("%s: resourceVersion expired; listing again", self.name)
                else:
                    # The first failure of a series at ``failure_level`` (INFO by default: an unreachable API is
                    # normal during a control-plane restart, and the readiness command reports errors itself).
                    log.log(self._failure_level if self._backoff.failures == 1 else logging.DEBUG,
                            "%s failed (%s); retrying in %.2fs", self.name, exc.detail, delay)
            except Exception:  # a bug in a callback must not end the watch for the process's lifetime
                if self._stop.is_set():
                    break
                log.exception("%s: unexpected error", self.name)
                delay = self._backoff.next_delay()
            self._set_fresh(False)  # every way here is a failure: a stream that lived went on at once
            self._stop.wait(delay)
        self._set_fresh(False)

    def _list(self) -> str:
        what = f"list for {self.name}"
        items: list[Any] = []
        first_rv: str | None = None
        for body in pages(what, self._api.list, self._resource, self._page_size, namespace=self._namespace,
                          accept=self._accept.get("list"), **self._selectors):
            rv = dig(body, "metadata", "resourceVersion")
            if not isinstance(rv, str) or not rv:
                raise ApiError(what, "the answer has no metadata.resourceVersion")
            first_rv = first_rv or rv  # every page is served from the first page's snapshot
            page = [i for i in body.get("items") or [] if isinstance(i, dict)]
            items.extend(page if self._transform is None else (self._transform(i) for i in page))
            del body, page  # a page is the most held at once
        assert first_rv is not None
        self._on_sync(items)
        self._synced.set()
        return first_rv

    def _stream(self, rv: str) -> None:
        """Follow one watch request from ``rv`` until it ends; raises on errors."""
        what = f"watch for {self.name}"
        with api_call(what):
            resp: Any = self._api.watch(
                self._resource, namespace=self._namespace, resource_version=rv,
                timeout_seconds=self._watch_timeout, connect_timeout=5.0,
                accept=self._accept.get("watch"), **self._selectors,
            )
        with self._lock:
            self._resp = resp
        if self._stop.is_set():
            _shutdown(resp)
        try:
            self._set_fresh(True)  # listed, and the server accepted a watch from that version
            for line in split_records(_chunks(resp, what)):
                decoded = decode_event(line)
                if decoded is None:
                    continue
                kind, obj = decoded
                if kind == "ERROR":
                    code = dig(obj, "code")
                    status = code if isinstance(code, int) else None
                    kind_of = ApiError if status is None else error_class(status)
                    raise kind_of(what, f"watch error event: {dig(obj, 'message') or obj}", status)
                new_rv = dig(obj, "metadata", "resourceVersion")
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._on_event(kind, obj if self._transform is None else self._transform(obj))
                if isinstance(new_rv, str) and new_rv:
                    self._resume_rv = new_rv  # after delivery: a failed callback sees the event again
                if self._stop.is_set():
                    break
        finally:
            with self._lock:
                self._resp = None
            with contextlib.suppress(Exception):
                resp.release_conn()


class Following:
    """The life of a view kept by a ``ListWatcher`` (``_watcher``): what every watching adapter says of it."""

    _watcher: ListWatcher

    def start(self) -> None:
        self._watcher.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop; an open stream is shut down so this returns promptly."""
        self._watcher.stop(timeout)

    def wait_synced(self, timeout: float) -> bool:
        """Wait for the first successful list (the view then reflects the server)."""
        return self._watcher.wait_synced(timeout)

    @property
    def fresh(self) -> bool:
        """Whether the view follows the server right now (``ListWatcher.fresh``)."""
        return self._watcher.fresh


class NamedListWatcher(Following):
    """One object followed by name (``named``) on a watch called ``label``: ``state()`` is ``(listed,
    keep(object))``, ``None`` while it does not exist; ``changed`` is set on every delivery, ``on_change()`` is
    called when the state changed (the first list's included)."""

    def __init__(self, api: Api, resource: Resource, namespace: str | None, name: str, *, label: str,
                 keep: Callable[[Obj], Any] = lambda obj: obj, on_change: Callable[[], None] | None = None,
                 **options: Any) -> None:
        self.changed = threading.Event()
        self._lock = threading.Lock()
        self._state: tuple[bool, Any] = (False, None)
        self._keep = keep
        self._on_change = on_change
        self._watcher = ListWatcher(api, resource, namespace, **named(name, self._deliver), name=label, **options)

    def _deliver(self, obj: Obj | None) -> None:
        state = (True, None if obj is None else self._keep(obj))
        with self._lock:
            changed, self._state = state != self._state, state
        self.changed.set()
        if changed and self._on_change is not None:
            self._on_change()

    def state(self) -> tuple[bool, Any]:
        with self._lock:
            return self._state


def pages(what: str, verb: Callable[..., Any], resource: Resource, limit: int | None,
          **kwargs: Any) -> Iterator[Obj]:
    """Each page of a list (``verb``: an ``Api.list``; ``limit`` None: one whole list), failures translated."""
    paging: dict[str, Any] = {"limit": limit} if limit else {}
    while True:
        body: Obj = api_json(what, verb, resource, **kwargs, **paging)
        token = dig(body, "metadata", "continue")
        yield body
        del body  # a page is the most held at once
        if not (limit and isinstance(token, str) and token):
            return
        paging["continue_"] = token


def named(name: str, deliver: Callable[[Obj | None], None]) -> dict[str, Any]:
    """The ``ListWatcher`` arguments that follow one object by name (a ``metadata.name`` field selector, which
    RBAC can authorize by ``resourceNames``): ``deliver`` gets the object after each list and change, ``None``
    while it does not exist."""
    def ours(obj: Any) -> bool:
        return isinstance(obj, dict) and dig(obj, "metadata", "name") == name

    def on_event(kind: str, obj: Any) -> None:
        if ours(obj):
            deliver(None if kind == "DELETED" else obj)

    return {"field_selector": f"metadata.name={name}", "on_event": on_event,
            "on_sync": lambda items: deliver(next((i for i in items if ours(i)), None))}


def run_hook(logger: logging.Logger, hook: Callable[..., None] | None, what: str, *args: Any) -> None:
    """``hook(*args)`` (none: nothing); its failure is logged on ``logger`` as ``<what> hook failed``, never
    raised: a consumer's bug must not stop the thread that calls it (a watch, the Node reporter)."""
    if hook is not None:
        try:
            hook(*args)
        except Exception:
            logger.exception("%s hook failed", what)


def _chunks(resp: Any, what: str) -> Iterator[bytes]:
    """The body of a watch response as it arrives; a broken stream leaves as ``ApiError`` (``Unreachable``)."""
    chunks = resp.stream(amt=None, decode_content=True)
    while True:
        with api_call(what):  # only around the read: what the consumer does with a chunk is not translated
            chunk = next(chunks, None)
        if chunk is None:
            return
        yield chunk


def _shutdown(resp: Any) -> None:
    """Unblock a thread reading ``resp`` (a urllib3 response), then close it."""
    with contextlib.suppress(Exception):
        resp.shutdown()  # urllib3 >= 2.3: shuts the socket down under the reader, TLS included
    with contextlib.suppress(Exception):
        sock = getattr(getattr(resp, "connection", None), "sock", None)
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
