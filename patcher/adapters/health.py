"""Liveness, readiness and Prometheus metrics over one small asyncio HTTP server.

``/healthz`` (alias ``/livez``) answers 200 while the agent loop keeps beating (a heartbeat younger than
``max_age`` seconds): a stuck loop gets the container restarted. ``/readyz`` answers 200 only when the node's
state is ``Ready`` and the loop is alive: it is the DaemonSet's readiness probe, so ``kubectl rollout status``
tells a human that every scheduler restarted with the new config. ``/metrics`` serves a registry of its own
(not the process-global default) so tests and several agents in one process do not collide; it carries the
process collector and a ``build_info`` gauge, and no ``_created`` series (they double the series count for
nothing a dashboard uses).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import platform
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Final, Protocol, SupportsIndex

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

from patcher import __version__
from patcher.core.status import NodeState

disable_created_metrics()  # type: ignore[no-untyped-call]  # process-wide by design of prometheus_client; this process serves only our registries

log = logging.getLogger(__name__)

DEFAULT_LISTEN: Final = ":9808"
#: Seconds from the manifest write to the restarted scheduler seen Ready: a static pod restart takes seconds,
#: a slow image pull minutes, and the default restart timeout is 10 minutes.
RESTART_BUCKETS: Final = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
#: Connections the kernel queues while the loop is busy (Linux caps it at net.core.somaxconn).
BACKLOG: Final = 1024
#: Open connections at once (a few KB each). At the cap a new connection closes the oldest idle one (no byte
#: of a request received yet); when none is idle it waits in the backlog until one closes.
MAX_CONNECTIONS: Final = 256
#: Seconds a connection has to send its request head (and to take the answer): a probe sends it at once, so
#: only idle and half-open connections reach it, and they are closed instead of held forever.
REQUEST_TIMEOUT: Final = 5.0
#: A request head larger than this is refused (probes and scrapers send a few hundred bytes): 414 when its
#: request line alone is longer, 431 otherwise.
MAX_REQUEST_HEAD: Final = 8192
#: After refusing an oversized head, bytes of it still read and dropped (within ``timeout``) before closing,
#: so that the client reads the answer instead of a reset caused by its own unread request.
MAX_DISCARD: Final = 1 << 20
TEXT: Final = "text/plain; charset=utf-8"


def add_process_info(registry: CollectorRegistry, namespace: str = "scheduler_patcher") -> None:
    """``process_*`` (CPU, memory, open fds, start time) and ``<namespace>_build_info{version,python_version}``.

    The process collector is what tells a memory limit being approached; build_info lets a dashboard join
    any series to the version that produced it, the Kubernetes components' convention.
    """
    ProcessCollector(registry=registry)
    info = Gauge("build_info", "Always 1; the labels tell the build.", ["version", "python_version"],
                 namespace=namespace, registry=registry)
    info.labels(version=__version__, python_version=platform.python_version()).set(1)


class Metrics:
    """The agent's Prometheus metrics; every method is thread-safe and cheap."""

    def __init__(self, registry: CollectorRegistry | None = None, states: Iterable[str] = tuple(NodeState)) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        ns = "scheduler_patcher"
        self._reconciles = Counter("reconciles", "Reconcile passes run.", namespace=ns, registry=self.registry)
        self._writes = Counter("writes", "Manifest writes (patches applied).", namespace=ns, registry=self.registry)
        self._restores = Counter("restores", "Manifest restores.", namespace=ns, registry=self.registry)
        self._rollbacks = Counter("rollbacks", "Rollbacks after a failed restart.", namespace=ns,
                                  registry=self.registry)
        self._errors = Counter("errors", "Errors by kind.", ["kind"], namespace=ns, registry=self.registry)
        self._state = Gauge("state", "Current node state (1 for the current one, 0 for the others).", ["state"],
                            namespace=ns, registry=self.registry)
        self._restart = Histogram("restart_seconds", "Seconds from the manifest write to the restart seen.",
                                  namespace=ns, buckets=RESTART_BUCKETS, registry=self.registry)
        add_process_info(self.registry)
        self._states = tuple(str(s) for s in states)
        self._lock = threading.Lock()
        for state in self._states:
            self._state.labels(state=state).set(0)

    def reconciled(self) -> None:
        self._reconciles.inc()

    def wrote(self) -> None:
        self._writes.inc()

    def restored(self) -> None:
        self._restores.inc()

    def rolled_back(self) -> None:
        self._rollbacks.inc()

    def error(self, kind: str) -> None:
        """Count one error of ``kind`` (e.g. ``manifest``, ``api``, ``annotations``, ``event``, ``watch``)."""
        self._errors.labels(kind=kind).inc()

    def restart_seen(self, seconds: float | None) -> None:
        """Record how long the scheduler took to come back after a write; ``None``: the restart was not verified
        (no API and no local check), so there is no duration to record and the histogram is left alone."""
        if seconds is not None:
            self._restart.observe(max(0.0, seconds))

    def set_state(self, state: str) -> None:
        """Make ``state`` the one-hot current state (the label set is fixed up front, so no series vanish)."""
        with self._lock:
            for known in self._states:
                self._state.labels(state=known).set(1 if known == state else 0)
            if state not in self._states:
                self._state.labels(state=state).set(1)

    def render(self) -> bytes:
        """The exposition text of this registry."""
        return generate_latest(self.registry)


class Health:
    """Heartbeat and state shared between the agent loop and the probe handlers."""

    def __init__(
        self, max_age: float = 60.0, metrics: Metrics | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_age = max_age
        self.metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        self._beat: float | None = None
        self._state: str = str(NodeState.PENDING)

    def beat(self) -> None:
        """Called by the loop on every pass (and while idle) to show it is alive."""
        with self._lock:
            self._beat = self._clock()

    def set_state(self, state: str) -> None:
        """Record the node state (also the metrics' one-hot gauge when metrics are attached)."""
        with self._lock:
            self._state = str(state)
        if self.metrics is not None:
            self.metrics.set_state(str(state))

    @property
    def state(self) -> str:
        with self._lock:
            return self._state

    def alive(self) -> bool:
        with self._lock:
            return self._beat is not None and self._clock() - self._beat <= self.max_age

    def ready(self) -> bool:
        return self.alive() and self.state == NodeState.READY


def parse_listen(listen: str) -> tuple[str, int]:
    """``host:port``, ``:port`` (all interfaces) or ``[v6]:port`` into (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen must be host:port or :port, got {listen!r}")
    return host.strip("[]"), int(port)


class Renderable(Protocol):
    """Anything that renders Prometheus text: the agent's Metrics, the gatekeeper's GateMetrics."""

    def render(self) -> bytes: ...


_REASONS: Final = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                   414: "URI Too Long", 431: "Request Header Fields Too Large", 503: "Service Unavailable"}


class _Reader(asyncio.StreamReader):
    """A stream reader that says when the first byte arrives: from then on its connection carries a request
    and is never evicted as idle."""

    def __init__(self, limit: int, on_data: Callable[[], object]) -> None:
        super().__init__(limit=limit)
        self.received = False
        self._on_data = on_data

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        if data and not self.received:
            self.received = True
            self._on_data()
        super().feed_data(data)


def _has_data(conn: socket.socket) -> bool:
    """Whether bytes wait in the kernel for ``conn`` (a request the loop has not read yet); an error or
    the peer's close count as none: such a connection is as idle as one that never sent anything."""
    try:
        return bool(conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:  # BlockingIOError (nothing there) included
        return False


class HealthServer:
    """Serves ``/healthz`` (alias ``/livez``), ``/readyz`` and ``/metrics`` from one asyncio loop in a thread.

    Why asyncio and these limits: the kubelet's probes have 2-5 s timeouts and must be answered while anything
    else hammers the port. One event loop holds an idle connection for a few kilobytes instead of a thread, the
    listen backlog (``backlog``) queues a burst in the kernel instead of refusing it, every connection must send
    its request head within ``timeout`` seconds (half-open connections are closed, not kept forever), and at most
    ``max_connections`` are open at once, so memory stays bounded. At the cap, a new connection closes the
    oldest idle one (connected, no byte of a request received, in the kernel or in the loop): slow clients
    holding connections open cannot keep a probe waiting for their timeout. A connection whose request has
    begun is never evicted; when every open one has, new ones wait in the backlog. A head over
    ``MAX_REQUEST_HEAD`` gets 414 (request line) or 431 (headers) and the connection is closed. Each
    connection carries one request (``Connection: close``), which is what probes and Prometheus handle.

    ``ready`` decides ``/readyz`` (default: the agent's state is Ready); the gatekeeper passes ``health.alive``
    because a standby replica is as ready as its leader.
    """

    def __init__(self, health: Health, metrics: Renderable, listen: str = DEFAULT_LISTEN,
                 ready: Callable[[], bool] | None = None, *, backlog: int = BACKLOG,
                 max_connections: int = MAX_CONNECTIONS, timeout: float = REQUEST_TIMEOUT) -> None:
        host, port = parse_listen(listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(backlog)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self.health = health
        self.metrics = metrics
        self.ready = ready or health.ready
        self.max_connections = max_connections
        self.timeout = timeout
        self.open_connections = 0
        self.peak_connections = 0  # the most open at once: never above max_connections
        self.timed_out_connections = 0  # no complete request head within the timeout
        self.evicted_connections = 0  # idle ones closed to make room for a new connection at the cap
        # idle connections, oldest first: serial -> (socket, writer); a request's first byte takes one out
        self._idle: dict[int, tuple[socket.socket, asyncio.StreamWriter]] = {}
        self._evicted: set[int] = set()  # their slot went to the connection that evicted them
        self._room = asyncio.Event()  # set when a slot frees or a connection turns idle
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return int(self._sock.getsockname()[1])

    @property
    def url(self) -> str:
        host = str(self._sock.getsockname()[0])
        host = "127.0.0.1" if host in ("", "0.0.0.0") else f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def route(self, path: str) -> tuple[int, bytes, str]:
        """(status, body, content type) for a GET of ``path``."""
        path = path.split("?", 1)[0]
        if path in ("/healthz", "/livez"):
            alive = self.health.alive()
            return (200, b"ok\n", TEXT) if alive else (503, b"agent loop stalled\n", TEXT)
        if path == "/readyz":
            if self.ready():
                return 200, b"ok\n", TEXT
            return 503, f"state {self.health.state}\n".encode(), TEXT
        if path == "/metrics":
            return 200, self.metrics.render(), CONTENT_TYPE_LATEST
        return 404, b"not found\n", TEXT

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.timeout)
            except TimeoutError:
                self.timed_out_connections += 1
                return
            except asyncio.LimitOverrunError:
                await self._refuse_oversized(reader, writer)
                return
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            parts = head.split(b"\r\n", 1)[0].split()
            if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
                writer.write(_response(400, b"bad request\n", TEXT, head_only=False))
            elif parts[0] not in (b"GET", b"HEAD"):
                writer.write(_response(405, b"only GET and HEAD\n", TEXT, head_only=False))
            else:
                code, body, ctype = self.route(parts[1].decode("latin-1"))
                writer.write(_response(code, body, ctype, head_only=parts[0] == b"HEAD"))
        finally:
            with contextlib.suppress(TimeoutError, ConnectionError):
                await asyncio.wait_for(writer.drain(), self.timeout)
            writer.close()

    async def _refuse_oversized(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """414 when the request line alone passes the limit, 431 when the headers do; then close our side and
        drop what the client still sends (bounded by ``timeout`` and ``MAX_DISCARD``): closing a socket with
        unread data sends a reset, and the client would lose the answer."""
        start = await reader.read(MAX_REQUEST_HEAD)  # buffered already: returns at once
        code = 431 if b"\r\n" in start else 414
        writer.write(_response(code, f"{_REASONS[code].lower()}\n".encode(), TEXT, head_only=False))
        end = time.monotonic() + self.timeout
        with contextlib.suppress(TimeoutError, ConnectionError):
            await asyncio.wait_for(writer.drain(), self.timeout)
            writer.write_eof()
            dropped = 0
            while dropped < MAX_DISCARD and (chunk := await asyncio.wait_for(reader.read(65536),
                                                                             end - time.monotonic())):
                dropped += len(chunk)

    def _evict_oldest_idle(self) -> bool:
        """Close the oldest idle connection and hand its slot over; False when none is idle."""
        while self._idle:
            serial = next(iter(self._idle))
            conn, writer = self._idle.pop(serial)
            if _has_data(conn):  # its request arrived but the loop has not read it yet: not idle
                continue
            self._evicted.add(serial)
            self.evicted_connections += 1
            self.open_connections -= 1
            writer.close()  # its read ends (EOF), the handler returns and does not release the slot
            return True
        return False

    async def _connection(self, conn: socket.socket, serial: int) -> None:
        try:
            loop = asyncio.get_running_loop()
            reader = _Reader(MAX_REQUEST_HEAD, lambda: self._idle.pop(serial, None))
            protocol = asyncio.StreamReaderProtocol(reader)
            transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock=conn)
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            if not reader.received and not reader.at_eof():
                self._idle[serial] = (conn, writer)
                self._room.set()  # an accepted connection may be waiting for one to evict
            await self._handle(reader, writer)
        except OSError:
            conn.close()
        finally:
            self._idle.pop(serial, None)
            if serial in self._evicted:
                self._evicted.discard(serial)
            else:
                self.open_connections -= 1
                self._room.set()

    async def _slot(self) -> None:
        """Wait until a connection may be opened: a free slot, or the slot of the oldest idle connection."""
        while self.open_connections >= self.max_connections and not self._evict_oldest_idle():
            self._room.clear()
            await self._room.wait()
        self.open_connections += 1
        self.peak_connections = max(self.peak_connections, self.open_connections)

    async def _accept(self) -> None:
        """Accept, then take a slot (at most one accepted connection waits for it; beyond it, connections
        wait in the kernel's backlog)."""
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()
        serial = 0
        try:
            while True:
                try:
                    conn, _ = await loop.sock_accept(self._sock)
                except OSError as exc:  # e.g. out of file descriptors: do not spin
                    log.warning("health server cannot accept a connection", extra={"error": str(exc)})
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
        self._stopping = asyncio.Event()
        accepting = asyncio.create_task(self._accept())
        self._started.set()
        await self._stopping.wait()
        accepting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await accepting

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        finally:
            self._started.set()
            loop.close()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="health-server", daemon=True)
            self._thread.start()
            self._started.wait()
            log.info("health server listening", extra={"url": self.url})

    def stop(self) -> None:
        if self._thread is not None:
            loop, stopping = self._loop, self._stopping
            if loop is not None and stopping is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # the loop ended meanwhile
                    loop.call_soon_threadsafe(stopping.set)
            self._thread.join(2.0)
            self._thread = None
        self._sock.close()

    def __enter__(self) -> HealthServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _response(code: int, body: bytes, content_type: str, *, head_only: bool) -> bytes:
    head = (f"HTTP/1.1 {code} {_REASONS.get(code, 'Unknown')}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode("latin-1") + (b"" if head_only else body)
