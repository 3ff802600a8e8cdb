"""Liveness, readiness and Prometheus metrics, served by the one HTTP server (``httpserver``).

``/healthz`` (alias ``/livez``) answers 200 while the agent loop beats (a heartbeat younger than ``max_age``):
a stuck loop gets the container restarted. ``/readyz`` answers 200 only when the node is ``Ready`` and the loop
alive, so ``kubectl rollout status`` tells that every scheduler restarted with the new config. ``/metrics``
serves a registry of its own (tests and several agents in one process do not collide) with the process
collector, ``build_info`` and no ``_created`` series. prometheus_client is imported at the first scrape, off
the path from exec to the first manifest write.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Final, Protocol, cast

from patcher import __version__
from patcher.adapters.httpserver import HEAD_TIMEOUT, MAX_CONNECTIONS, REQUEST_TIMEOUT, TEXT, HttpServer
from patcher.core.status import NodeState

if TYPE_CHECKING:
    from types import ModuleType

    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from patcher.core.lifecycle import Counter

DEFAULT_LISTEN: Final = ":9808"
#: Seconds from the manifest write to the restarted scheduler seen Ready: a static pod restart takes seconds,
#: a slow image pull minutes, and the default restart timeout is 10 minutes.
RESTART_BUCKETS: Final = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
#: Seconds one extender took to answer the probe (or to fail it): milliseconds on a healthy loopback or LAN
#: extender, up to its ``httpTimeout`` (5 s unset, kube-scheduler's default) when it hangs.
PROBE_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def prometheus() -> ModuleType:
    """prometheus_client, imported on first use, with the ``_created`` series turned off (process-wide by
    its design; this process serves only our registries)."""
    import prometheus_client

    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    return prometheus_client


def add_process_info(registry: CollectorRegistry) -> None:
    """``process_*`` (what tells a memory limit being approached) and ``scheduler_patcher_build_info{version,
    python_version}`` (a dashboard joins any series to the version, the Kubernetes components' convention)."""
    import platform

    prom = prometheus()
    prom.ProcessCollector(registry=registry)
    info = prom.Gauge("build_info", "Always 1; the labels tell the build.", ["version", "python_version"],
                      namespace=_NAMESPACE, registry=registry)
    info.labels(version=__version__, python_version=platform.python_version()).set(1)


#: The agent's counters: ``lifecycle.Counter`` -> (name without the namespace, help).
_COUNTERS: Final = {
    "reconciled": ("reconciles", "Reconcile passes run."),
    "wrote": ("writes", "Manifest writes (patches applied)."),
    "restored": ("restores", "Manifest restores."),
    "rolled_back": ("rollbacks", "Rollbacks after a failed restart."),
}
_NAMESPACE: Final = "scheduler_patcher"
_ERRORS_HELP: Final = "Errors by kind."
_STATE_HELP: Final = "Current node state (1 for the current one, 0 for the others)."
_RESTART_HELP: Final = "Seconds from the manifest write to the restart seen."
_CONFIG_HELP: Final = "Always 1; the labels name the config the node should run (the Node's hash annotations)."
_PROBE_HELP: Final = "Seconds one extender took to answer the probe, or to fail it."
_UNREACHABLE_HELP: Final = "Extenders that did not answer the last probe, by whether the config marks them ignorable."
#: The 0/1 gauges: name without the namespace -> help.
_FLAGS: Final = {
    "source_refused": "1 while the last plan refused the source config (invalid), else 0.",
    "config_missing": ("1 while kube-scheduler's --config names a file that is not on the node and the agent does "
                       "not write it back (its next start fails), else 0."),
    "held": "1 while an operator holds the node (its hold annotation): the agent writes nothing there, else 0.",
}
#: The states of the record (the one-hot gauge's fixed labels); ``Held`` is said on the Node, and by its own gauge.
PHASES: Final = tuple(s.value for s in NodeState if s is not NodeState.HELD)


class _Histogram:
    """Observations per bucket and their sum, as plain numbers (``Metrics`` holds its lock around every call)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # observations per bucket (the last: +Inf)
        self.total = 0.0

    def observe(self, value: float) -> None:
        value = max(0.0, value)
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bound >= value, else +Inf
        self.total += value

    def family(self, name: str, help_text: str) -> Metric:
        """The histogram family prometheus_client's own Histogram renders: cumulative buckets, ``le`` as Go
        formats floats."""
        prom = prometheus()
        go = prom.utils.floatToGoString
        cumulative = [(go(bound), float(running))
                      for bound, running in zip((*self.bounds, float("inf")), accumulate(self.counts), strict=True)]
        family: Metric = prom.metrics_core.HistogramMetricFamily(name, help_text, buckets=cumulative,
                                                                 sum_value=self.total)
        return family


class Metrics:
    """The agent's Prometheus metrics; every method is thread-safe and cheap. Plain numbers under one lock,
    rendered through prometheus_client's metric families at a scrape (``render``), as its own Counter, Gauge and
    Histogram render them: the library's imports come with the first scrape, not before the first write."""

    def __init__(self) -> None:
        self._registry: CollectorRegistry | None = None
        self._registry_lock = threading.Lock()  # building the registry collects once: not under ``_lock``
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(_COUNTERS, 0.0)
        self._errors: dict[str, float] = {}
        self._state = dict.fromkeys(PHASES, 0.0)
        self._restart = _Histogram(RESTART_BUCKETS)
        self._probe = _Histogram(PROBE_BUCKETS)
        self._unreachable = {"false": 0.0, "true": 0.0}  # by ``ignorable``: both series always exist
        self._flags = dict.fromkeys(_FLAGS, 0.0)
        self._config: tuple[str, str] = ("", "")  # (config_hash, source_hash); empty: no series

    @property
    def registry(self) -> CollectorRegistry:
        """The registry ``/metrics`` renders, built on first use: our collector, then the process collector and
        ``build_info``."""
        with self._registry_lock:
            if self._registry is None:
                registry = prometheus().CollectorRegistry(auto_describe=True)
                registry.register(self)  # prometheus_client calls ``collect`` at every scrape
                add_process_info(registry)
                self._registry = registry
            return self._registry

    def count(self, name: Counter) -> None:
        with self._lock:
            self._counts[name] += 1.0

    def error(self, kind: str) -> None:
        """Count one error of ``kind`` (e.g. ``manifest``, ``api``, ``annotations``, ``event``, ``watch``)."""
        with self._lock:
            self._errors[kind] = self._errors.get(kind, 0.0) + 1.0

    def restart_seen(self, seconds: float | None) -> None:
        """How long the scheduler took to come back after a write; ``None``: not verified (no API and no local
        check), nothing to record."""
        if seconds is None:
            return
        with self._lock:
            self._restart.observe(seconds)

    def extenders_probed(self, seconds: Iterable[float], unreachable: int, unreachable_ignorable: int) -> None:
        """One probe round: each extender's time, and how many did not answer (held until the next round: an
        alert can wait for an outage to last)."""
        with self._lock:
            for value in seconds:
                self._probe.observe(value)
            self._unreachable = {"false": float(unreachable), "true": float(unreachable_ignorable)}

    def source_refused(self, refused: bool) -> None:
        """Whether the last plan refused the source config: a bad ConfigMap edit, which nothing retries until
        the ConfigMap changes again."""
        with self._lock:
            self._flags["source_refused"] = 1.0 if refused else 0.0

    def config_missing(self, missing: bool) -> None:
        """Whether the last plan found kube-scheduler's ``--config`` naming a missing file that it does not write
        back: the next start fails."""
        with self._lock:
            self._flags["config_missing"] = 1.0 if missing else 0.0

    def set_held(self, held: bool) -> None:
        """Whether an operator holds the node: an alert can say how long a hold has lasted."""
        with self._lock:
            self._flags["held"] = 1.0 if held else 0.0

    def set_config(self, config_hash: str, source_hash: str) -> None:
        """The config the node should run, as its ``config-hash``/``source-hash`` annotations say (empty: none):
        a dashboard shows which config runs without reading Node objects."""
        with self._lock:
            self._config = (config_hash, source_hash)

    def set_state(self, state: str) -> None:
        """Make ``state`` the one-hot current state (the label set is fixed up front, so no series vanish)."""
        with self._lock:
            for known in PHASES:
                self._state[known] = 1.0 if known == state else 0.0
            if state not in PHASES:
                self._state[state] = 1.0

    def collect(self) -> list[Metric]:
        """Our series, as prometheus_client's metric families (in the order the registry renders them)."""
        core = prometheus().metrics_core
        with self._lock:
            counts, errors, state = dict(self._counts), dict(self._errors), dict(self._state)
            restart = self._restart.family(f"{_NAMESPACE}_restart_seconds", _RESTART_HELP)
            probe = self._probe.family(f"{_NAMESPACE}_extender_probe_seconds", _PROBE_HELP)
            unreachable, flags, (config_hash, source_hash) = dict(self._unreachable), dict(self._flags), self._config
        out: list[Metric] = [core.CounterMetricFamily(f"{_NAMESPACE}_{name}", help_text, value=counts[attr])
                             for attr, (name, help_text) in _COUNTERS.items()]
        out += [_labelled(core.CounterMetricFamily, "errors", _ERRORS_HELP, ["kind"], errors),
                _labelled(core.GaugeMetricFamily, "state", _STATE_HELP, ["state"], state), restart,
                _labelled(core.GaugeMetricFamily, "config_info", _CONFIG_HELP, ["config_hash", "source_hash"],
                          {(config_hash, source_hash): 1.0} if config_hash else {}), probe,
                _labelled(core.GaugeMetricFamily, "extenders_unreachable", _UNREACHABLE_HELP, ["ignorable"],
                          unreachable)]
        out += [core.GaugeMetricFamily(f"{_NAMESPACE}_{name}", _FLAGS[name], value=value)
                for name, value in flags.items()]
        return out

    def render(self) -> bytes:
        """The exposition text of this registry (the first call imports prometheus_client)."""
        data: bytes = prometheus().generate_latest(self.registry)
        return data


def _labelled(kind: Callable[..., Any], name: str, help_text: str, labels: list[str],
              values: Mapping[Any, float]) -> Metric:
    """A family of one series per label value (a tuple of them for several labels)."""
    family: Any = kind(f"{_NAMESPACE}_{name}", help_text, labels=labels)
    for key, value in values.items():
        family.add_metric(list(key) if isinstance(key, tuple) else [key], value)
    return cast("Metric", family)


class Health:
    """Heartbeat and state shared between the agent loop and the probe handlers."""

    def __init__(self, max_age: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age = max_age
        self._clock = clock
        self._lock = threading.Lock()
        self._beat: float | None = None
        self._state: str = str(NodeState.PENDING)

    def beat(self) -> None:
        """Called by the loop on every pass (and while idle) to show it is alive."""
        with self._lock:
            self._beat = self._clock()

    def set_state(self, state: str) -> None:
        """Record the node state (``/readyz``; the state gauge is ``Metrics.set_state``'s)."""
        with self._lock:
            self._state = str(state)

    @property
    def state(self) -> str:
        with self._lock:
            return self._state

    def alive(self) -> bool:
        with self._lock:
            return self._beat is not None and self._clock() - self._beat <= self.max_age

    def ready(self) -> bool:
        return self.alive() and self.state == NodeState.READY


class Renderable(Protocol):
    """Anything that renders Prometheus text: the agent's Metrics, the gatekeeper's GateMetrics."""

    def render(self) -> bytes: ...


class HealthServer(HttpServer):
    """``/healthz`` (alias ``/livez``), ``/readyz`` and ``/metrics`` on ``listen``, GET and HEAD only. ``ready``
    decides ``/readyz`` (default: the agent's state is Ready; the gatekeeper's: alive, a standby is as ready)."""

    def __init__(self, health: Health, metrics: Renderable, listen: str = DEFAULT_LISTEN,
                 ready: Callable[[], bool] | None = None, *, max_connections: int = MAX_CONNECTIONS,
                 timeout: float = REQUEST_TIMEOUT, head_timeout: float = HEAD_TIMEOUT) -> None:
        super().__init__(self.route, listen, max_connections=max_connections, timeout=timeout,
                         head_timeout=head_timeout, name="health server")
        self.health = health
        self.metrics = metrics
        self.ready = ready or health.ready

    def route(self, method: str, path: str, body: bytes) -> tuple[int, bytes, str]:
        if method not in ("GET", "HEAD"):
            return 405, b"only GET and HEAD\n", TEXT
        path = path.split("?", 1)[0]
        if path in ("/healthz", "/livez"):
            return (200, b"ok\n", TEXT) if self.health.alive() else (503, b"agent loop stalled\n", TEXT)
        if path == "/readyz":
            if self.ready():
                return 200, b"ok\n", TEXT
            return 503, f"state {self.health.state}\n".encode(), TEXT
        if path == "/metrics":
            return 200, self.metrics.render(), prometheus().CONTENT_TYPE_LATEST
        return 404, b"not found\n", TEXT
