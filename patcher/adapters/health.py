"""Liveness, readiness and Prometheus metrics over one small asyncio HTTP server.

``/healthz`` (alias ``/livez``) answers 200 while the agent loop keeps beating (a heartbeat younger than
``max_age`` seconds): a stuck loop gets the container restarted. ``/readyz`` answers 200 only when the node's
state is ``Ready`` and the loop is alive: it is the DaemonSet's readiness probe, so ``kubectl rollout status``
tells a human that every scheduler restarted with the new config. ``/metrics`` serves a registry of its own
(not the process-global default) so tests and several agents in one process do not collide; it carries the
process collector and a ``build_info`` gauge, and no ``_created`` series (they double the series count for
nothing a dashboard uses).

Neither asyncio nor prometheus_client is imported with this module (their imports would be on the path from
exec to the first manifest write): the server's thread imports asyncio once it is woken
(``HealthServer.wake``, or a connection that arrives first), and the metrics reach prometheus_client at the
first scrape of ``/metrics`` (``Metrics.render``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Final, Protocol

from patcher import __version__
from patcher.core.status import NodeState

if TYPE_CHECKING:
    import asyncio
    from types import ModuleType

    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from patcher.adapters.streams import HeadReader

log = logging.getLogger(__name__)

DEFAULT_LISTEN: Final = ":9808"
#: Seconds from the manifest write to the restarted scheduler seen Ready: a static pod restart takes seconds,
#: a slow image pull minutes, and the default restart timeout is 10 minutes.
RESTART_BUCKETS: Final = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
#: Seconds one extender took to answer the probe (or to fail it): milliseconds on a healthy loopback or LAN
#: extender, up to its ``httpTimeout`` (5 s unset, kube-scheduler's default) when it hangs.
PROBE_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Connections the kernel queues while the loop is busy (Linux caps it at net.core.somaxconn).
BACKLOG: Final = 1024
#: Open connections at once (a few KB each). At the cap a new connection closes the oldest idle one (no byte
#: of a request received yet); when none is idle it waits in the backlog until one closes.
MAX_CONNECTIONS: Final = 256
#: Seconds a connection has to send its request head (and to take the answer): a probe sends it at once, so
#: only idle and half-open connections reach it, and they are closed instead of held forever.
REQUEST_TIMEOUT: Final = 5.0
#: Seconds from a request's first byte to the end of its head: a probe or a scraper sends its head in one
#: segment, so a head still unfinished after this is a client holding a slot, and is closed to free it.
HEAD_TIMEOUT: Final = 1.0
#: A request head larger than this is refused (probes and scrapers send a few hundred bytes): 414 when its
#: request line alone is longer, 431 otherwise.
MAX_REQUEST_HEAD: Final = 8192
#: After refusing an oversized head, bytes of it still read and dropped (within ``timeout``) before closing,
#: so that the client reads the answer instead of a reset caused by its own unread request.
MAX_DISCARD: Final = 1 << 20
TEXT: Final = "text/plain; charset=utf-8"


def prometheus() -> ModuleType:
    """prometheus_client, imported on first use, with the ``_created`` series turned off (process-wide by
    its design; this process serves only our registries)."""
    import prometheus_client

    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    return prometheus_client


def add_process_info(registry: CollectorRegistry, namespace: str = "scheduler_patcher") -> None:
    """``process_*`` (CPU, memory, open fds, start time) and ``<namespace>_build_info{version,python_version}``.

    The process collector is what tells a memory limit being approached; build_info lets a dashboard join
    any series to the version that produced it, the Kubernetes components' convention.
    """
    import platform

    prom = prometheus()
    prom.ProcessCollector(registry=registry)
    info = prom.Gauge("build_info", "Always 1; the labels tell the build.", ["version", "python_version"],
                      namespace=namespace, registry=registry)
    info.labels(version=__version__, python_version=platform.python_version()).set(1)


#: The agent's counters: attribute -> (name without the namespace, help).
_COUNTERS: Final = {
    "reconciles": ("reconciles", "Reconcile passes run."),
    "writes": ("writes", "Manifest writes (patches applied)."),
    "restores": ("restores", "Manifest restores."),
    "rollbacks": ("rollbacks", "Rollbacks after a failed restart."),
}
_NAMESPACE: Final = "scheduler_patcher"
_ERRORS_HELP: Final = "Errors by kind."
_STATE_HELP: Final = "Current node state (1 for the current one, 0 for the others)."
_RESTART_HELP: Final = "Seconds from the manifest write to the restart seen."
_CONFIG_HELP: Final = "Always 1; the labels name the config the node should run (the Node's hash annotations)."
_PROBE_HELP: Final = "Seconds one extender took to answer the probe, or to fail it."
_UNREACHABLE_HELP: Final = "Extenders that did not answer the last probe, by whether the config marks them ignorable."
_REFUSED_HELP: Final = "1 while the last plan refused the source config (invalid), else 0."
_MISSING_HELP: Final = ("1 while kube-scheduler's --config names a file that is not on the node and the agent does "
                        "not write it back (its next start fails), else 0.")
#: The states of the record (the one-hot gauge's fixed labels); ``Held`` is said on the Node, and by its own gauge.
PHASES: Final = tuple(s.value for s in NodeState if s is not NodeState.HELD)
_HELD_HELP: Final = "1 while an operator holds the node (its hold annotation): the agent writes nothing there, else 0."


class _Histogram:
    """Observations per bucket and their sum, as plain numbers (``Metrics`` holds its lock around every call)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # observations per bucket (the last: +Inf)
        self.total = 0.0

    def observe(self, value: float) -> None:
        value = max(0.0, value)
        self.counts[next((i for i, bound in enumerate(self.bounds) if value <= bound), len(self.bounds))] += 1
        self.total += value

    def family(self, name: str, help_text: str) -> Metric:
        """The histogram family prometheus_client's own Histogram renders: cumulative buckets, ``le`` as Go
        formats floats."""
        prom = prometheus()
        go = prom.utils.floatToGoString
        running = 0
        cumulative: list[tuple[str, float]] = []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            cumulative.append((go(bound), float(running)))
        family: Metric = prom.metrics_core.HistogramMetricFamily(name, help_text, buckets=cumulative,
                                                                 sum_value=self.total)
        return family


class Metrics:
    """The agent's Prometheus metrics; every method is thread-safe and cheap.

    The values are plain numbers here, under one lock; prometheus_client sees them only when ``/metrics`` is
    scraped (``render``, through a collector of ours): the agent counts from its first reconcile on, and the
    library's imports come with the first scrape, not before the first write. The text is the one
    prometheus_client's own Counter, Gauge and Histogram give for the same calls (tests/component/test_health.py).
    """

    def __init__(self, registry: CollectorRegistry | None = None,
                 states: Iterable[str] = PHASES) -> None:
        self._given = registry
        self._registry: CollectorRegistry | None = None
        self._registry_lock = threading.Lock()  # building the registry collects once: not under ``_lock``
        self._lock = threading.Lock()
        self._states = tuple(str(s) for s in states)
        self._counts = dict.fromkeys(_COUNTERS, 0.0)
        self._errors: dict[str, float] = {}
        self._state = dict.fromkeys(self._states, 0.0)
        self._restart = _Histogram(RESTART_BUCKETS)
        self._probe = _Histogram(PROBE_BUCKETS)
        self._unreachable = {"false": 0.0, "true": 0.0}  # by ``ignorable``: both series always exist
        self._refused = 0.0
        self._missing = 0.0
        self._held = 0.0
        self._config: tuple[str, str] = ("", "")  # (config_hash, source_hash); empty: no series

    @property
    def registry(self) -> CollectorRegistry:
        """The registry ``/metrics`` renders (the one given, or a new one), built on first use: our collector,
        then the process collector and ``build_info``."""
        with self._registry_lock:
            if self._registry is None:
                registry = self._given
                if registry is None:
                    registry = prometheus().CollectorRegistry(auto_describe=True)
                registry.register(_Collector(self))
                add_process_info(registry)
                self._registry = registry
            return self._registry

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1.0

    def reconciled(self) -> None:
        self._count("reconciles")

    def wrote(self) -> None:
        self._count("writes")

    def restored(self) -> None:
        self._count("restores")

    def rolled_back(self) -> None:
        self._count("rollbacks")

    def error(self, kind: str) -> None:
        """Count one error of ``kind`` (e.g. ``manifest``, ``api``, ``annotations``, ``event``, ``watch``)."""
        with self._lock:
            self._errors[kind] = self._errors.get(kind, 0.0) + 1.0

    def restart_seen(self, seconds: float | None) -> None:
        """Record how long the scheduler took to come back after a write; ``None``: the restart was not verified
        (no API and no local check), so there is no duration to record and the histogram is left alone."""
        if seconds is None:
            return
        with self._lock:
            self._restart.observe(seconds)

    def extenders_probed(self, seconds: Iterable[float], unreachable: int, unreachable_ignorable: int) -> None:
        """One probe round (pre-flight, after the restart, or periodic while Ready): each extender's time, and
        how many did not answer. The gauges hold until the next round: an alert can wait for an outage to last."""
        with self._lock:
            for value in seconds:
                self._probe.observe(value)
            self._unreachable = {"false": float(unreachable), "true": float(unreachable_ignorable)}

    def source_refused(self, refused: bool) -> None:
        """Whether the last plan refused the source config: a bad ConfigMap edit, which nothing retries until
        the ConfigMap changes again."""
        with self._lock:
            self._refused = 1.0 if refused else 0.0

    def config_missing(self, missing: bool) -> None:
        """Whether the last plan found kube-scheduler's ``--config`` naming a missing file that it does not write
        back (another prefix's or a foreign config; a source refused or known bad): the next start fails."""
        with self._lock:
            self._missing = 1.0 if missing else 0.0
    def set_held(self, held: bool) -> None:
        """Whether an operator holds the node: an alert can say how long a hold has lasted."""
        with self._lock:
            self._held = 1.0 if held else 0.0

    def set_config(self, config_hash: str, source_hash: str) -> None:
        """The config the node should run, as its ``config-hash``/``source-hash`` annotations say (empty: none,
        e.g. ``Restored``): a dashboard shows per node which config runs without reading Node objects."""
        with self._lock:
            self._config = (config_hash, source_hash)

    def set_state(self, state: str) -> None:
        """Make ``state`` the one-hot current state (the label set is fixed up front, so no series vanish)."""
        with self._lock:
            for known in self._states:
                self._state[known] = 1.0 if known == state else 0.0
            if state not in self._states:
                self._state[state] = 1.0

    def families(self) -> list[Metric]:
        """Our series, as prometheus_client's metric families (in the order the registry renders them)."""
        core = prometheus().metrics_core
        with self._lock:
            counts, errors, state = dict(self._counts), dict(self._errors), dict(self._state)
            restart = self._restart.family(f"{_NAMESPACE}_restart_seconds", _RESTART_HELP)
            probe = self._probe.family(f"{_NAMESPACE}_extender_probe_seconds", _PROBE_HELP)
            unreachable, refused, (config_hash, source_hash) = dict(self._unreachable), self._refused, self._config
            missing = self._missing
            held = self._held
        out: list[Metric] = []
        for attr, (name, help_text) in _COUNTERS.items():
            out.append(core.CounterMetricFamily(f"{_NAMESPACE}_{name}", help_text, value=counts[attr]))
        errors_family = core.CounterMetricFamily(f"{_NAMESPACE}_errors", _ERRORS_HELP, labels=["kind"])
        for kind, count in errors.items():
            errors_family.add_metric([kind], count)
        out.append(errors_family)
        state_family = core.GaugeMetricFamily(f"{_NAMESPACE}_state", _STATE_HELP, labels=["state"])
        for name, value in state.items():
            state_family.add_metric([name], value)
        out.append(state_family)
        out.append(restart)
        config_family = core.GaugeMetricFamily(f"{_NAMESPACE}_config_info", _CONFIG_HELP,
                                               labels=["config_hash", "source_hash"])
        if config_hash:
            config_family.add_metric([config_hash, source_hash], 1.0)
        out.append(config_family)
        out.append(probe)
        unreachable_family = core.GaugeMetricFamily(f"{_NAMESPACE}_extenders_unreachable", _UNREACHABLE_HELP,
                                                    labels=["ignorable"])
        for ignorable, count in unreachable.items():
            unreachable_family.add_metric([ignorable], count)
        out.append(unreachable_family)
        out.append(core.GaugeMetricFamily(f"{_NAMESPACE}_source_refused", _REFUSED_HELP, value=refused))
        out.append(core.GaugeMetricFamily(f"{_NAMESPACE}_config_missing", _MISSING_HELP, value=missing))
        out.append(core.GaugeMetricFamily(f"{_NAMESPACE}_held", _HELD_HELP, value=held))
        return out

    def render(self) -> bytes:
        """The exposition text of this registry (the first call imports prometheus_client)."""
        data: bytes = prometheus().generate_latest(self.registry)
        return data


class _Collector:
    """The bridge from ``Metrics`` to its registry: prometheus_client calls ``collect`` at every scrape."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self._metrics.families()


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
    its request head within ``timeout`` seconds, and finish it within ``head_timeout`` of its first byte
    (half-open and half-sent connections are closed, not kept forever), and at most ``max_connections`` are
    open at once, so memory stays bounded. At the cap, a new connection closes the oldest idle one (connected,
    its request head not complete: nothing sent, or a part of a head, as in the kernel and the loop): slow
    clients holding connections open, silent or half-way through a head, cannot keep a probe waiting for their
    timeout. A connection whose head is complete is never evicted; when every open one's is, new ones wait in
    the backlog. A head over
    ``MAX_REQUEST_HEAD`` gets 414 (request line) or 431 (headers) and the connection is closed. Each
    connection carries one request (``Connection: close``), which is what probes and Prometheus handle.

    ``ready`` decides ``/readyz`` (default: the agent's state is Ready); the gatekeeper passes ``health.alive``
    because a standby replica is as ready as its leader.

    ``start(deferred=True)`` (the agent's case) lets the thread wait, before it imports asyncio (which
    would share the interpreter with the agent's first reconcile), until ``wake`` is called or a connection
    arrives: the socket listens from the constructor on, so the kernel queues a probe meanwhile, and the first
    one wakes the server itself.
    """

    def __init__(self, health: Health, metrics: Renderable, listen: str = DEFAULT_LISTEN,
                 ready: Callable[[], bool] | None = None, *, backlog: int = BACKLOG,
                 max_connections: int = MAX_CONNECTIONS, timeout: float = REQUEST_TIMEOUT,
                 head_timeout: float = HEAD_TIMEOUT) -> None:
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
        self.head_timeout = head_timeout
        self.open_connections = 0
        self.peak_connections = 0  # the most open at once: never above max_connections
        self.timed_out_connections = 0  # no complete request head within the timeout (or the head's)
        self.evicted_connections = 0  # idle ones closed to make room for a new connection at the cap
        # idle connections (head not complete), oldest first: serial -> (socket, writer); the end of a request's
        # head takes one out
        self._idle: dict[int, tuple[socket.socket, asyncio.StreamWriter]] = {}
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
            return 200, self.metrics.render(), prometheus().CONTENT_TYPE_LATEST
        return 404, b"not found\n", TEXT

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

    async def _handle(self, reader: HeadReader, writer: asyncio.StreamWriter) -> None:
        import asyncio

        try:
            try:
                head = await self._read_head(reader)
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
        import asyncio

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
        """Close the oldest idle connection (its head not complete) and hand its slot over; False when none is."""
        for serial, (conn, writer) in list(self._idle.items()):
            if _has_data(conn):  # more of its request arrived, not read yet: it may be complete; not now
                continue
            del self._idle[serial]
            self._evicted.add(serial)
            self.evicted_connections += 1
            self.open_connections -= 1
            writer.close()  # its read ends (EOF), the handler returns and does not release the slot
            return True
        return False

    async def _connection(self, conn: socket.socket, serial: int) -> None:
        import asyncio

        from patcher.adapters.streams import HeadReader

        assert self._room is not None
        try:
            loop = asyncio.get_running_loop()
            reader = HeadReader(MAX_REQUEST_HEAD, lambda: self._idle.pop(serial, None))
            protocol = asyncio.StreamReaderProtocol(reader)
            transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock=conn)
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            if not reader.head_done and not reader.at_eof():
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
        assert self._room is not None
        while self.open_connections >= self.max_connections and not self._evict_oldest_idle():
            self._room.clear()
            await self._room.wait()
        self.open_connections += 1
        self.peak_connections = max(self.peak_connections, self.open_connections)

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
        import asyncio

        self._room = asyncio.Event()
        self._stopping = asyncio.Event()
        if self._stop_requested:  # stop() came before the loop ran: it could not reach this event (see stop)
            self._started.set()
            return
        accepting = asyncio.create_task(self._accept())
        self._started.set()
        await self._stopping.wait()
        accepting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await accepting

    def _run(self) -> None:
        if self._wake_pipe is not None:
            self._wait_for_wake(self._wake_pipe[0])
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

    def _wait_for_wake(self, wake_fd: int) -> None:
        """Block until ``wake`` or ``stop`` writes to the pipe, or a connection waits in the backlog."""
        select.select([self._sock.fileno(), wake_fd], [], [])

    def start(self, *, deferred: bool = False) -> None:
        """Serve from a thread. Without ``deferred``, return once the loop runs; with it, at once: the thread
        waits for ``wake`` or a first connection before it imports asyncio and serves (the class says why)."""
        if self._thread is None:
            if deferred:
                self._wake_pipe = os.pipe()
            self._thread = threading.Thread(target=self._run, name="health-server", daemon=True)
            self._thread.start()
            if not deferred:
                self._started.wait()
            log.info("health server listening", extra={"url": self.url})

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

    def __enter__(self) -> HealthServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _response(code: int, body: bytes, content_type: str, *, head_only: bool) -> bytes:
    head = (f"HTTP/1.1 {code} {_REASONS.get(code, 'Unknown')}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode("latin-1") + (b"" if head_only else body)
