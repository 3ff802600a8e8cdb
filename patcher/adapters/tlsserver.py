"""A small HTTPS server for the admission webhook: threaded but bounded, and a certificate that follows its files.

Why not the health server: the API server calls the webhook over TLS with a short ``timeoutSeconds``, many
calls at once when a controller creates pods in bulk, and the certificate is a Secret mounted into the pod
that cert-manager (or a chart upgrade) rotates. So:

* **Bounded.** At most ``max_workers`` requests are served at once, each on its own thread; beyond that the
  accept loop waits for a free slot and new connections queue in the listen backlog (the API server times
  them out and ``failurePolicy: Ignore`` admits the pod). Every connection has a socket timeout, so a client
  that stalls (in the TLS handshake too: it runs on the worker thread, never in the accept loop) frees its
  slot after ``timeout`` seconds, and an idle keep-alive connection gives its slot up as soon as another
  connection waits for one. A request (the handshake, then each request on a kept-alive connection) has
  ``timeout`` seconds in all, not per read: a client that trickles its bytes is cut off then, so a few slow
  clients cannot hold every slot. Request bodies above ``max_body`` are refused unread.
* **The certificate follows its files.** kubelet updates a mounted Secret by swapping a symlink (``..data``),
  so the files' identity (device, inode, size, mtime of what the paths resolve to) changes at once. It is
  compared on every new connection (two ``stat`` calls); a change loads the pair into a new TLS context used
  for connections from then on. A pair that does not load (a half-written file, a key that does not match)
  keeps the previous context and is tried again on the next connection; it is logged once per change.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Final

from patcher.adapters.health import parse_listen

log = logging.getLogger(__name__)

#: ``(method, path, body) -> (status, body, content type)``: the application behind the server.
Handler = Callable[[str, str, bytes], tuple[int, bytes, str]]

#: An AdmissionReview holds one object; the API server refuses objects above 3 MiB (etcd's limit) anyway.
MAX_BODY: Final = 4 * 1024 * 1024

#: How often an idle keep-alive connection looks whether another connection waits for its slot.
IDLE_POLL: Final = 0.1

FileId = tuple[int, int, int, int]


def _file_id(path: str) -> FileId:
    st = os.stat(path)  # follows the symlinks: the ..data swap shows as another inode
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class CertReloader:
    """The TLS context of a certificate/key file pair, rebuilt when the files change."""

    def __init__(self, cert: str, key: str) -> None:
        self.cert, self.key = cert, key
        self._lock = threading.Lock()
        self._ids: tuple[FileId, FileId] | None = None
        self._failed_ids: tuple[FileId, FileId] | None = None
        self.loads = 0  #: contexts built (1 at start, then one per rotation picked up)
        self._context = self._load()  # at start a pair that does not load is an error: raise

    def _load(self) -> ssl.SSLContext:
        ids = (_file_id(self.cert), _file_id(self.key))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        self._ids = ids
        self.loads += 1
        return ctx

    def context(self) -> ssl.SSLContext:
        """The context for a new connection: reloaded first if the files changed since the last load."""
        with self._lock:
            try:
                ids = (_file_id(self.cert), _file_id(self.key))
            except OSError as exc:  # mid-swap, or the Secret is gone: keep serving with what we have
                log.debug("cannot stat the webhook certificate (%s); keeping the loaded one", exc)
                return self._context
            if ids != self._ids and ids != self._failed_ids:
                try:
                    self._context = self._load()
                except (OSError, ssl.SSLError) as exc:
                    self._failed_ids = ids
                    log.warning("cannot load the new webhook certificate %s (%s); keeping the previous one",
                                self.cert, exc)
                else:
                    self._failed_ids = None
                    log.info("webhook certificate reloaded from %s", self.cert)
            return self._context


class _RequestHandler(BaseHTTPRequestHandler):
    server: TlsServer
    protocol_version = "HTTP/1.1"  # the API server keeps connections open between reviews
    # An answer is a few hundred bytes: sent at once, not held back by Nagle for the client's delayed ACK (40 ms).
    disable_nagle_algorithm = True

    def handle(self) -> None:
        """Requests on this connection until it closes, idles out, or is idle while another connection waits
        for a slot (an idle keep-alive connection must not keep a new one, with a review in it, waiting)."""
        self.close_connection = True
        self.handle_one_request()
        while not self.close_connection and self.server.next_request_arrives(self.connection):
            self.server.started(self.connection)  # the next request's own ``timeout`` seconds
            self.handle_one_request()

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or "-1")
        except ValueError:
            length = -1
        if length < 0:
            self._send(411, b"Content-Length required\n", "text/plain")
            return
        if length > self.server.max_body:
            self.close_connection = True
            self._send(413, b"request body too large\n", "text/plain")
            return
        body = self.rfile.read(length)
        if len(body) < length:  # the client went away, or was cut off at its deadline: nothing to review
            raise ConnectionError(f"request body cut short ({len(body)} of {length} bytes)")
        status, payload, ctype = self.server.app("POST", self.path, body)
        self._send(status, payload, ctype)

    def do_GET(self) -> None:
        status, payload, ctype = self.server.app("GET", self.path, b"")
        self._send(status, payload, ctype)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The HTTP layer's refusals (a request line it cannot read, headers over its limits, a method without a
        ``do_``) answered as every other answer here: HTTP/1.1, plain text, one write; then the connection is
        closed. The base class answered a request line with a bad version as HTTP/0.9, with no status line
        and an HTML page: not an answer the API server could read."""
        self.close_connection = True
        reason = message or self.responses.get(code, ("",))[0]
        self._send(code, f"{code} {reason}\n".encode("utf-8", "replace"), "text/plain; charset=utf-8")

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.log_request(code)
        lines = [f"{self.protocol_version} {code} {self.responses.get(code, ('',))[0]}",
                 f"Content-Type: {ctype}", f"Content-Length: {len(body)}"]
        if self.close_connection:
            lines.append("Connection: close")
        head = "\r\n".join([*lines, "", ""]).encode("latin-1")
        self.wfile.write(head + body)  # headers and body in one TLS record, one segment

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("webhook %s: " + format, self.address_string(), *args)


class TlsServer(HTTPServer):
    """HTTPS for ``app``, at most ``max_workers`` connections served at once, certificate from ``certs``."""

    daemon_threads = True
    request_queue_size = 64

    def __init__(self, listen: str, certs: CertReloader, app: Handler, *, max_workers: int = 16,
                 timeout: float = 10.0, max_body: int = MAX_BODY) -> None:
        host, port = parse_listen(listen)
        self.certs = certs
        self.app = app
        self.max_body = max_body
        self.conn_timeout = timeout
        self._slots = threading.BoundedSemaphore(max_workers)
        self._count_lock = threading.Lock()
        self.active = 0  #: connections being served now
        self.waiting = 0  #: accepted connections waiting for a free slot (0 or 1: the accept loop waits with it)
        self.dropped = 0  #: connections ended by a failed handshake, a timeout or a client gone
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._deadlines: dict[socket.socket, float] = {}  # connections served now: when their request ends
        self._deadline_lock = threading.Lock()
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), _RequestHandler)

    def next_request_arrives(self, conn: socket.socket) -> bool:
        """Wait on an idle keep-alive connection for its next request: False (close it) after the timeout, as
        soon as an accepted connection waits for a slot, or when the server stops."""
        with self._deadline_lock:  # idle: its own timeout below, not the last request's deadline
            self._deadlines.pop(conn, None)
        deadline = time.monotonic() + self.conn_timeout
        while True:
            if isinstance(conn, ssl.SSLSocket) and conn.pending():
                return True
            try:
                readable, _, _ = select.select([conn], [], [], min(IDLE_POLL, max(0.0, deadline - time.monotonic())))
            except (OSError, ValueError):
                return False
            if readable:
                return True
            if self.waiting or self._closing.is_set() or time.monotonic() >= deadline:
                return False

    def started(self, conn: socket.socket) -> None:
        """A request begins on ``conn``: it must be done within ``timeout`` seconds (``cut_overdue``)."""
        with self._deadline_lock:
            self._deadlines[conn] = time.monotonic() + self.conn_timeout

    def cut_overdue(self) -> None:
        """End the connections whose request is past its deadline: a shutdown of the socket wakes the worker
        blocked in a read with an end of file (the base class's, not ``SSLSocket.shutdown``, which would drop
        the TLS object under the worker's feet)."""
        now = time.monotonic()
        with self._deadline_lock:
            for conn, deadline in self._deadlines.items():
                if now >= deadline:
                    with contextlib.suppress(OSError):
                        socket.socket.shutdown(conn, socket.SHUT_RDWR)

    def service_actions(self) -> None:
        """Called by ``serve_forever`` on every poll."""
        self.cut_overdue()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def process_request(self, request: Any, client_address: Any) -> None:
        """One thread per connection, once a slot is free (the accept loop waits here when all are busy)."""
        if not self._slots.acquire(blocking=False):
            with self._count_lock:
                self.waiting += 1
            while not self._slots.acquire(timeout=IDLE_POLL):  # the accept loop waits here: cut from here too
                self.cut_overdue()
            with self._count_lock:
                self.waiting -= 1
        with self._count_lock:
            self.active += 1
        try:
            threading.Thread(target=self._serve, args=(request, client_address), name="webhook-conn",
                             daemon=True).start()
        except BaseException:
            self._done()
            self.shutdown_request(request)
            raise

    def _done(self) -> None:
        with self._count_lock:
            self.active -= 1
        self._slots.release()

    def _serve(self, sock: socket.socket, client_address: Any) -> None:
        conn: socket.socket = sock
        try:
            sock.settimeout(self.conn_timeout)
            conn = self.certs.context().wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            self.started(conn)  # the handshake and the first request
            conn.do_handshake()
            self.finish_request(conn, client_address)
        except (OSError, ssl.SSLError) as exc:  # a failed handshake, a client gone or too slow
            with self._count_lock:
                self.dropped += 1
            log.debug("webhook connection from %s: %s", client_address, exc)
        except Exception:
            log.exception("webhook connection from %s failed", client_address)
        finally:
            with self._deadline_lock:
                self._deadlines.pop(conn, None)
            self.shutdown_request(conn)
            self._done()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="webhook-server", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting; idle keep-alive connections are closed within ``IDLE_POLL``."""
        self._closing.set()
        self.shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join(5.0)
