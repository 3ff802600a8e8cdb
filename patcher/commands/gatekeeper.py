"""``scheduler-patcher gatekeeper``: release a scheduling gate once every scheduler runs the patched config.

A pod that must not be placed by a scheduler that does not know the extender yet is created with
``spec.schedulingGates: [{name: scheduler-patcher.io/extender-ready}]`` (KEP-3521, GA in 1.30): the scheduler
leaves it Pending until the gate is gone. The gatekeeper watches the cluster readiness verdict
(``patcher.core.readiness``, re-evaluated on every change of a control-plane Node's annotations and periodically)
and, while it is Ready for the expected config (``--expected-hash``, else the one every node agrees on),
removes exactly that gate from every Pending pod that
carries it — all namespaces or only ``--namespaces`` — including pods created later (a pod watch).

Safety rules, and why:

* Only our gate is removed; other gates and their order are left alone (another controller owns them).
* The patch is a JSON patch that first ``test``s the pod's whole current ``spec.schedulingGates`` array, then
  ``replace``s it with the same array minus our gate. A concurrent change (another controller removing its
  gate) makes the ``test`` fail (422) or the write conflict (409); the pod is read again and the patch rebuilt,
  so we never write back a stale list that would resurrect or reorder someone else's gates.
* While the verdict is not Ready nothing is released. A pod already released cannot be gated again: the API
  server only allows removing scheduling gates after creation, never adding them. So a verdict that falls
  back to NotReady (a node rolled back) stops further releases, but the pods already let through stay
  schedulable — that is the API's contract, not a choice of ours.
* One replica acts at a time: leader election with the ``coordination.k8s.io/v1`` Lease
  ``scheduler-patcher-gatekeeper``. A leader that cannot renew stops acting before its Lease can expire for
  the others (renew deadline < lease duration), so two replicas never release concurrently for long — and if
  they did, the ``test`` op makes their patches idempotent anyway.

RBAC: ``pods: list, watch, get, patch`` (cluster-wide, or per namespace with ``--namespaces``), ``nodes: list,
watch``, ``pods: get, list`` in the mirror-pod namespace, and ``leases: get, create, update`` in its own.
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from kubernetes import client as k8s
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from patcher.adapters import logs
from patcher.adapters.health import Health, HealthServer, add_process_info
from patcher.adapters.kube.backoff import Backoff
from patcher.adapters.kube.client import ApiConfigError, ClientSettings, build_api_client
from patcher.adapters.kube.cluster import collect
from patcher.adapters.kube.errors import ApiError, Conflict, Invalid, NotFound, api_json
from patcher.adapters.kube.lease import Lease, Outcome
from patcher.adapters.kube.listwatch import ListWatcher
from patcher.commands.readiness import add_verdict_arguments, verdict_kwargs
from patcher.core.kubeobj import Obj, dig
from patcher.core.readiness import ClusterVerdict, check_expected_hash, node_selectors
from patcher.core.status import annotation_snapshot
from patcher.core.timefmt import parse_rfc3339_ns

log = logging.getLogger(__name__)

DEFAULT_GATE: Final = "scheduler-patcher.io/extender-ready"
DEFAULT_LEASE: Final = "scheduler-patcher-gatekeeper"
DEFAULT_LISTEN: Final = ":9809"
JSON_PATCH: Final = "application/json-patch+json"
#: Re-reads of one pod after concurrent changes before giving up on it until the next pass.
MAX_CONFLICTS: Final = 5
#: Seconds a gated pod waited, from its creation to the release: seconds when the schedulers are already
#: Ready, a rollout's length (minutes) for pods created during one.
WAIT_BUCKETS: Final = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


# --- gates ---------------------------------------------------------------------------------------------


def gate_names(pod: Obj) -> list[str]:
    gates = dig(pod, "spec", "schedulingGates") or []
    return [str(g.get("name")) for g in gates if isinstance(g, dict)]


def waits_on(pod: Obj, gate: str) -> bool:
    """Whether ``pod`` is a Pending, live pod that carries ``gate``."""
    return (gate in gate_names(pod) and not dig(pod, "metadata", "deletionTimestamp")
            and dig(pod, "status", "phase") in (None, "", "Pending") and not dig(pod, "spec", "nodeName"))


def release_patch(pod: Obj, gate: str) -> list[Obj]:
    """The JSON patch that removes ``gate`` from ``pod`` only if its gates are still exactly what we read."""
    gates = dig(pod, "spec", "schedulingGates") or []
    kept = [g for g in gates if not (isinstance(g, dict) and g.get("name") == gate)]
    return [
        {"op": "test", "path": "/spec/schedulingGates", "value": gates},
        {"op": "replace", "path": "/spec/schedulingGates", "value": kept},
    ]


# --- metrics and probes -------------------------------------------------------------------------------


class GateMetrics:
    """The gatekeeper's Prometheus metrics, in a registry of its own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        kw: dict[str, Any] = {"namespace": "scheduler_patcher", "subsystem": "gatekeeper", "registry": self.registry}
        self._released = Counter("pods_released", "Pods whose scheduling gate was removed.", **kw)
        self._waiting = Gauge("gated_pods", "Pending pods that carry the gate.", **kw)
        self._waited = Histogram("wait_seconds", "Seconds from a gated pod's creation to its release.",
                                 buckets=WAIT_BUCKETS, **kw)
        self._conflicts = Counter("patch_conflicts", "Release patches refused because the pod changed meanwhile.",
                                  **kw)
        self._leader = Gauge("leader", "1 while this replica holds the gatekeeper Lease.", **kw)
        self._ready = Gauge("verdict_ready", "1 while the cluster readiness verdict is Ready.", **kw)
        add_process_info(self.registry)

    def released(self, waited_s: float | None) -> None:
        self._released.inc()
        if waited_s is not None:
            self._waited.observe(max(0.0, waited_s))

    def waiting(self, count: int) -> None:
        self._waiting.set(count)

    def conflict(self) -> None:
        self._conflicts.inc()

    def leader(self, value: bool) -> None:
        self._leader.set(1 if value else 0)

    def verdict_ready(self, value: bool) -> None:
        self._ready.set(1 if value else 0)

    def value(self, name: str) -> float:
        """A sample's current value (``0`` when absent): for tests and debugging."""
        return float(self.registry.get_sample_value(name) or 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


# --- leader election ----------------------------------------------------------------------------------


class LeaderElector:
    """Hold a ``coordination.k8s.io/v1`` Lease while alive; ``is_leader()`` says whether to act.

    client-go's algorithm, small: a Lease held by someone else counts as expired only when its record has not
    changed for ``lease_duration`` *as measured on our own clock* since we first saw that record, so skewed
    node clocks cannot make two replicas leaders. The leader renews every ``retry_period`` and considers
    itself leader only until ``renew_deadline`` after its last successful renewal — shorter than the lease
    duration, so it stops acting before anyone else may take over. Writes carry the resourceVersion that was
    read: of two replicas racing for an expired Lease, exactly one wins.
    """

    def __init__(
        self,
        api: k8s.ApiClient,
        *,
        namespace: str,
        identity: str,
        name: str = DEFAULT_LEASE,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if not 0 < retry_period < renew_deadline < lease_duration:
            raise ValueError("leader election needs 0 < retry period < renew deadline < lease duration")
        self._lease = Lease(api, namespace, name, identity, lease_duration, clock=clock, wall=wall)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._on_change = on_change
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._leader = False
        self._renewed = -math.inf
        self.holder: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def is_leader(self) -> bool:
        with self._lock:
            return self._leader and self._clock() - self._renewed < self.renew_deadline

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gatekeeper-lease", daemon=True)
            self._thread.start()

    def stop(self, *, release: bool = True, timeout: float = 3.0) -> None:
        """Stop renewing; with ``release`` hand the Lease back so a standby takes over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        was_leader = self.is_leader()
        self._set_leader(False)
        if release and was_leader:
            self._release()

    def _run(self) -> None:
        while not self._stop.is_set():
            # The renew deadline runs from before the request: an answer that arrives late must not extend it.
            attempted = self._clock()
            outcome = self._try_acquire_or_renew()
            now = self._clock()
            if outcome == "held":
                with self._lock:
                    self._renewed = attempted
                self._set_leader(True)
            elif outcome == "other" or now - self._renewed >= self.renew_deadline:
                self._set_leader(False)
            self._stop.wait(self.retry_period)

    def _set_leader(self, value: bool) -> None:
        with self._lock:
            changed, self._leader = self._leader != value, value
        if changed:
            log.info("gatekeeper lease %s/%s %s by %s", self.namespace, self.name,
                     "acquired" if value else "lost", self.identity)
            if self._on_change is not None:
                self._on_change(value)

    def _try_acquire_or_renew(self) -> str:
        """``held`` (we hold it now), ``other`` (someone else validly does) or ``error``."""
        outcome = self._lease.acquire_or_renew(deadline=self._clock() + self.renew_deadline)
        self.holder = self._lease.holder
        return {Outcome.HELD: "held", Outcome.OTHER: "other"}.get(outcome, "error")

    def _release(self) -> None:
        if self._lease.release(deadline=self._clock() + self.renew_deadline):
            log.info("gatekeeper lease %s/%s released by %s", self.namespace, self.name, self.identity)


# --- the gatekeeper -----------------------------------------------------------------------------------


class Gatekeeper:
    """Keeps a cache of gated pods (pod watch) and the verdict (Node watch), and releases when allowed.

    ``verdict_fn`` is usually ``lambda: collect(api, ...)``. ``namespaces`` empty means all namespaces.
    ``node_label_selectors`` (default: control-plane and legacy master labels) pick the Nodes whose annotation
    changes trigger a re-evaluation. Without an ``elector`` this replica always acts (one replica, or tests).
    """

    def __init__(
        self,
        api: k8s.ApiClient,
        *,
        verdict_fn: Callable[[], ClusterVerdict],
        gate_name: str = DEFAULT_GATE,
        namespaces: Sequence[str] = (),
        node_label_selectors: Sequence[str] | None = None,
        prefix: str = "scheduler-patcher.io/",
        elector: LeaderElector | None = None,
        metrics: GateMetrics | None = None,
        health: Health | None = None,
        resync_interval: float = 30.0,
        backoff: Backoff | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if not gate_name:
            raise ValueError("the gate name must not be empty")
        self._core = k8s.CoreV1Api(api)
        self.gate = gate_name
        self._verdict_fn = verdict_fn
        self._elector = elector
        self.metrics = metrics if metrics is not None else GateMetrics()
        self._health = health
        self._resync = resync_interval
        self._backoff = backoff if backoff is not None else Backoff(0.5, 30.0)
        self._wall = wall
        self._prefix = prefix
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pods: dict[tuple[str, str], Obj] = {}
        self._node_marks: dict[str, dict[str, str]] = {}
        self._verdict_stale = True
        self._next_resync = 0.0
        self._verdict_retry_at = 0.0
        self._release_retry_at = 0.0
        self._verdict_backoff = self._backoff.fresh()
        self._release_backoff = self._backoff.fresh()
        self.verdict: ClusterVerdict | None = None
        self._watchers: list[ListWatcher] = []
        wb = self._backoff.fresh()
        pending = "status.phase=Pending"  # the API server cannot select on schedulingGates: filter here
        if namespaces:
            for ns in namespaces:
                self._watchers.append(ListWatcher(
                    self._core.list_namespaced_pod, ns, field_selector=pending, name=f"watch pods ({ns})",
                    on_sync=functools.partial(self._pods_synced, ns), on_event=self._pod_event,
                    backoff=wb.fresh(), failure_level=logging.WARNING))
        else:
            self._watchers.append(ListWatcher(
                self._core.list_pod_for_all_namespaces, field_selector=pending, name="watch pods",
                on_sync=functools.partial(self._pods_synced, None), on_event=self._pod_event,
                backoff=wb.fresh(), failure_level=logging.WARNING))
        for sel in node_label_selectors if node_label_selectors is not None else node_selectors():
            self._watchers.append(ListWatcher(
                self._core.list_node, label_selector=sel, name=f"watch nodes ({sel})",
                on_sync=self._nodes_synced, on_event=self._node_event, backoff=wb.fresh(),
                failure_level=logging.WARNING))

    # -- watch callbacks (watcher threads) -------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def _pods_synced(self, scope: str | None, items: list[Obj]) -> None:
        with self._lock:
            for key in [k for k in self._pods if scope is None or k[0] == scope]:
                del self._pods[key]
            for pod in items:
                if waits_on(pod, self.gate):
                    self._pods[_key(pod)] = pod
        self.wake()

    def _pod_event(self, kind: str, pod: Obj) -> None:
        with self._lock:
            if kind != "DELETED" and waits_on(pod, self.gate):
                self._pods[_key(pod)] = pod
            elif self._pods.pop(_key(pod), None) is None:
                return  # not one of ours, before or after: nothing to do
        self.wake()

    def _nodes_synced(self, items: list[Obj]) -> None:
        with self._lock:
            for node in items:
                self._node_marks[str(dig(node, "metadata", "name"))] = annotation_snapshot(node, self._prefix)
            self._verdict_stale = True
        self.wake()

    def _node_event(self, kind: str, node: Obj) -> None:
        name = str(dig(node, "metadata", "name"))
        marks = annotation_snapshot(node, self._prefix)
        with self._lock:
            if kind == "MODIFIED" and self._node_marks.get(name) == marks:
                return  # a status heartbeat or a label we do not read: the verdict cannot have changed
            if kind == "DELETED":
                self._node_marks.pop(name, None)
            else:
                self._node_marks[name] = marks
            self._verdict_stale = True
        self.wake()

    # -- the loop --------------------------------------------------------------------------------------

    def start(self) -> None:
        for w in self._watchers:
            w.start()

    def stop(self) -> None:
        for w in self._watchers:
            w.stop()

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(w.wait_synced(max(0.0, deadline - time.monotonic())) for w in self._watchers)

    def waiting(self) -> list[Obj]:
        """The gated pods known right now."""
        with self._lock:
            return list(self._pods.values())

    def run(self, stop: threading.Event) -> None:
        """Loop until ``stop`` is set (set it, then ``wake()``, to end promptly)."""
        failures = Backoff(1.0, 30.0)
        while not stop.is_set():
            self._wake.clear()
            try:
                delay = self.step()
            except Exception:  # a bug must not end the loop silently; /healthz stops beating if it persists
                delay = failures.next_delay()
                log.exception("gatekeeper pass failed; next try in %.1fs", delay)
            else:
                failures.reset()
                if self._health is not None:
                    self._health.beat()
            self._wake.wait(delay)

    def step(self) -> float:
        """One pass: refresh the verdict if due, release what may be released; returns the time to sleep."""
        now = time.monotonic()
        with self._lock:
            due = (self._verdict_stale or now >= self._next_resync) and now >= self._verdict_retry_at
            if due:
                self._verdict_stale = False
        if due:
            self._refresh_verdict(now)
        pods = self.waiting()
        self.metrics.waiting(len(pods))
        leader = self._elector is None or self._elector.is_leader()
        self.metrics.leader(leader)
        if leader and self.verdict is not None and self.verdict.ready and pods and now >= self._release_retry_at:
            failed = False
            for pod in sorted(pods, key=_created):
                if self._elector is not None and not self._elector.is_leader():
                    break
                failed = not self._release(pod) or failed
            if failed:
                self._release_retry_at = time.monotonic() + self._release_backoff.next_delay()
            else:
                self._release_backoff.reset()
            pods = self.waiting()
            self.metrics.waiting(len(pods))
        wake_at = self._verdict_retry_at if self._verdict_retry_at > now else self._next_resync
        if pods and self._release_retry_at > now:
            wake_at = min(wake_at, self._release_retry_at)
        return min(self._resync, max(0.05, wake_at - time.monotonic()))

    def _refresh_verdict(self, now: float) -> None:
        before = self.verdict
        try:
            verdict = self._verdict_fn()
        except ApiError as exc:
            delay = self._verdict_backoff.next_delay()
            log.warning("cannot evaluate the readiness verdict (%s); nothing is released; retrying in %.1fs",
                        exc, delay)
            self.verdict = None
            with self._lock:
                self._verdict_stale = True
            self._verdict_retry_at = now + delay
            self.metrics.verdict_ready(False)
            return
        self._verdict_backoff.reset()
        self._verdict_retry_at = 0.0
        self._next_resync = now + self._resync
        self.verdict = verdict
        self.metrics.verdict_ready(verdict.ready)
        if before is None or before.ready != verdict.ready or before.explain() != verdict.explain():
            if verdict.ready:
                log.info("verdict %s: releasing gate %s", verdict.summary(), self.gate)
            else:
                log.info("verdict %s (%s): gate %s stays", verdict.summary(), "; ".join(verdict.explain()), self.gate)

    def _release(self, pod: Obj) -> bool:
        """Remove our gate from ``pod``; False when it should be tried again later (an API failure)."""
        ns, name = _key(pod)
        where = f"{ns}/{name}"
        for _ in range(MAX_CONFLICTS):
            if not waits_on(pod, self.gate):
                self._forget(pod)
                return True
            try:
                api_json(f"release pod {where}", self._core.patch_namespaced_pod, name, ns,
                         release_patch(pod, self.gate), _content_type=JSON_PATCH)
            except NotFound:
                self._forget(pod)
                return True
            except (Conflict, Invalid) as exc:  # the pod changed since we read it: read it again
                self.metrics.conflict()
                log.debug("pod %s changed while we released it (%s); reading it again", where, exc)
                try:
                    pod = api_json(f"read pod {where}", self._core.read_namespaced_pod, name, ns)
                except NotFound:
                    self._forget(pod)
                    return True
                except ApiError as read_exc:
                    log.warning("cannot read pod %s again: %s; retrying later", where, read_exc)
                    return False
                continue
            except ApiError as exc:
                log.warning("cannot release pod %s: %s; retrying later", where, exc)
                return False
            waited = _waited(pod, self._wall())
            self.metrics.released(waited)
            self._forget(pod)
            others = [g for g in gate_names(pod) if g != self.gate]
            log.info("released pod %s from gate %s", where, self.gate,
                     extra={"waited_s": round(waited, 1) if waited is not None else None,
                            "other_gates": ",".join(others) or None})
            return True
        log.warning("pod %s kept changing while we released it; trying again later", where)
        return False

    def _forget(self, pod: Obj) -> None:
        with self._lock:
            self._pods.pop(_key(pod), None)


def _key(pod: Obj) -> tuple[str, str]:
    return str(dig(pod, "metadata", "namespace") or ""), str(dig(pod, "metadata", "name") or "")


def _created(pod: Obj) -> str:
    return str(dig(pod, "metadata", "creationTimestamp") or "")


def _waited(pod: Obj, now: float) -> float | None:
    stamp = dig(pod, "metadata", "creationTimestamp")
    try:
        return now - parse_rfc3339_ns(stamp) / 1e9 if isinstance(stamp, str) else None
    except ValueError:
        return None


# --- command line -------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``scheduler-patcher gatekeeper``."""
    from patcher.commands.flags import Flags, boolean, duration

    add_verdict_arguments(p)
    f = Flags(p)
    f.add("--gate-name", DEFAULT_GATE, "the scheduling gate to remove (no other gate is ever touched)")
    f.add("--namespaces", "", "comma-separated namespaces to watch (default: all)")
    f.add("--namespace", os.environ.get("POD_NAMESPACE", "scheduler-patcher"), "namespace of the leader Lease")
    f.add("--leader-elect", "true", "hold a Lease so that one replica acts at a time", type=boolean)
    f.add("--lease-name", DEFAULT_LEASE, "name of the leader Lease")
    f.add("--identity", os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}",
          "this replica's name in the Lease")
    f.add("--lease-duration", "15s", "a leader that stopped renewing is replaced after this long", type=duration)
    f.add("--renew-deadline", "10s", "a leader that cannot renew for this long stops acting", type=duration)
    f.add("--retry-period", "2s", "how often the Lease is renewed or tried", type=duration)
    f.add("--resync-interval", "30s", "re-evaluate the verdict at least this often (mirror pods are not watched)",
          type=duration)
    f.add("--listen", DEFAULT_LISTEN, "address of /healthz, /readyz and /metrics")
    f.add("--log-format", "text", "log format", choices=["text", "json"])
    f.add("--log-level", "info", "log level", choices=["debug", "info", "warning", "error"])


def main(args: argparse.Namespace) -> int:
    """``scheduler-patcher gatekeeper``: run until SIGTERM/SIGINT; exit 0 then, 1 when it cannot start."""
    logs.setup(args.log_format, args.log_level)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %s: stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return run(args, stop)


def run(args: argparse.Namespace, stop: threading.Event) -> int:
    """The gatekeeper until ``stop`` is set (``main`` without signals and logging setup, for tests)."""
    kwargs = verdict_kwargs(args)
    try:
        check_expected_hash(kwargs["expected_hash"])
    except ValueError as exc:
        log.error("%s", exc)
        return 1
    try:
        api = build_api_client(ClientSettings(kubeconfig=args.kubeconfig))
    except ApiConfigError as exc:
        log.error("%s", exc)
        return 1
    metrics = GateMetrics()
    health = Health(max_age=max(60.0, 3 * args.resync_interval))
    gatekeeper: Gatekeeper | None = None
    elector: LeaderElector | None = None

    def leadership_changed(_leading: bool) -> None:
        if gatekeeper is not None:
            gatekeeper.wake()  # act (or stop acting) now, not at the next resync

    try:
        if args.leader_elect:
            elector = LeaderElector(api, namespace=args.namespace, name=args.lease_name, identity=args.identity,
                                    lease_duration=args.lease_duration, renew_deadline=args.renew_deadline,
                                    retry_period=args.retry_period,
                                    on_change=leadership_changed)
        gatekeeper = Gatekeeper(
            api, verdict_fn=lambda: collect(api, **kwargs), gate_name=args.gate_name,
            namespaces=[n.strip() for n in args.namespaces.split(",") if n.strip()],
            node_label_selectors=node_selectors(args.node_selector, args.legacy_master_label),
            prefix=args.annotation_prefix, elector=elector, metrics=metrics, health=health,
            resync_interval=args.resync_interval)
        server = HealthServer(health, metrics, args.listen, ready=health.alive)
    except (ValueError, OSError) as exc:
        log.error("cannot start the gatekeeper: %s", exc)
        api.close()
        return 1
    gk = gatekeeper

    def wake_on_stop() -> None:
        stop.wait()
        gk.wake()

    threading.Thread(target=wake_on_stop, name="gatekeeper-stop", daemon=True).start()
    server.start()
    if elector is not None:
        elector.start()
    gk.start()
    log.info("gatekeeper started", extra={"gate": gk.gate, "namespaces": args.namespaces or "*",
                                          "identity": args.identity if elector else None})
    try:
        gk.run(stop)
    finally:
        gk.stop()
        if elector is not None:
            elector.stop(release=True)
        server.stop()
        api.close()
    return 0
