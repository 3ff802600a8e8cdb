"""The one HTTP server: the probes and metrics (``health.HealthServer``) and the admission webhook (with TLS).

Why asyncio and these limits: the kubelet's probes (2-5 s timeouts) and the API server's webhook calls must be
answered while anything else hammers the port. One event loop holds an idle connection for a few kilobytes
instead of a thread; the listen backlog queues a burst in the kernel. A connection must send its request head
within ``timeout`` (the TLS handshake included) and finish it within ``head_timeout`` of its first byte; the
body and the answer have ``timeout`` more in all. At most ``max_connections`` are open: at the cap a new one
closes the oldest idle one (its head not complete), so slow clients cannot keep a probe waiting; one whose head
is complete is never evicted. Oversized heads get 414/431, bodies 413, chunked bodies 411. One request per
connection unless ``keep_alive`` (the webhook's: the API server keeps its connections, and a TLS handshake per
review costs several reviews). The application ``(method, path, body) -> (status, body, content type)`` runs
on the loop and must be quick; each server has its own loop.

With ``certs`` the server speaks TLS only, and the certificate follows its files: kubelet swaps a mounted
Secret's ``..data`` symlink, so the files' identity is compared on every new connection and a change loads a
new context (a pair that does not load keeps the previous one, logged once per change).

asyncio is imported only once the server serves: ``start(deferred=True)`` lets its thread wait until ``wake``
or a first connection (the socket listens from the constructor on), off the path from exec to the first write.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import ssl
import threading
from collections.abc import Callable
from http import HTTPStatus
from typing import TYPE_CHECKING, Final, Self

if TYPE_CHECKING:
    import asyncio
    from email.message import Message

    from patcher.adapters.streams import HeadReader

log = logging.getLogger(__name__)

#: ``(method, path, body) -> (status, body, content type)``: the application behind the server.
Handler = Callable[[str, str, bytes], tuple[int, bytes, str]]

#: Connections the kernel queues while the loop is busy (Linux caps it at net.core.somaxconn).
BACKLOG: Final = 1024
#: Open connections at once (a few KB each).
MAX_CONNECTIONS: Final = 256
#: Seconds a connection has to send its request head (and then to send its body and take the answer): a probe
#: sends it at once, so only idle and half-open connections reach it, and they are closed instead of held forever.
REQUEST_TIMEOUT: Final = 5.0
#: Seconds from a request's first byte to the end of its head: a probe, a scraper or the API server sends its
#: head in one segment, so a head still unfinished after this is a client holding a slot, and is closed to free it.
HEAD_TIMEOUT: Final = 1.0
#: A request head larger than this is refused (clients here send a few hundred bytes).
MAX_REQUEST_HEAD: Final = 8192
#: An AdmissionReview holds one object; the API server refuses objects above 3 MiB (etcd's limit) anyway.
MAX_BODY: Final = 4 * 1024 * 1024
#: After refusing an oversized head, bytes of it still read and dropped (within ``timeout``) before closing,
#: so that the client reads the answer instead of a reset caused by its own unread request.
MAX_DISCARD: Final = 1 << 20
TEXT: Final = "text/plain; charset=utf-8"
#: RFC 9110's names, which ``HTTPStatus`` has only from Python 3.13 on.
_PHRASES: Final = {413: "Content Too Large", 414: "URI Too Long"}


FileId = tuple[int, int, int, int]


def parse_listen(listen: str) -> tuple[str, int]:
    """``host:port``, ``:port`` (all interfaces) or ``[v6]:port`` into (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen must be host:port or :port, got {listen!r}")
    return host.strip("[]"), int(port)


def _file_id(path: str) -> FileId:
    st = os.stat(path)  # follows the symlinks: the ..data swap shows as another inode
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class CertReloader:
    """The TLS context of a certificate/key file pair, rebuilt when the files change (the module says why)."""

    def __init__(self, cert: str, key: str) -> None:
        self.cert, self.key = cert, key
        self._lock = threading.Lock()
        self._ids: tuple[FileId, FileId] | None = None
        self._failed_ids: tuple[FileId, FileId] | None = None
        self._context = self._load()  # at start a pair that does not load is an error: raise

    def _load(self) -> ssl.SSLContext:
        ids = (_file_id(self.cert), _file_id(self.key))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        self._ids = ids
        return ctx

    def context(self) -> ssl.SSLContext:
        """The context for a new connection: reloaded first if the files changed since the last load."""
        with self._lock:
            try:
                ids = (_file_id(self.cert), _file_id(self.key))
            except OSError as exc:  # mid-swap, or the Secret is gone: keep serving with what we have
                log.debug("cannot stat the certificate (%s); keeping the loaded one", exc)
                return self._context
            if ids != self._ids and ids != self._failed_ids:
                try:
                    self._context = self._load()
                except (OSError, ssl.SSLError) as exc:
                    self._failed_ids = ids
                    log.warning("cannot load the new certificate %s (%s); keeping the previous one", self.cert, exc)
                else:
                    self._failed_ids = None
                    log.info("certificate reloaded from %s", self.cert)
            return self._context


def _has_data(conn: socket.socket) -> bool:
    """Whether bytes wait in the kernel for ``conn`` (a request the loop has not read yet); an error or
    the peer's close count as none: such a connection is as idle as one that never sent anything."""
    try:
        return bool(conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:  # BlockingIOError (nothing there) included
        return False


def _content_length(headers: Message) -> int:
    """The request's body length: ``Content-Length``, 0 without one (HTTP/1.1's rule), -1 when it is not a
    number or the body comes chunked (``Transfer-Encoding``, which no client of ours sends). A value with bytes
    outside ASCII comes back from ``email`` as a ``Header``, not a ``str``: ``str`` it first."""
    length = str((headers.get_all("Content-Length") or ["0"])[-1]).strip()
    return -1 if "Transfer-Encoding" in headers or not (length.isascii() and length.isdigit()) else int(length)


def _phrase(code: int) -> str:
    return _PHRASES.get(code) or HTTPStatus(code).phrase


def response(code: int, body: bytes, content_type: str, *, head_only: bool = False, close: bool = True) -> bytes:
    connection = "Connection: close\r\n" if close else ""
    head = (f"HTTP/1.1 {code} {_phrase(code)}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n{connection}\r\n")
    return head.encode("latin-1") + (b"" if head_only else body)


class HttpServer:
    """Serves ``app`` from one asyncio loop in a thread, over TLS when ``certs`` is given (the module says why)."""

    def __init__(self, app: Handler, listen: str, *, certs: CertReloader | None = None,
                 max_connections: int = MAX_CONNECTIONS, timeout: float = REQUEST_TIMEOUT,
                 head_timeout: float = HEAD_TIMEOUT, max_body: int = MAX_BODY, keep_alive: bool = False,
                 name: str = "http-server") -> None:
        host, port = parse_listen(listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(BACKLOG)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self.app = app
        self.certs = certs
        self.name = name
        self.max_connections = max_connections
        self.timeout = timeout
        self.head_timeout = head_timeout
        self.max_body = max_body
        self.keep_alive = keep_alive
        self._open = 0  # connections holding a slot
        # idle connections (head not complete), oldest first: serial -> (socket, its task); the end of a request's
        # head takes one out
        self._idle: dict[int, tuple[socket.socket, asyncio.Task[None]]] = {}
        self._evicted: set[int] = set()  # their slot went to the connection that evicted them
        self._room: asyncio.Event | None = None  # set when a slot frees or a connection turns idle
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._stop_requested = False  # stop() came: a loop not running yet does not start
        self._started = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake_pipe: tuple[int, int] | None = None  # (read, write) while a deferred start waits
        self._wake_lock = threading.Lock()  # a wake never writes to a descriptor stop() closed (and reused)
        self._woken = False  # the one byte is written: the thread is past its wait, or on its way

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return int(self._sock.getsockname()[1])

    @property
    def url(self) -> str:
        host = str(self._sock.getsockname()[0])
        host = "127.0.0.1" if host in ("", "0.0.0.0") else f"[{host}]" if ":" in host else host
        return f"{'https' if self.certs else 'http'}://{host}:{self.port}"

    async def _read_head(self, reader: HeadReader) -> bytes:
        """The request head, within ``timeout`` of the connection and ``head_timeout`` of its first byte."""
        import asyncio

        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.timeout) as deadline:
                def shorten() -> None:
                    now_due = loop.time() + self.head_timeout
                    when = deadline.when()
                    deadline.reschedule(now_due if when is None else min(when, now_due))

                reader.when_first_byte(shorten)
                return await reader.readuntil(b"\r\n\r\n")
        finally:
            reader.when_first_byte(None)

    async def _handle(self, reader: HeadReader, writer: asyncio.StreamWriter,
                      idle_again: Callable[[], object] = lambda: None) -> None:
        """The requests on one connection (one unless ``keep_alive``), each answered; then the connection closed.
        ``idle_again`` is called when a kept-alive connection waits for its next request."""
        import asyncio

        try:
            while True:
                try:
                    head = await self._read_head(reader)
                except asyncio.LimitOverrunError:
                    await self._refuse_oversized(reader, writer)
                    return
                async with asyncio.timeout(self.timeout):  # the body, the answer and its sending: in all
                    answer, keep = await self._answer(head, reader)
                    writer.write(answer)
                    await writer.drain()
                if not keep:
                    return
                if reader.answered():
                    idle_again()
        except (TimeoutError, asyncio.IncompleteReadError, OSError):
            return
        finally:
            writer.close()

    async def _answer(self, head: bytes, reader: asyncio.StreamReader) -> tuple[bytes, bool]:
        """The answer to the request of ``head`` (its body read from ``reader``) and whether the connection
        stays open for another."""
        parts = head.split(b"\r\n", 1)[0].split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return response(400, b"bad request\n", TEXT), False
        from email.parser import BytesParser  # imported with the first request, as asyncio is

        method = parts[0].decode("latin-1")
        headers = BytesParser().parsebytes(head.split(b"\r\n", 1)[1], headersonly=True)
        length = _content_length(headers)
        if length < 0:
            return response(411, b"Content-Length required (no chunked bodies)\n", TEXT), False
        if length > self.max_body:
            return response(413, b"request body too large\n", TEXT), False
        body = await reader.readexactly(length) if length else b""
        keep = self.keep_alive and parts[2] == b"HTTP/1.1" and "close" not in str(headers.get("Connection", "")).lower()
        try:
            code, payload, ctype = self.app(method, parts[1].decode("latin-1"), body)
        except Exception:
            log.exception("%s: the answer to %s %r failed", self.name, method, parts[1][:200])
            return response(500, b"internal error\n", TEXT), False
        return response(code, payload, ctype, head_only=method == "HEAD", close=not keep), keep

    async def _refuse_oversized(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """414 when the request line alone passes the limit, 431 when the headers do; then close our side and
        drop what the client still sends (bounded by ``timeout`` and ``MAX_DISCARD``): closing a socket with
        unread data sends a reset, and the client would lose the answer."""
        import asyncio

        start = await reader.read(MAX_REQUEST_HEAD)  # buffered already: returns at once
        code = 431 if b"\r\n" in start else 414
        writer.write(response(code, f"{_phrase(code).lower()}\n".encode(), TEXT))
        with contextlib.suppress(TimeoutError, OSError):
            async with asyncio.timeout(self.timeout):
                await writer.drain()
                if writer.can_write_eof():  # not over TLS: its close_notify comes with the close
                    writer.write_eof()
                dropped = 0
                while dropped < MAX_DISCARD and (chunk := await reader.read(65536)):
                    dropped += len(chunk)

    def _evict_oldest_idle(self) -> bool:
        """Close the oldest idle connection (its head not complete) and hand its slot over; False when none is."""
        for serial, (conn, task) in list(self._idle.items()):
            if _has_data(conn):  # more of its request arrived, not read yet: it may be complete; not now
                continue
            del self._idle[serial]
            self._evicted.add(serial)
            self._open -= 1
            task.cancel()  # its handler closes the connection and does not release the slot
            return True
        return False

    async def _connection(self, conn: socket.socket, serial: int) -> None:
        import asyncio

        from patcher.adapters.streams import HeadReader

        room = self._room
        assert room is not None
        task = asyncio.current_task()
        assert task is not None

        def idle() -> None:  # evictable: new, or kept alive and waiting for its next request
            self._idle[serial] = (conn, task)
            room.set()  # an accepted connection may be waiting for one to evict

        idle()
        writer: asyncio.StreamWriter | None = None
        try:
            # The answer at once, not held back by Nagle until the client's delayed ACK of what was sent before
            # it (TLS session tickets). asyncio sets this only on sockets made with IPPROTO_TCP.
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            loop = asyncio.get_running_loop()
            # A slot waiter skipped this connection while its bytes waited unread: now it may evict it.
            reader = HeadReader(MAX_REQUEST_HEAD, lambda: self._idle.pop(serial, None), on_partial=room.set)
            protocol = asyncio.StreamReaderProtocol(reader)
            tls = self.certs.context() if self.certs is not None else None
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol, sock=conn, ssl=tls, ssl_handshake_timeout=self.timeout if tls else None)
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            await self._handle(reader, writer, idle)
        except (OSError, asyncio.CancelledError):  # a client gone, a handshake failed, evicted, or the stop
            pass
        finally:
            self._idle.pop(serial, None)
            if writer is not None:
                writer.close()  # the transport closes the socket once the answer is flushed
            else:
                conn.close()
            if serial in self._evicted:
                self._evicted.discard(serial)
            else:
                self._open -= 1
                room.set()

    async def _slot(self) -> None:
        """Wait until a connection may be opened: a free slot, or the slot of the oldest idle connection."""
        assert self._room is not None
        while self._open >= self.max_connections and not self._evict_oldest_idle():
            self._room.clear()
            await self._room.wait()
        self._open += 1

    async def _accept(self) -> None:
        """Accept, then take a slot (at most one accepted connection waits for it; beyond it, connections
        wait in the kernel's backlog)."""
        import asyncio

        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()
        serial = 0
        try:
            while True:
                try:
                    conn, _ = await loop.sock_accept(self._sock)
                except OSError as exc:  # e.g. out of file descriptors: do not spin
                    log.warning("%s cannot accept a connection", self.name, extra={"error": str(exc)})
                    await asyncio.sleep(0.1)
                    continue
                try:
                    await self._slot()
                except BaseException:
                    conn.close()
                    raise
                serial += 1
                task = asyncio.create_task(self._connection(conn, serial))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self) -> None:
        import asyncio

        self._room = asyncio.Event()
        self._stopping = asyncio.Event()
        if self._stop_requested:  # stop() came before the loop ran: it could not reach this event (see stop)
            return  # ``_run`` sets ``_started``
        accepting = asyncio.create_task(self._accept())
        self._started.set()
        await self._stopping.wait()
        accepting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await accepting

    def _run(self) -> None:
        if self._wake_pipe is not None:
            # Block until ``wake`` or ``stop`` writes to the pipe, or a connection waits in the backlog.
            select.select([self._sock.fileno(), self._wake_pipe[0]], [], [])
        if self._stop_requested:
            self._started.set()
            return
        import asyncio

        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        finally:
            self._started.set()
            loop.close()

    def start(self, *, deferred: bool = False) -> None:
        """Serve from a thread. Without ``deferred``, return once the loop runs; with it, at once: the thread
        waits for ``wake`` or a first connection before it imports asyncio and serves (the module says why)."""
        if self._thread is None:
            if deferred:
                self._wake_pipe = os.pipe()
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
            if not deferred:
                self._started.wait()
            log.info("%s listening", self.name, extra={"url": self.url})

    def wake(self) -> None:
        """Serve now (a deferred start); nothing when serving already."""
        with self._wake_lock:
            if self._wake_pipe is not None and not self._woken:
                os.write(self._wake_pipe[1], b"w")  # the pipe's only byte: never blocks
                self._woken = True

    def stop(self) -> None:
        if self._thread is not None:
            # The flag before the loop's event is read: a loop that has not made its event yet sees the flag.
            self._stop_requested = True
            self.wake()
            loop, stopping = self._loop, self._stopping
            if loop is not None and stopping is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # the loop ended meanwhile
                    loop.call_soon_threadsafe(stopping.set)
            self._thread.join(2.0)
            self._thread = None
        with self._wake_lock:
            if self._wake_pipe is not None:
                for fd in self._wake_pipe:
                    os.close(fd)
                self._wake_pipe = None
        self._sock.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
