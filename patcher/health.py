"""Liveness, readiness and Prometheus metrics over one small threaded HTTP server.

``/healthz`` answers 200 while the agent loop keeps beating (a heartbeat younger than ``max_age`` seconds):
a stuck loop gets the container restarted. ``/readyz`` answers 200 only when the node's state is ``Ready``
and the loop is alive: it is the DaemonSet's readiness probe, so ``kubectl rollout status`` tells a human
that every scheduler restarted with the new config. ``/metrics`` serves a registry of its own (not the
process-global default) so tests and several agents in one process do not collide.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Final, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from patcher.kube.status import NodeState

log = logging.getLogger(__name__)

DEFAULT_LISTEN: Final = ":9808"
#: Seconds from the manifest write to the restarted scheduler seen Ready: a static pod restart takes seconds,
#: a slow image pull minutes, and the default restart timeout is 10 minutes.
RESTART_BUCKETS: Final = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)


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

    def restart_seen(self, seconds: float) -> None:
        """Record how long the scheduler took to come back after a write."""
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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    health: Health
    metrics: Renderable
    ready: Callable[[], bool]


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            alive = self.server.health.alive()
            self._reply(200 if alive else 503, b"ok\n" if alive else b"agent loop stalled\n")
        elif path == "/readyz":
            health = self.server.health
            ready = self.server.ready()
            body = b"ok\n" if ready else f"state {health.state}\n".encode()
            self._reply(200 if ready else 503, body)
        elif path == "/metrics":
            self._reply(200, self.server.metrics.render(), CONTENT_TYPE_LATEST)
        else:
            self._reply(404, b"not found\n")

    def _reply(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("health %s - " + format, self.address_string(), *args)


class HealthServer:
    """Serves ``/healthz``, ``/readyz`` and ``/metrics`` from a daemon thread.

    ``ready`` decides ``/readyz`` (default: the agent's state is Ready); the gatekeeper passes ``health.alive``
    because a standby replica is as ready as its leader.
    """

    def __init__(self, health: Health, metrics: Renderable, listen: str = DEFAULT_LISTEN,
                 ready: Callable[[], bool] | None = None) -> None:
        host, port = parse_listen(listen)
        server_class = _Server6 if ":" in host else _Server
        self._server = server_class((host, port), _Handler)
        self._server.health = health
        self._server.metrics = metrics
        self._server.ready = ready or health.ready
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = str(self._server.server_address[0])
        host = "127.0.0.1" if host in ("", "0.0.0.0") else host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="health-server", daemon=True
            )
            self._thread.start()
            log.info("health server on %s", self.url)

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(2.0)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> HealthServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
