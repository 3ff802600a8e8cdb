"""A local Kubernetes API emulator for tests: real HTTP(S), JSON bodies, watch streams, fault injection.

Why not a mock: the agent's API code must be exercised through the official client, over a socket, with the
content types, query strings and streaming framing the real API server uses. This server stores objects in
memory and implements the generic REST verbs for a few resources:

* ``GET`` one object, ``GET`` a list (``fieldSelector``/``labelSelector`` with ``=``, ``==``, ``!=``, label
  existence; pods accept only the field labels kube-apiserver serves for pods, anything else is a 400 as
  there; ``limit``/``continue`` pages, all served from the first page's snapshot as etcd does; a continue
  token after ``compact()`` answers 410), ``GET ?watch=true`` (chunked newline-delimited JSON events,
  ``resourceVersion`` resume, synthetic ``ADDED`` events without one, ``410 Gone`` as an ``ERROR`` event
  for a compacted version, ``timeoutSeconds``, ``BOOKMARK`` events when ``allowWatchBookmarks`` and
  ``bookmark_interval`` are set;
  an object that stops/starts matching the selector is sent as ``DELETED``/``ADDED``, like the real server);
* ``POST`` (create; ``generateName``; 409 when the name exists; 400 when the body's namespace differs; a
  pod's status replaced by ``Pending``, and an empty ``spec.schedulingGates`` stored absent, as the real server
  does: tests/real/test_real_parity.py);
* ``PUT`` (replace; 409 on a stale ``metadata.resourceVersion``);
* ``PATCH`` with ``application/merge-patch+json`` (RFC 7386) or ``application/json-patch+json`` (RFC 6902,
  including ``test``, which reads a missing member as null; a failed test answers 422). Strategic merge and
  apply patches answer **415**: the emulator cannot do them, and a test that needs them should fail loudly
  rather than get a merge;
* ``DELETE``, with ``propagationPolicy: Foreground`` as the API server and its garbage collector do it (the
  owner marked with the ``foregroundDeletion`` finalizer, its pods deleted gracefully and kept until a test
  ends them as their kubelet would, the owner removed once none blocks it); ``GET /version``.

Resources: core ``nodes``, ``namespaces``, ``pods``, ``events``, ``configmaps``; ``coordination.k8s.io``
``leases``; ``events.k8s.io`` ``events`` (stored apart from core events, unlike the real server). More can be
registered with ``KubeEmulator(resources=...)``.

Fault injection: ``go_down("refuse")`` closes the listening socket and every open connection (clients get
"connection refused"), ``go_down("503")`` answers every request with 503, ``come_up()`` restores service on
the same port; ``drop_watches()`` aborts open watch streams mid-stream (no terminating chunk); ``compact()``
forgets history so a resume from a ``resourceVersion`` older than the current one gets 410;
``watch_close_after = n`` ends every new watch stream cleanly after n events (0: at once) and
``watch_garbage = b"..."`` starts every new watch stream with that undecodable line. ``latency = s`` delays
every answer but watch streams by ``s`` seconds (a remote API server; each connection is served by its own
thread, so concurrent requests overlap their delays as they would on the wire); ``peak_in_flight`` is the
most requests served at once (the latency included), i.e. how many a client really sent in parallel.

TLS: ``KubeEmulator(tls=True)`` serves HTTPS with a throw-away CA and server certificate (SAN 127.0.0.1 and
localhost) made by the ``openssl`` command line tool (``tls_available()`` says whether it is installed; the
``cryptography`` package is not a dependency). ``write_kubeconfig()`` writes a kubeconfig that trusts that CA,
and ``incluster_files()`` writes the service-account token and CA files plus the environment the client's
in-cluster loader reads. Every request is recorded (``requests``) for exact assertions.
"""

from __future__ import annotations

import contextlib
import copy
import email.utils
import http.client
import json
import queue
import secrets
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

Obj = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


@dataclass(frozen=True)
class Resource:
    """One REST resource the emulator serves."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


DEFAULT_RESOURCES: tuple[Resource, ...] = (
    Resource("", "v1", "nodes", "Node", False),
    Resource("", "v1", "namespaces", "Namespace", False),
    Resource("", "v1", "pods", "Pod", True),
    Resource("", "v1", "podtemplates", "PodTemplate", True),
    Resource("", "v1", "events", "Event", True),
    Resource("", "v1", "configmaps", "ConfigMap", True),
    Resource("coordination.k8s.io", "v1", "leases", "Lease", True),
    Resource("apps", "v1", "daemonsets", "DaemonSet", True),
    Resource("events.k8s.io", "v1", "events", "Event", True),
)


class ApiError(Exception):
    """Becomes a ``Status`` response."""

    REASONS = {400: "BadRequest", 401: "Unauthorized", 404: "NotFound", 405: "MethodNotAllowed",
               409: "Conflict", 410: "Expired", 415: "UnsupportedMediaType", 422: "Invalid",
               429: "TooManyRequests", 503: "ServiceUnavailable"}

    def __init__(self, code: int, message: str, reason: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or self.REASONS.get(code, "Unknown")
        self.headers = dict(headers or {})

    def status(self) -> Obj:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it (header names lower-case; ``query`` keeps the last value)."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    status: int

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


# --- selectors ----------------------------------------------------------------------------------------

#: The field labels kube-apiserver accepts in a pod field selector (``pkg/apis/core/v1/conversion.go``); any
#: other is answered 400 "field label not supported". Other kinds accept any label here.
POD_FIELD_LABELS = frozenset({
    "metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
    "spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIP", "status.podIPs",
    "status.nominatedNodeName"})


def _field_value(obj: Obj, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    if cur is None:
        return ""
    return str(cur).lower() if isinstance(cur, bool) else str(cur)


@dataclass(frozen=True)
class Selector:
    """A parsed field or label selector (equality-based forms only)."""

    terms: tuple[tuple[str, str, str], ...] = ()
    labels: bool = False

    @classmethod
    def parse(cls, text: str | None, *, labels: bool = False) -> Selector:
        if not text:
            return cls(labels=labels)
        if "(" in text:
            raise ApiError(400, f"set-based selectors are not supported by the emulator: {text}")
        terms = []
        for raw in text.split(","):
            term = raw.strip()
            if not term:
                continue
            for op in ("!=", "==", "="):
                if op in term:
                    key, value = term.split(op, 1)
                    terms.append((key.strip(), "!=" if op == "!=" else "=", value.strip()))
                    break
            else:
                if not labels:
                    raise ApiError(400, f"invalid field selector term: {term}")
                terms.append((term.lstrip("!"), "!exists" if term.startswith("!") else "exists", ""))
        return cls(tuple(terms), labels)

    def matches(self, obj: Obj) -> bool:
        for key, op, value in self.terms:
            if self.labels:
                labels = obj.get("metadata", {}).get("labels") or {}
                present, actual = key in labels, str(labels.get(key, ""))
            else:
                present, actual = True, _field_value(obj, key)
            if op == "exists" and not present:
                return False
            if op == "!exists" and present:
                return False
            if op == "=" and (not present or actual != value):
                return False
            if op == "!=" and present and actual == value:
                return False
        return True


def _fields(r: Resource, text: str | None) -> Selector:
    """A field selector for resource ``r``, refused (400) when the real API server would refuse it."""
    selector = Selector.parse(text)
    if r.plural == "pods" and not r.group:
        for key, _, _ in selector.terms:
            if key not in POD_FIELD_LABELS:
                raise ApiError(400, f'Unable to find "/v1, Resource=pods" that match label selector "", field '
                                    f'selector "{text}": field label not supported: {key}')
    return selector


# --- metadata-only answers (PartialObjectMetadata) ------------------------------------------------------


def _as_metadata(accept: str, want: str) -> bool:
    """Whether the ``Accept`` header asks for ``want`` (``PartialObjectMetadata``, or its ``...List`` for a
    list): its first entry the server can serve decides, as kube-apiserver's negotiation does; an entry with
    another ``as=`` (a list's form for a watch) is skipped, and 406 when none is left."""
    if not accept.strip():
        return False
    for entry in accept.split(","):
        mime, *params = (p.strip() for p in entry.split(";"))
        if mime not in ("application/json", "application/*", "*/*"):
            continue
        given = dict(p.split("=", 1) for p in params if "=" in p)
        if "as" not in given:
            return False
        if given["as"] == want and given.get("g") == "meta.k8s.io" and given.get("v") == "v1":
            return True
    raise ApiError(406, f"only the following media types are accepted: application/json, "
                        f"application/json;as={want};g=meta.k8s.io;v=v1 (asked: {accept})", "NotAcceptable")


def metadata_of(obj: Obj) -> Obj:
    """``obj`` as a ``PartialObjectMetadata``: its metadata, nothing else."""
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata") or {}}


# --- patches ------------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _get_at(doc: Any, path: str) -> Any:
    cur = doc
    for part in _pointer(path):
        if isinstance(cur, list):
            cur = cur[int(part)]
        elif isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            raise ApiError(422, f"path {path!r} not found")
    return cur


def _tested_value(doc: Any, path: str) -> Any:
    """The value a ``test`` compares: a missing member of an existing object reads as null, as in the API server's
    JSON patch (a ``test`` of null there passes; tests/real/test_real_parity.py), a missing parent fails (422)."""
    parts = _pointer(path)
    if parts:
        parent = _get_at(doc, "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts[:-1]))
        if isinstance(parent, dict) and parts[-1] not in parent:
            return None
    return _get_at(doc, path)


def _writable(doc: Any, parts: list[str]) -> tuple[Any, Any, str]:
    """(new document, parent, last key): ``doc`` with every container on the way to the parent copied (one
    level each), so the parent can be changed while ``doc`` and everything off the path stay as they were —
    a patch costs its path, not the document (a pod is kilobytes; the emulator serves thousands a second)."""
    root = copy.copy(doc)
    cur = root
    for part in parts[:-1]:
        if isinstance(cur, list):
            index = int(part)
            cur[index] = copy.copy(cur[index])
            cur = cur[index]
        elif isinstance(cur, dict) and part in cur:
            cur[part] = copy.copy(cur[part])
            cur = cur[part]
        else:
            raise ApiError(422, f"path segment {part!r} not found")
    return root, cur, parts[-1]


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test); a failed ``test`` is a 422. ``doc`` is not
    changed; the result shares what the patch did not touch with it (stored objects are never changed in
    place, so sharing is safe)."""
    if not isinstance(ops, list):
        raise ApiError(400, "a JSON patch must be a list of operations")
    try:
        for op in ops:
            name, path = op.get("op"), op.get("path", "")
            if name == "test":
                if _tested_value(doc, path) != op.get("value"):
                    raise ApiError(422, f"test operation failed at {path}")
                continue
            if name in ("move", "copy"):
                value = copy.deepcopy(_get_at(doc, op["from"]))
                if name == "move":
                    doc = json_patch(doc, [{"op": "remove", "path": op["from"]}])
                name, op = "add", {"path": path, "value": value}
            parts = _pointer(path)
            if not parts:
                if name in ("add", "replace"):
                    doc = copy.deepcopy(op["value"])
                    continue
                raise ApiError(422, "cannot remove the whole document")
            doc, parent, last = _writable(doc, parts)
            if isinstance(parent, list):
                index = len(parent) if last == "-" else int(last)
                if name == "add":
                    parent.insert(index, copy.deepcopy(op["value"]))
                elif name == "remove":
                    del parent[index]
                elif name == "replace":
                    parent[index] = copy.deepcopy(op["value"])
                else:
                    raise ApiError(422, f"unknown operation {name!r}")
            elif isinstance(parent, dict):
                if name in ("remove", "replace") and last not in parent:
                    raise ApiError(422, f"path {path!r} not found")
                if name == "remove":
                    del parent[last]
                elif name in ("add", "replace"):
                    parent[last] = copy.deepcopy(op["value"])
                else:
                    raise ApiError(422, f"unknown operation {name!r}")
            else:
                raise ApiError(422, f"cannot apply {name} at {path!r}")
    except (IndexError, ValueError, KeyError, TypeError) as exc:
        raise ApiError(422, f"JSON patch failed: {exc}") from exc
    return doc


def _omit_empty(r: Resource, obj: Obj) -> Obj:
    """``obj`` as the API server stores it where that differs from what was sent and the project relies on it: a
    pod's empty ``spec.schedulingGates`` is no field at all (``omitempty``), so the next JSON patch of the gates
    tests a missing path (tests/real/test_real_parity.py). ``obj`` itself is not changed."""
    spec = obj.get("spec")
    if r.plural == "pods" and not r.group and isinstance(spec, dict) and spec.get("schedulingGates") == []:
        return {**obj, "spec": {k: v for k, v in spec.items() if k != "schedulingGates"}}
    return obj


# --- watch plumbing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Change:
    rv: int
    resource: Resource
    namespace: str
    type: str
    old: Obj | None
    new: Obj | None


_DROP = object()


@dataclass(frozen=True)
class _Event:
    """A watch event about a stored object (sent as ``{"type": ..., "object": ...}``; its JSON text is made
    once, see ``_JsonText``). Events about anything else (``BOOKMARK``, ``ERROR``) are plain dicts."""

    type: str
    object: Obj
    #: Sent as a ``PartialObjectMetadata`` (a watch that asked for metadata only).
    metadata_only: bool = False


@dataclass(frozen=True)
class RawLine:
    """A watch-stream record sent as these bytes, not as JSON: a broken proxy or server (``watch_garbage``)."""

    data: bytes


@dataclass(eq=False)
class _Subscription:
    resource: Resource
    namespace: str | None
    fields: Selector
    labels: Selector
    queue: queue.Queue[Any] = field(default_factory=queue.Queue)
    metadata_only: bool = False

    def _matches(self, obj: Obj | None) -> bool:
        return obj is not None and self.fields.matches(obj) and self.labels.matches(obj)

    def translate(self, change: _Change) -> _Event | None:
        if change.resource != self.resource or (self.namespace and change.namespace != self.namespace):
            return None
        was, now = self._matches(change.old), self._matches(change.new)
        if change.new is None:
            return None
        if change.type == "DELETED":
            return _Event("DELETED", change.new, self.metadata_only) if was else None
        if was and now:
            return _Event(change.type, change.new, self.metadata_only)
        if now:
            return _Event("ADDED", change.new, self.metadata_only)
        if was:
            return _Event("DELETED", change.new, self.metadata_only)
        return None


# --- JSON text of stored objects ------------------------------------------------------------------------


class _JsonText:
    """The JSON text of stored objects, made once per object version.

    A write answers with the object it stored, and every watch that follows the collection is sent the same
    object: without this, releasing one pod serialised it twice (the answer and the watch event), which was
    most of the emulator's CPU per request in ``bench/gate_bench.py``. Stored objects are never
    changed in place (every write stores a new dict), so a text made once stays right; entries are keyed by
    identity and keep their object alive, so an id cannot be reused while its entry exists. Bounded: the
    oldest entries go first. Only stored objects may be given (not a dict that is changed afterwards).
    """

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._entries: dict[int, tuple[Obj, bytes]] = {}  # insertion order: the oldest first
        # json.dumps's text (same separators), without the circular-reference check: objects parsed from
        # JSON cannot hold a cycle, and the check is a tenth of the encoding.
        self._encode = json.JSONEncoder(check_circular=False).encode

    def of(self, obj: Obj) -> bytes:
        key = id(obj)
        with self._lock:
            hit = self._entries.get(key)
        if hit is not None and hit[0] is obj:
            return hit[1]
        data = self._encode(obj).encode()
        with self._lock:
            self._entries[key] = (obj, data)
            if len(self._entries) > self._size:
                del self._entries[next(iter(self._entries))]
        return data


# --- the emulator -------------------------------------------------------------------------------------


def tls_available() -> bool:
    """Whether ``KubeEmulator(tls=True)`` can make its certificates (needs the ``openssl`` tool)."""
    return shutil.which("openssl") is not None


def _make_certs(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1/localhost, valid for two days."""
    ca_key, ca_pem = folder / "ca.key", folder / "ca.pem"
    key, csr, pem, ext = folder / "server.key", folder / "server.csr", folder / "server.pem", folder / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
                   "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for cmd in (
        ["openssl", "req", "-x509", *ec, "-keyout", ca_key, "-out", ca_pem, "-days", "2", "-subj", "/CN=kubeemu-ca",
         "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ["openssl", "req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
        ["openssl", "x509", "-req", "-in", csr, "-CA", ca_pem, "-CAkey", ca_key, "-CAcreateserial",
         "-out", pem, "-days", "2", "-extfile", ext],
    ):
        subprocess.run([str(c) for c in cmd], check=True, capture_output=True, cwd=folder, timeout=30)
    return ca_pem, pem, key


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # a client with a pool of dozens of connections opens them all at once
    emu: KubeEmulator

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Failed handshakes and dropped connections are part of the tests; anything else is a bug."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


#: Request header lines and their length at most (what ``http.client.parse_headers`` allows).
_MAX_HEADERS, _MAX_LINE = 100, 65536


def _read_header_lines(rfile: Any) -> list[tuple[str, str]]:
    """The request's header fields, up to the blank line; a folded line continues the field before it.
    Raises ``http.client.LineTooLong`` or ``HTTPException`` past the limits, as ``parse_headers`` does."""
    fields: list[tuple[str, str]] = []
    while True:
        line = rfile.readline(_MAX_LINE + 1)
        if len(line) > _MAX_LINE:
            raise http.client.LineTooLong("header line")
        if line in (b"\r\n", b"\n", b""):
            return fields
        text = line.decode("iso-8859-1")
        if text[:1] in (" ", "\t") and fields:  # obsolete line folding (RFC 9112 5.2)
            name, value = fields[-1]
            fields[-1] = (name, f"{value} {text.strip()}")
            continue
        name, _, value = text.partition(":")
        fields.append((name, value.strip()))
        if len(fields) > _MAX_HEADERS:
            raise http.client.HTTPException(f"got more than {_MAX_HEADERS} headers")


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two sends: Nagle would delay each answer 40 ms
    _date: tuple[int, str] = (0, "")

    def parse_request(self) -> bool:
        """The request line and header fields, without the email parser the base class uses for the fields
        (with it, header parsing was a tenth of the emulator's CPU per request in ``bench/gate_bench.py``).
        HTTP/1.0 and 1.1 only (a client of the API speaks 1.1); anything else is a 400."""
        self.command = ""
        self.request_version = self.default_request_version  # until known: an error answer has no status line
        self.close_connection = True
        raw_line: bytes = getattr(self, "raw_requestline", b"")  # set by handle_one_request (not in the stubs)
        self.requestline = str(raw_line, "iso-8859-1").rstrip("\r\n")
        words = self.requestline.split()
        if len(words) != 3 or words[2] not in ("HTTP/1.0", "HTTP/1.1"):
            self.send_error(HTTPStatus.BAD_REQUEST, f"Bad request line ({self.requestline!r})")
            return False
        self.command, self.path, self.request_version = words
        try:
            fields = _read_header_lines(self.rfile)
        except http.client.HTTPException as err:  # LineTooLong included
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Bad header block", str(err))
            return False
        headers = http.client.HTTPMessage()
        for name, value in fields:
            headers[name] = value
        self.headers = headers
        connection = headers.get("Connection", "").lower()
        self.close_connection = connection == "close" or (self.request_version == "HTTP/1.0"
                                                          and connection != "keep-alive")
        if headers.get("Expect", "").lower() == "100-continue" and self.request_version == "HTTP/1.1":
            return self.handle_expect_100()
        return True

    def date_time_string(self, timestamp: float | None = None) -> str:
        """The ``Date`` header, formatted once a second (``formatdate`` was a twentieth of the CPU per request)."""
        if timestamp is not None:
            return email.utils.formatdate(timestamp, usegmt=True)
        now = int(time.time())
        second, text = _Handler._date
        if second != now:
            text = email.utils.formatdate(now, usegmt=True)
            _Handler._date = (now, text)
        return text

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(5)
            try:
                self.request.do_handshake()
            except (OSError, ssl.SSLError):
                self.close_connection = True
                raise
            self.request.settimeout(None)
        super().setup()
        self.server.emu._track(self.request, add=True)

    def finish(self) -> None:
        self.server.emu._track(self.request, add=False)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _handle(self, method: str) -> None:
        emu = self.server.emu
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        headers = {k.lower(): v for k, v in self.headers.items()}
        body = self.rfile.read(int(headers.get("content-length") or 0))
        watch = query.get("watch") in ("true", "1")
        if not watch:
            emu._in_flight(+1)
        try:
            if emu.latency and not watch:
                time.sleep(emu.latency)
            stream = emu._serve(method, parts.path, query, headers, body)
        except ApiError as exc:
            emu._record(RecordedRequest(method, parts.path, query, headers, body, exc.code))
            self._send(exc.code, exc.status(), exc.headers)
            return
        finally:
            if not watch:
                emu._in_flight(-1)
        code, payload = stream if isinstance(stream, tuple) else (200, None)
        emu._record(RecordedRequest(method, parts.path, query, headers, body, code))
        if isinstance(stream, tuple):
            self._send(code, payload)
        else:
            self._stream(stream)

    def _send(self, code: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        """Answer ``obj`` as JSON (``bytes``: JSON text made already, see ``_JsonText``)."""
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        # What send_response/send_header/end_headers would send, and the body, in one write (one system call
        # and one packet per answer, not two).
        lines = [f"{self.protocol_version} {code} {self.responses.get(code, ('',))[0]}",
                 f"Server: {self.version_string()}", f"Date: {self.date_time_string()}",
                 *(f"{name}: {value}" for name, value in (headers or {}).items()),
                 "Content-Type: application/json", f"Content-Length: {len(data)}", "", ""]
        try:
            self.wfile.write("\r\n".join(lines).encode("latin-1", "strict") + data)
        except OSError:
            self.close_connection = True

    def _stream(self, events: Iterator[Obj | object]) -> None:
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event in events:
                if event is _DROP:  # abort mid-stream, as a dying server or a broken proxy would
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        socket.socket.shutdown(self.request, socket.SHUT_RDWR)
                    return
                data = self.server.emu._event_text(event) + b"\n"
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True


class KubeEmulator:
    """An in-memory Kubernetes API server on 127.0.0.1. Use as a context manager or ``start()``/``stop()``.

    ``token``: when set, requests must carry ``Authorization: Bearer <token>`` (401 otherwise).
    ``history``: how many changes a watch can resume from before 410 Gone.
    """

    def __init__(
        self,
        *,
        tls: bool = False,
        token: str | None = None,
        git_version: str = "v1.31.2",
        history: int = 1000,
        bookmark_interval: float | None = None,
        resources: Iterable[Resource] = DEFAULT_RESOURCES,
    ) -> None:
        self.tls = tls
        self.token = token
        self.git_version = git_version
        self.bookmark_interval = bookmark_interval
        self._resources = {(r.group, r.version, r.plural): r for r in resources}
        self._lock = threading.RLock()
        self._objects: dict[tuple[str, str, str, str], Obj] = {}
        #: (group, plural, namespace) -> names: a list touches its own collection, not every stored object
        #: (with 10 000 pods stored, sorting everything for each list of three Nodes was most of the cost).
        self._names: dict[tuple[str, str, str], set[str]] = {}
        self._rv = 0
        self._history: deque[_Change] = deque(maxlen=history)
        self._compacted_rv = 0
        self._subs: list[_Subscription] = []
        self._requests: list[RecordedRequest] = []
        self._counts: dict[tuple[str, int], int] = {}
        self._conns: set[socket.socket] = set()
        self._outage: str | None = None
        #: End every new watch stream cleanly after this many events (0: at once, before any event), as a
        #: proxy with a short idle timeout or a sick server does; ``None``: streams last as asked.
        self.watch_close_after: int | None = None
        #: Start every new watch stream with this line (not a JSON event), then go on normally.
        self.watch_garbage: bytes | None = None
        #: Seconds every answer but a watch stream is delayed by (on the connection's own thread).
        self.latency = 0.0
        self._busy = 0
        #: The most requests (watch streams aside) that were being served at once: a client's concurrency.
        self.peak_in_flight = 0
        self._snapshots: dict[str, tuple[int, list[Obj]]] = {}
        #: Owners deleted in the foreground, by uid, until their blocking dependents are gone: (resource, ns, name).
        self._foreground: dict[str, tuple[Resource, str, str]] = {}
        self._text = _JsonText()
        self._server: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port = 0
        self._tmp = Path(tempfile.mkdtemp(prefix="kubeemu-"))
        self.ca_file: Path | None = None
        self._ssl: ssl.SSLContext | None = None
        if tls:
            self.ca_file, cert, key = _make_certs(self._tmp)
            self._ssl = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._ssl.load_cert_chain(cert, key)

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> KubeEmulator:
        with self._lock:
            if self._server is None:
                self._open()
        return self

    def stop(self) -> None:
        self._close()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> KubeEmulator:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self._port}"

    def _open(self) -> None:
        server = _HTTPServer(("127.0.0.1", self._port), _Handler)
        server.emu = self
        if self._ssl is not None:
            server.socket = self._ssl.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        self._port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="kubeemu", daemon=True)
        self._thread.start()

    def _close(self) -> None:
        with self._lock:
            server, thread = self._server, self._thread
            self._server = self._thread = None
            conns = list(self._conns)
            subs = list(self._subs)
        if server is not None:
            server.shutdown()
            server.server_close()
        for sub in subs:
            sub.queue.put(_DROP)
        for conn in conns:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(conn, socket.SHUT_RDWR)
        if thread is not None:
            thread.join(2)

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    # -- faults ----------------------------------------------------------------------------------------

    def go_down(self, mode: str = "refuse") -> None:
        """Start an outage: ``refuse`` (connections refused) or ``503`` (every request answered 503)."""
        if mode not in ("refuse", "503"):
            raise ValueError(f"unknown outage mode {mode!r}")
        with self._lock:
            self._outage = mode
        if mode == "refuse":
            self._close()
        else:
            self.drop_watches()

    def come_up(self) -> None:
        """End an outage; the server listens on the same port again."""
        with self._lock:
            mode, self._outage = self._outage, None
            if mode == "refuse" and self._server is None:
                self._open()

    @contextlib.contextmanager
    def outage(self, mode: str = "refuse") -> Iterator[None]:
        self.go_down(mode)
        try:
            yield
        finally:
            self.come_up()

    def drop_watches(self) -> None:
        """Abort every open watch stream mid-stream."""
        with self._lock:
            subs = list(self._subs)
        for sub in subs:
            sub.queue.put(_DROP)

    def compact(self) -> None:
        """Forget the change history: resuming a watch from a version older than the current one gets 410.

        That is etcd's compaction *and* kube-apiserver's watch cache losing the history, which on the real server
        takes more than a compaction: the cache keeps serving what it saw since it started, compacted in etcd or
        not, until the server restarts or the cache's window moves on (tests/real/test_real_nodes.py shows both)."""
        with self._lock:
            self._history.clear()
            self._compacted_rv = self._rv
            self._snapshots.clear()

    @property
    def open_watches(self) -> int:
        with self._lock:
            return len(self._subs)

    # -- recorded requests -----------------------------------------------------------------------------

    def _in_flight(self, delta: int) -> None:
        with self._lock:
            self._busy += delta
            self.peak_in_flight = max(self.peak_in_flight, self._busy)

    def _record(self, req: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(req)
            key = (req.method, req.status)
            self._counts[key] = self._counts.get(key, 0) + 1

    def count(self, method: str, status: int) -> int:
        """How many ``method`` requests were answered ``status`` since the last ``clear_requests`` (cheap:
        for polling, where copying every recorded request would cost more than the requests themselves)."""
        with self._lock:
            return self._counts.get((method, status), 0)

    def requests(self, method: str | None = None, path: str | None = None) -> list[RecordedRequest]:
        """Requests received so far, optionally only one method and/or path."""
        with self._lock:
            return [r for r in self._requests
                    if (method is None or r.method == method) and (path is None or r.path == path)]

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()
            self._counts.clear()

    # -- client configuration --------------------------------------------------------------------------

    def write_kubeconfig(self, path: Path, *, namespace: str = "default") -> Path:
        """A kubeconfig for this server (trusting its CA with TLS, carrying the token if one is required)."""
        cluster: Obj = {"server": self.url}
        if self.ca_file is not None:
            cluster["certificate-authority"] = str(self.ca_file)
        user: Obj = {"token": self.token} if self.token else {}
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "kubeemu",
            "clusters": [{"name": "kubeemu", "cluster": cluster}],
            "users": [{"name": "kubeemu", "user": user}],
            "contexts": [{"name": "kubeemu",
                          "context": {"cluster": "kubeemu", "user": "kubeemu", "namespace": namespace}}],
        }
        path.write_text(json.dumps(config, indent=2))
        return path

    def incluster_files(self, folder: Path) -> tuple[dict[str, str], Path, Path]:
        """(environment, token file, CA file) as a pod sees them; needs ``tls=True`` (in-cluster is HTTPS)."""
        if self.ca_file is None:
            raise RuntimeError("in-cluster configuration needs KubeEmulator(tls=True)")
        token = folder / "token"
        token.write_text(self.token or "kubeemu-token")
        ca = folder / "ca.crt"
        ca.write_bytes(self.ca_file.read_bytes())
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self._port)}
        return env, token, ca

    # -- object store (Python side) --------------------------------------------------------------------

    def _resource(self, plural: str, group: str = "") -> Resource:
        for r in self._resources.values():
            if r.plural == plural and r.group == group:
                return r
        raise KeyError(f"unknown resource {group}/{plural}")

    def _resource_of(self, obj: Obj) -> Resource:
        api_version, kind = obj.get("apiVersion", "v1"), obj.get("kind")
        group, _, version = api_version.rpartition("/")
        for r in self._resources.values():
            if r.group == group and r.version == version and r.kind == kind:
                return r
        raise KeyError(f"unknown kind {api_version} {kind}")

    def create(self, obj: Obj) -> Obj:
        """Store a new object (``apiVersion`` and ``kind`` pick the resource); returns the stored copy."""
        r = self._resource_of(obj)
        return self._create(r, obj.get("metadata", {}).get("namespace", "default") if r.namespaced else "", obj)

    def upsert(self, obj: Obj) -> Obj:
        """Create or replace (ignoring resourceVersion); returns the stored copy."""
        r = self._resource_of(obj)
        ns = obj.get("metadata", {}).get("namespace", "default") if r.namespaced else ""
        with self._lock:
            if self._get(r, ns, obj["metadata"]["name"]) is None:
                return self._create(r, ns, obj)
            body = copy.deepcopy(obj)
            body.get("metadata", {}).pop("resourceVersion", None)
            return self._replace(r, ns, obj["metadata"]["name"], body)

    def get(self, plural: str, name: str, namespace: str = "", group: str = "") -> Obj | None:
        with self._lock:
            found = self._get(self._resource(plural, group), namespace, name)
            return copy.deepcopy(found) if found is not None else None

    def list_objects(self, plural: str, namespace: str | None = None, group: str = "") -> list[Obj]:
        r = self._resource(plural, group)
        with self._lock:
            return [copy.deepcopy(o) for o in self._scan(r, namespace or "")
                    if namespace is None or o.get("metadata", {}).get("namespace", "") == namespace]

    def mutate(self, plural: str, name: str, fn: Callable[[Obj], Obj | None], namespace: str = "",
               group: str = "") -> Obj:
        """Apply ``fn`` to a copy of the object (it may edit in place or return a new one) and store it."""
        r = self._resource(plural, group)
        with self._lock:
            current = self._get(r, namespace, name)
            if current is None:
                raise KeyError(f"{plural} {namespace}/{name} not found")
            draft = copy.deepcopy(current)
            result = fn(draft)
            body = result if result is not None else draft
            body.setdefault("metadata", {}).pop("resourceVersion", None)
            return self._replace(r, namespace, name, body)

    def delete(self, plural: str, name: str, namespace: str = "", group: str = "",
               options: Obj | None = None) -> Obj:
        """``options``: the ``DeleteOptions`` a request would carry (``propagationPolicy: Foreground``). Deleting a
        pod the garbage collector marked (``deletionTimestamp``) is its kubelet confirming the end."""
        with self._lock:
            return self._delete(self._resource(plural, group), namespace, name, options)

    # conveniences for the node agent's tests

    def add_node(self, name: str, *, labels: dict[str, str] | None = None,
                 annotations: dict[str, str] | None = None) -> Obj:
        return self.create({"apiVersion": "v1", "kind": "Node",
                            "metadata": {"name": name, "labels": dict(labels or {}),
                                         "annotations": dict(annotations or {})}})

    def node_annotations(self, name: str) -> dict[str, str]:
        node = self.get("nodes", name)
        return dict((node or {}).get("metadata", {}).get("annotations") or {})

    def set_pod(self, pod: Obj) -> Obj:
        """Create or replace a pod (what a kubelet does with a mirror pod)."""
        return self.upsert(pod)

    def events(self, namespace: str | None = None) -> list[Obj]:
        """Core v1 events, oldest first."""
        return self.list_objects("events", namespace)

    # -- object store (internals; the lock is held) ----------------------------------------------------

    def _key(self, r: Resource, ns: str, name: str) -> tuple[str, str, str, str]:
        return (r.group, r.plural, ns if r.namespaced else "", name)

    def _scan(self, r: Resource, ns: str) -> list[Obj]:
        """The objects of ``r`` in namespace ``ns`` (every namespace for ``""``), in key order."""
        scopes = sorted(s for s in self._names if s[:2] == (r.group, r.plural) and (not ns or s[2] == ns))
        return [self._objects[(r.group, r.plural, s[2], name)] for s in scopes for name in sorted(self._names[s])]

    def _get(self, r: Resource, ns: str, name: str) -> Obj | None:
        return self._objects.get(self._key(r, ns, name))

    def _bump(self) -> int:
        self._rv += 1
        return self._rv

    def _emit(self, r: Resource, ns: str, kind: str, old: Obj | None, new: Obj | None, rv: int) -> None:
        change = _Change(rv, r, ns, kind, old, new)  # stored objects are never changed in place: no copies
        if len(self._history) == self._history.maxlen and self._history:
            self._compacted_rv = self._history[0].rv
        self._history.append(change)
        for sub in self._subs:
            event = sub.translate(change)
            if event is not None:
                sub.queue.put(event)

    def _create(self, r: Resource, ns: str, obj: Obj, *, owned: bool = False) -> Obj:
        """Store a new object; ``owned``: ``obj`` is the caller's to give away (a parsed request body) and the
        stored object itself is returned, to be serialized, never changed."""
        with self._lock:
            body = copy.deepcopy(obj) if not owned else {**obj, "metadata": dict(obj.get("metadata") or {})}
            body = _omit_empty(r, body)
            meta = body.setdefault("metadata", {})
            if r.namespaced:
                if meta.get("namespace") not in (None, "", ns):
                    raise ApiError(400, "the namespace of the provided object does not match the namespace "
                                        "sent on the request")
                meta["namespace"] = ns
            if not meta.get("name"):
                if not meta.get("generateName"):
                    raise ApiError(422, "metadata.name or metadata.generateName is required")
                meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
            if self._get(r, ns, meta["name"]) is not None:
                raise ApiError(409, f'{r.plural} "{meta["name"]}" already exists', "AlreadyExists")
            rv = self._bump()
            body["apiVersion"], body["kind"] = r.api_version, r.kind
            meta["uid"] = str(uuid.uuid4())
            meta["resourceVersion"] = str(rv)
            meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            self._objects[self._key(r, ns, meta["name"])] = body
            self._names.setdefault((r.group, r.plural, ns if r.namespaced else ""), set()).add(meta["name"])
            self._emit(r, ns, "ADDED", None, body, rv)
            return body if owned else copy.deepcopy(body)

    def _replace(self, r: Resource, ns: str, name: str, obj: Obj, *, owned: bool = False) -> Obj:
        """Replace an object (``owned`` as for ``_create``)."""
        with self._lock:
            current = self._get(r, ns, name)
            if current is None:
                raise ApiError(404, f'{r.plural} "{name}" not found')
            body = copy.deepcopy(obj) if not owned else {**obj, "metadata": dict(obj.get("metadata") or {})}
            body = _omit_empty(r, body)
            meta = body.setdefault("metadata", {})
            wanted = meta.get("resourceVersion")
            if wanted and wanted != current["metadata"]["resourceVersion"]:
                raise ApiError(409, f'Operation cannot be fulfilled on {r.plural} "{name}": the object has been '
                                    "modified; please apply your changes to the latest version and try again")
            for fixed in ("name", "namespace", "uid", "creationTimestamp"):
                if fixed in current["metadata"]:
                    meta[fixed] = current["metadata"][fixed]
            rv = self._bump()
            meta["resourceVersion"] = str(rv)
            body["apiVersion"], body["kind"] = r.api_version, r.kind
            self._objects[self._key(r, ns, name)] = body
            self._emit(r, ns, "MODIFIED", current, body, rv)
            return body if owned else copy.deepcopy(body)

    def _delete(self, r: Resource, ns: str, name: str, options: Obj | None = None) -> Obj:
        """Remove an object. A pod is first marked (``deletionTimestamp``, ``deletionGracePeriodSeconds: 0``,
        a ``MODIFIED`` event) and then removed: what kube-apiserver does for a pod deleted with no grace period
        (a mirror pod, as the kubelet deletes it; tests/fixtures/kubelet/), which the emulator does for every pod
        (no kubelet here ends a graceful one).

        ``propagationPolicy: Foreground`` on an object that owns others (``ownerReferences`` naming its uid) is
        what kube-apiserver and the garbage collector do: the owner is marked (``deletionTimestamp``, the
        ``foregroundDeletion`` finalizer) and answered as it is, its dependents are deleted (a pod gracefully:
        marked with its ``terminationGracePeriodSeconds`` and kept until its kubelet ends it, i.e. until a test
        deletes it again), and the owner is removed once no dependent with ``blockOwnerDeletion`` is left."""
        with self._lock:
            current = self._get(r, ns, name)
            if current is not None and (options or {}).get("propagationPolicy") == "Foreground":
                marked = self._delete_foreground(r, ns, name, current)
                if marked is not None:
                    return marked
            if current is not None and r.plural == "pods" and r.group == "" \
                    and not current["metadata"].get("deletionTimestamp"):
                meta = {**current["metadata"], "deletionGracePeriodSeconds": 0,
                        "deletionTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                self._replace(r, ns, name, {**current, "metadata": meta}, owned=True)
            current = self._objects.pop(self._key(r, ns, name), None)
            if current is None:
                raise ApiError(404, f'{r.plural} "{name}" not found')
            self._names.get((r.group, r.plural, ns if r.namespaced else ""), set()).discard(name)
            rv = self._bump()
            gone = copy.deepcopy(current)
            gone["metadata"]["resourceVersion"] = str(rv)
            self._emit(r, ns, "DELETED", current, gone, rv)
            self._collect_owners(current)
            return gone

    def _dependents(self, uid: str) -> list[tuple[Resource, Obj, bool]]:
        """Every stored object that names ``uid`` among its owners: (resource, object, blocks the owner)."""
        resources = {(x.group, x.plural): x for x in self._resources.values()}
        found = []
        for (group, plural, _ns, _name), obj in self._objects.items():
            for ref in obj.get("metadata", {}).get("ownerReferences") or []:
                if ref.get("uid") == uid:
                    found.append((resources[(group, plural)], obj, bool(ref.get("blockOwnerDeletion"))))
        return found

    def _delete_foreground(self, r: Resource, ns: str, name: str, current: Obj) -> Obj | None:
        """The foreground deletion of an owner (None: it owns nothing, deleted as any object)."""
        uid = current["metadata"]["uid"]
        dependents = self._dependents(uid)
        if not dependents:
            return None
        meta = current["metadata"]
        if not meta.get("deletionTimestamp"):
            meta = {**meta, "deletionTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "deletionGracePeriodSeconds": 0,
                    "finalizers": [*(meta.get("finalizers") or []), "foregroundDeletion"]}
            current = self._replace(r, ns, name, {**current, "metadata": meta}, owned=True)
        self._foreground[uid] = (r, ns, name)
        for dr, dep, _blocks in dependents:
            dmeta = dep["metadata"]
            dns, dname = dmeta.get("namespace", ""), dmeta["name"]
            if dr.plural == "pods" and not dr.group:  # graceful: its kubelet ends it
                if not dmeta.get("deletionTimestamp"):
                    grace = (dep.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
                    marked = {**dmeta, "deletionGracePeriodSeconds": grace,
                              "deletionTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                    self._replace(dr, dns, dname, {**dep, "metadata": marked}, owned=True)
            else:
                self._delete(dr, dns, dname, {"propagationPolicy": "Foreground"})
        self._collect_owners(None)
        found = self._get(r, ns, name)
        return copy.deepcopy(found if found is not None else current)

    def _collect_owners(self, removed: Obj | None) -> None:
        """The garbage collector's part: an owner deleted in the foreground goes once nothing blocks it."""
        for uid, (r, ns, name) in list(self._foreground.items()):
            if any(blocks for _, _, blocks in self._dependents(uid)):
                continue
            del self._foreground[uid]
            owner = self._get(r, ns, name)
            if owner is None or owner["metadata"].get("uid") != uid:
                continue
            meta = {**owner["metadata"],
                    "finalizers": [f for f in owner["metadata"].get("finalizers") or [] if f != "foregroundDeletion"]}
            if not meta["finalizers"]:
                del meta["finalizers"]
            self._replace(r, ns, name, {**owner, "metadata": meta}, owned=True)
            if not meta.get("finalizers"):
                self._delete(r, ns, name)

    # -- JSON text ------------------------------------------------------------------------------------

    def _stored_text(self, obj: Obj) -> bytes:
        """The JSON text of a stored object (never changed in place: made once, see ``_JsonText``)."""
        return self._text.of(obj)

    def _event_text(self, event: object) -> bytes:
        """One watch-stream record, without its newline."""
        if isinstance(event, RawLine):
            return event.data
        if isinstance(event, _Event) and event.metadata_only:
            return json.dumps({"type": event.type, "object": metadata_of(event.object)}).encode()
        if isinstance(event, _Event):  # the same text as json.dumps({"type": ..., "object": ...})
            return b'{"type": ' + json.dumps(event.type).encode() + b', "object": ' + \
                self._stored_text(event.object) + b"}"
        return json.dumps(event).encode()

    # -- HTTP dispatch ---------------------------------------------------------------------------------

    def _route(self, path: str) -> tuple[Resource, str, str | None, str | None]:
        """(resource, namespace, name, subresource) for an API path."""
        segs = [s for s in path.split("/") if s]
        if segs[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", segs[2:]
        elif len(segs) >= 3 and segs[0] == "apis":
            group, version, rest = segs[1], segs[2], segs[3:]
        else:
            raise ApiError(404, f"the server could not find the requested resource ({path})")
        ns = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise ApiError(404, f"the server could not find the requested resource ({path})")
        r = self._resources.get((group, version, rest[0]))
        if r is None or (r.namespaced and not ns and len(rest) > 1) or (not r.namespaced and ns):
            raise ApiError(404, f"the server could not find the requested resource ({path})")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub not in (None, "status"):
            raise ApiError(404, f"subresource {sub!r} is not supported by the emulator")
        return r, ns, name, sub

    def _serve(self, method: str, path: str, query: dict[str, str], headers: dict[str, str],
               body: bytes) -> tuple[int, Any] | Iterator[Obj | object]:
        with self._lock:
            outage = self._outage
        if outage == "503":
            raise ApiError(503, "the API server is unavailable (emulated outage)")
        if self.token is not None:
            auth = headers.get("authorization", "")
            scheme, _, value = auth.partition(" ")
            if scheme.lower() != "bearer" or value.strip() != self.token:
                raise ApiError(401, "Unauthorized")
        if path.rstrip("/") == "/version" and method == "GET":
            major, minor = self.git_version.lstrip("v").split(".")[:2]
            return 200, {"major": major, "minor": minor, "gitVersion": self.git_version,
                         "gitCommit": "0" * 40, "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                         "goVersion": "go1.22.8", "compiler": "gc", "platform": "linux/amd64"}
        r, ns, name, _sub = self._route(path)
        accept = headers.get("accept", "")
        if method == "GET" and name is None and query.get("watch") in ("true", "1"):
            return self._watch(r, ns, query, _as_metadata(accept, "PartialObjectMetadata"))
        if method == "GET":
            if name is None:
                return 200, self._list_response(r, ns, query, _as_metadata(accept, "PartialObjectMetadataList"))
            metadata = _as_metadata(accept, "PartialObjectMetadata")
            with self._lock:
                found = self._get(r, ns, name)
            if found is None:
                raise ApiError(404, f'{r.plural} "{name}" not found')
            # serialized at once, never changed: no copy
            return 200, json.dumps(metadata_of(found)).encode() if metadata else self._stored_text(found)
        payload = self._json_body(body)
        if method == "POST" and name is None and r.plural == "pods" and not r.group and isinstance(payload, dict):
            # The API server drops a created pod's status (Pending until a kubelet reports through pods/status);
            # the Python API (``create``, ``set_pod``) still stores what it is given, as a test's set-up.
            payload = {**payload, "status": {"phase": "Pending", "qosClass": "BestEffort"}}
        if method == "POST" and name is None:
            return 201, self._stored_text(self._create(r, ns, payload, owned=True))
        if name is None:
            raise ApiError(405, f"{method} needs an object name")
        if method == "PUT":
            return 200, self._stored_text(self._replace(r, ns, name, payload, owned=True))
        if method == "PATCH":
            return 200, self._stored_text(self._patch(r, ns, name, headers.get("content-type", ""), payload))
        if method == "DELETE":
            return 200, self._stored_text(self._delete(r, ns, name, payload if isinstance(payload, dict) else None))
        raise ApiError(405, f"{method} is not supported")

    @staticmethod
    def _json_body(body: bytes) -> Any:
        try:
            return json.loads(body) if body else None
        except ValueError as exc:
            raise ApiError(400, f"request body is not JSON: {exc}") from exc

    def _list_response(self, r: Resource, ns: str, query: dict[str, str], metadata: bool = False) -> bytes:
        fields = _fields(r, query.get("fieldSelector"))
        labels = Selector.parse(query.get("labelSelector"), labels=True)
        limit = int(query["limit"]) if query.get("limit", "").isdigit() and int(query["limit"]) > 0 else None
        token = query.get("continue")
        with self._lock:
            if token:  # a later page: from the snapshot the first page was served from
                snap = self._snapshots.get(token.split(":")[0])
                if snap is None:  # compact() forgets snapshots, as etcd's compaction does
                    raise ApiError(410, "The provided continue parameter is too old to display a consistent "
                                        "list result. You can start a new list without the continue parameter.")
                rv, matching = snap
                offset = int(token.split(":")[1])
            else:
                # Stored objects are never changed in place (every write stores a new dict): a snapshot is
                # a list of references, copied only when sent.
                matching = [o for o in self._scan(r, ns) if fields.matches(o) and labels.matches(o)]
                rv, offset = self._rv, 0
            page = matching[offset:offset + limit] if limit else matching[offset:]
            meta: Obj = {"resourceVersion": str(rv)}
            if limit and offset + limit < len(matching):
                snap_id = token.split(":")[0] if token else secrets.token_hex(8)
                self._snapshots[snap_id] = (rv, matching)
                meta["continue"] = f"{snap_id}:{offset + limit}"
                meta["remainingItemCount"] = len(matching) - offset - limit
            elif token:
                self._snapshots.pop(token.split(":")[0], None)
            items = list(page)  # serialized at once, never changed: no copies
        # The text of json.dumps({... "items": items}), each item's made once (see ``_JsonText``).
        if metadata:
            return json.dumps({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList", "metadata": meta,
                               "items": [metadata_of(i) for i in items]}).encode()
        head = json.dumps({"apiVersion": r.api_version, "kind": r.kind + "List", "metadata": meta})
        return (head[:-1] + ', "items": [').encode() + b", ".join(map(self._stored_text, items)) + b"]}"

    def _patch(self, r: Resource, ns: str, name: str, content_type: str, patch: Any) -> Obj:
        mime = content_type.split(";")[0].strip()
        with self._lock:
            current = self._get(r, ns, name)
            if current is None:
                raise ApiError(404, f'{r.plural} "{name}" not found')
            if mime == MERGE_PATCH:
                if not isinstance(patch, dict):
                    raise ApiError(400, "a merge patch must be a JSON object")
                result = merge_patch(current, patch)
            elif mime == JSON_PATCH:
                result = json_patch(current, patch)
            else:
                raise ApiError(415, f"the emulator does not support patch type {content_type!r}")
            if not isinstance(result, dict):
                raise ApiError(422, "the patch did not produce an object")
            wanted = (patch.get("metadata") or {}).get("resourceVersion") if isinstance(patch, dict) else None
            result = {**result, "metadata": dict(result.get("metadata") or {})}  # shared with current otherwise
            result["metadata"]["resourceVersion"] = wanted or current["metadata"]["resourceVersion"]
            return self._replace(r, ns, name, result, owned=True)

    def _watch(self, r: Resource, ns: str, query: dict[str, str], metadata: bool = False) -> Iterator[Obj | object]:
        sub = _Subscription(r, ns or None, _fields(r, query.get("fieldSelector")),
                            Selector.parse(query.get("labelSelector"), labels=True), metadata_only=metadata)
        rv_text = query.get("resourceVersion", "")
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1") and self.bookmark_interval is not None
        with self._lock:
            replay: list[_Event] = []
            if rv_text in ("", "0"):
                for obj in self._scan(r, ns):
                    if sub._matches(obj):
                        replay.append(_Event("ADDED", obj, metadata))
            else:
                try:
                    since = int(rv_text)
                except ValueError as exc:
                    raise ApiError(400, f"invalid resourceVersion {rv_text!r}") from exc
                if since < self._compacted_rv:
                    gone = ApiError(410, f"too old resource version: {since} ({self._compacted_rv})")
                    return iter([{"type": "ERROR", "object": gone.status()}])
                for change in self._history:
                    if change.rv > since:
                        event = sub.translate(change)
                        if event is not None:
                            replay.append(event)
            self._subs.append(sub)
        return self._misbehave(sub, self._follow(sub, replay, timeout, bookmarks))

    def _misbehave(self, sub: _Subscription, events: Iterator[Obj | object]) -> Iterator[Obj | object]:
        close_after, garbage = self.watch_close_after, self.watch_garbage
        try:
            if garbage is not None:
                yield RawLine(garbage)
            if close_after == 0:
                return
            for sent, event in enumerate(events, 1):
                yield event
                if close_after is not None and sent >= close_after:
                    return
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()
            with self._lock:  # also when ``events`` never started (and so never ran its own cleanup)
                if sub in self._subs:
                    self._subs.remove(sub)

    def _follow(self, sub: _Subscription, replay: list[_Event], timeout: float | None,
                bookmarks: bool) -> Iterator[Obj | object]:
        deadline = time.monotonic() + timeout if timeout else None
        next_bookmark = time.monotonic() + (self.bookmark_interval or 0)
        try:
            yield from replay
            while True:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return
                if bookmarks and now >= next_bookmark:
                    with self._lock:
                        rv = self._rv
                    yield {"type": "BOOKMARK", "object": {"apiVersion": sub.resource.api_version,
                                                          "kind": sub.resource.kind,
                                                          "metadata": {"resourceVersion": str(rv)}}}
                    next_bookmark = now + (self.bookmark_interval or 0)
                try:
                    item = sub.queue.get(timeout=0.05)
                except queue.Empty:
                    continue
                yield item
                if item is _DROP:
                    return
        finally:
            with self._lock:
                if sub in self._subs:
                    self._subs.remove(sub)


# --- helpers for tests --------------------------------------------------------------------------------


def make_mirror_pod(
    *,
    node_name: str,
    static_name: str = "kube-scheduler",
    namespace: str = "kube-system",
    annotations: dict[str, str] | None = None,
    container: str = "kube-scheduler",
    started_at: str | None = None,
    ready: bool = True,
    restart_count: int = 0,
    waiting_reason: str | None = None,
    terminated_exit_code: int | None = None,
    finished_at: str | None = None,
) -> Obj:
    """A mirror pod as the kubelet publishes it: running (``started_at``), waiting or terminated."""
    if waiting_reason is not None:
        state: Obj = {"waiting": {"reason": waiting_reason}}
    elif terminated_exit_code is not None:
        state = {"terminated": {"exitCode": terminated_exit_code, "finishedAt": finished_at,
                                "reason": "Error" if terminated_exit_code else "Completed"}}
    else:
        state = {"running": {"startedAt": started_at}}
    running = "running" in state
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{static_name}-{node_name}", "namespace": namespace,
                     "annotations": dict(annotations or {}),
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node_name,
                                          "uid": "node-uid", "controller": True}]},
        "spec": {"nodeName": node_name, "containers": [{"name": container, "image": "registry.k8s.io/"
                                                                                    "kube-scheduler:v1.31.2"}]},
        "status": {
            "phase": "Running" if running else "Pending",
            "conditions": [{"type": "Ready", "status": "True" if ready and running else "False"}],
            "containerStatuses": [{"name": container, "ready": ready and running, "restartCount": restart_count,
                                   "state": state}],
        },
    }


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.02) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` passes; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return predicate()
        time.sleep(interval)
