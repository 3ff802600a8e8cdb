"""The gatekeeper: release a scheduling gate from Pending pods while the cluster readiness verdict is Ready.

``scheduler-patcher gatekeeper`` (``patcher.commands.gatekeeper``) runs it; the rules and why are in that
command's docstring. Here: a cache of gated pods (pod watch), the Node annotations behind the verdict (Node
watch), the loop that re-evaluates the verdict and releases, and its Prometheus metrics.

The verdict is read again when something it reads changes, as the watches see it: a control-plane Node's
annotations (the selector watches), a Node that only a kube-scheduler pod led to (an unlabelled control-plane
node: a watch of that Node by name, opened once a verdict names it), a kube-scheduler pod (the scheduler index).
The periodic resync (``resync_interval``, 5 minutes in the command) is a safety net only. The verdict is
``patcher.core.readiness`` read through ``patcher.adapters.kube.cluster``; the patch is ``patcher.core.gates``,
sent (and rebuilt after a conflict) by ``patcher.adapters.kube.gaterelease``; leadership is
``patcher.adapters.kube.leader``.

A backlog (thousands of pods gated while a scheduler was being patched) is drained by a bounded pool of
``concurrency`` workers taking turns from a ``Throttle`` (QPS/burst, and the server's ``429 Retry-After``),
oldest pods first (``core.gates.ReleaseFeed``); ``Gatekeeper._drain`` and ``_may_send`` say when the verdict
is checked and read again during a drain.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from patcher.adapters.health import Health, add_process_info
from patcher.adapters.kube.backoff import Backoff
from patcher.adapters.kube.cluster import node_watchers
from patcher.adapters.kube.errors import ApiError
from patcher.adapters.kube.gaterelease import GateOutcome, pending_pod_watchers, release_gate
from patcher.adapters.kube.leader import LeaderElector
from patcher.adapters.kube.listwatch import ListWatcher
from patcher.adapters.kube.schedindex import SchedulerIndex
from patcher.adapters.kube.throttle import Throttle
from patcher.adapters.kube.transport import NODES
from patcher.core.gates import DEFAULT_GATE, GatedPod, ReleaseFeed, waited_seconds
from patcher.core.kubeobj import Obj, dig
from patcher.core.readiness import ClusterVerdict, node_selectors
from patcher.core.status import annotation_snapshot

if TYPE_CHECKING:  # the API is reached through patcher.adapters.kube; the client here is a type only
    from patcher.adapters.kube.transport import Api

log = logging.getLogger(__name__)

#: Re-reads of one pod after concurrent changes before giving up on it until the next pass.
MAX_CONFLICTS: Final = 5
#: Seconds a gated pod waited, from its creation to the release: seconds when the schedulers are already
#: Ready, a rollout's length (minutes) for pods created during one.
WAIT_BUCKETS: Final = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
#: Release requests per second and how many may leave at once (client-go's QPS/Burst): a backlog of 10 000
#: pods drains in about five seconds; API Priority and Fairness answers 429 long before the server suffers,
#: and every 429 pauses the whole pool for the server's Retry-After.
DEFAULT_QPS: Final = 2000.0
DEFAULT_BURST: Final = 32
#: Batches of this many times the concurrency: the verdict is checked between two, and read again (its Node lists,
#: the labelled kube-scheduler pods and the unlabelled ones by name) when it may have changed (a watch dropped or
#: is down, the resync came due); a change a watch delivers is read before the next pod, batch or not.
BATCH_ROUNDS: Final = 4
#: The loop wakes at least this often (its /healthz beat), whatever the verdict's resync interval: a stuck loop is
#: seen within a few of these, not a few resyncs.
HEARTBEAT: Final = 30.0


class GateMetrics:
    """The gatekeeper's Prometheus metrics, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        kw: dict[str, Any] = {"namespace": "scheduler_patcher", "subsystem": "gatekeeper", "registry": self.registry}
        self._released = Counter("pods_released", "Pods whose scheduling gate was removed.", **kw)
        self.gated = Gauge("gated_pods", "Pending pods that carry the gate.", **kw)
        self._waited = Histogram("wait_seconds", "Seconds from a gated pod's creation to its release.",
                                 buckets=WAIT_BUCKETS, **kw)
        self.conflicts = Counter("patch_conflicts", "Release patches refused because the pod changed meanwhile.",
                                 **kw)
        self.throttled = Counter("throttled", "Requests the API server answered 429 (Too Many Requests).", **kw)
        self.batches = Counter("release_batches", "Batches of releases begun (the verdict is checked between two).",
                               **kw)
        self.leader = Gauge("leader", "1 while this replica holds the gatekeeper Lease.", **kw)
        self.ready = Gauge("verdict_ready", "1 while the cluster readiness verdict is Ready.", **kw)
        add_process_info(self.registry)

    def released(self, waited_s: float | None) -> None:
        self._released.inc()
        if waited_s is not None:
            self._waited.observe(max(0.0, waited_s))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class Gatekeeper:
    """Keeps a cache of gated pods (pod watch) and the verdict (Node watch), and releases when allowed.

    ``namespaces`` empty means all namespaces.
    ``node_label_selectors`` (default: control-plane and legacy master labels) pick the Nodes whose annotation
    changes trigger a re-evaluation. Without an ``elector`` this replica always acts (one replica, or tests).
    ``scheduler_names`` narrows the pod watch to pods of those schedulers (default: any).
    ``concurrency`` releases run at once (default: the throttle's burst), ``batch_size`` pods go between two
    checks whether the verdict may have changed (default: ``BATCH_ROUNDS`` times the concurrency).
    ``scheduler_index`` (the one ``verdict_fn`` reads) is started and stopped with the watches; give it
    ``schedulers_changed`` as its ``on_change``: a scheduler pod that came, went or changed makes the verdict
    stale, as a Node change does.
    """

    def __init__(
        self,
        api: Api,
        *,
        verdict_fn: Callable[[], ClusterVerdict],
        gate_name: str = DEFAULT_GATE,
        namespaces: Sequence[str] = (),
        node_label_selectors: Sequence[str] | None = None,
        prefix: str = "scheduler-patcher.io/",
        elector: LeaderElector | None = None,
        metrics: GateMetrics | None = None,
        health: Health | None = None,
        resync_interval: float = 300.0,
        backoff: Backoff | None = None,
        scheduler_names: Sequence[str] = (),
        throttle: Throttle | None = None,
        concurrency: int | None = None,
        batch_size: int | None = None,
        scheduler_index: SchedulerIndex | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.throttle = throttle if throttle is not None else Throttle(DEFAULT_QPS, DEFAULT_BURST)
        self.concurrency = concurrency if concurrency is not None else self.throttle.burst
        self.batch_size = batch_size if batch_size is not None else BATCH_ROUNDS * self.concurrency
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="gate-release")
        self._api = api
        self.gate = gate_name
        self._verdict_fn = verdict_fn
        self._elector = elector
        self.metrics = metrics if metrics is not None else GateMetrics()
        self._health = health
        self._resync = resync_interval
        self._backoff = backoff if backoff is not None else Backoff(0.5, 30.0)
        self._clock = clock
        self._prefix = prefix
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pods: dict[tuple[str, str], GatedPod] = {}
        #: The pods (by key) whose gate this replica removed, by uid, until the watch shows that: the API server
        #: refuses a gate added after creation, so an event that still shows ours on that uid is one from before
        #: the release, late (a watch behind a drain), not a pod to release again (a PATCH refused, a read).
        self._released: dict[tuple[str, str], str] = {}
        self._node_marks: dict[str, dict[str, str]] = {}
        self._verdict_stale = True
        #: The verdict watches' ``drops`` when the verdict in hand was read (-1: none read yet).
        self._drops_at_read = -1
        self._next_resync = 0.0
        self._verdict_retry_at = 0.0
        self._release_retry_at = 0.0
        self._verdict_backoff = self._backoff.fresh()
        self._release_backoff = self._backoff.fresh()
        self.verdict: ClusterVerdict | None = None
        self._index = scheduler_index
        self._node_selectors = list(node_label_selectors if node_label_selectors is not None else node_selectors())
        #: Nodes the selector watches follow; the verdict's other nodes get a watch by name each (``_by_name``).
        self._selected: set[str] = set()
        self._by_name: dict[str, ListWatcher] = {}
        self._running = False
        wb = self._backoff.fresh()
        self._node_watchers = node_watchers(api, self._node_selectors, on_sync=self._selected_synced,
                                            on_event=self._selected_event, backoff=wb, failure_level=logging.WARNING)
        self._watchers: list[ListWatcher] = [
            *pending_pod_watchers(api, namespaces, on_sync=self._pods_synced, on_event=self._pod_event, backoff=wb,
                                  scheduler_names=scheduler_names, failure_level=logging.WARNING),
            *self._node_watchers,
        ]

    # -- watch callbacks (watcher threads) -------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def schedulers_changed(self) -> None:
        """A kube-scheduler pod came, went or changed (the scheduler index's watch): read the verdict again."""
        with self._lock:
            self._verdict_stale = True
        self.wake()

    def _pods_synced(self, scope: str | None, items: list[GatedPod]) -> None:
        with self._lock:
            for key in [k for k in self._pods if scope is None or k[0] == scope]:
                del self._pods[key]
            for key in [k for k in self._released if scope is None or k[0] == scope]:
                del self._released[key]  # a list is read after the release: it shows the pod as it is now
            for pod in items:
                if pod.waits_on(self.gate):
                    self._pods[pod.key] = pod
        self.wake()

    def _pod_event(self, kind: str, pod: GatedPod) -> None:
        with self._lock:
            released = self._released.get(pod.key) == pod.uid
            if kind != "DELETED" and pod.waits_on(self.gate):
                if released:
                    return  # from before our release, late
                self._pods[pod.key] = pod
            else:
                if released:
                    del self._released[pod.key]  # the watch has caught up with the release
                if self._pods.pop(pod.key, None) is None:
                    return  # not one of ours, before or after: nothing to do
        self.wake()

    def _selected_synced(self, items: list[Obj]) -> None:
        with self._lock:
            self._selected.update(str(dig(n, "metadata", "name")) for n in items)
        self._nodes_synced(items)

    def _selected_event(self, kind: str, node: Obj) -> None:
        name = str(dig(node, "metadata", "name"))
        with self._lock:
            if kind == "DELETED":  # deleted, or no longer matches the selector (a label removed)
                self._selected.discard(name)
            else:
                self._selected.add(name)
        self._node_event(kind, node)

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
        if self._index is not None:
            self._index.start()
        for w in self._watchers:
            w.start()
        with self._lock:
            self._running = True

    def stop(self) -> None:
        with self._lock:
            self._running = False
            by_name, self._by_name = list(self._by_name.values()), {}
        for w in [*self._watchers, *by_name]:
            w.stop()
        if self._index is not None:
            self._index.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        synced = all(w.wait_synced(max(0.0, deadline - time.monotonic())) for w in self._watchers)
        return synced and (self._index is None or self._index.wait_fresh(max(0.0, deadline - time.monotonic())))

    def verdict_watches(self) -> tuple[bool, int]:
        """Whether every watch behind the verdict follows the server right now (the selector Node watches, the
        by-name ones, the scheduler index; False without an index), and the sum of their ``drops``."""
        with self._lock:
            watches = [*self._node_watchers, *self._by_name.values()]
        fresh = self._index is not None and self._index.fresh and all(w.fresh for w in watches)
        drops = (self._index.drops if self._index is not None else 0) + sum(w.drops for w in watches)
        return fresh, drops

    def _verdict_may_have_changed(self) -> bool:
        """Whether the verdict must be read again before the next batch: a watch behind it delivered a change
        (``_verdict_stale``), one lost its connection since the read or is down now, or the resync is due.

        A by-name watch that stops (the verdict no longer names its Node) takes its drops out of the sum, which
        then differs: one read more, never one less."""
        with self._lock:
            if self._verdict_stale:
                return True
        if self._clock() >= self._next_resync:
            return True
        fresh, drops = self.verdict_watches()
        return not fresh or drops != self._drops_at_read

    def waiting(self) -> list[GatedPod]:
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
        now = self._clock()
        with self._lock:
            due = (self._verdict_stale or now >= self._next_resync) and now >= self._verdict_retry_at
        if due:
            self._refresh_verdict(now)
        pods = self.waiting()
        self.metrics.gated.set(len(pods))
        leader = self._leading()
        self.metrics.leader.set(leader)
        if leader and self.verdict is not None and self.verdict.ready and pods and now >= self._release_retry_at:
            if self._drain(pods):  # some failed
                self._release_retry_at = self._clock() + self._release_backoff.next_delay()
            else:
                self._release_backoff.reset()
            pods = self.waiting()
            self.metrics.gated.set(len(pods))
        wake_at = self._verdict_retry_at if self._verdict_retry_at > now else self._next_resync
        if pods and self._release_retry_at > now:
            wake_at = min(wake_at, self._release_retry_at)
        return min(self._resync, HEARTBEAT, max(0.05, wake_at - self._clock()))

    def _refresh_verdict(self, now: float) -> None:
        before = self.verdict
        with self._lock:  # a change a watch delivers from here on makes it stale again: a read more, never less
            self._verdict_stale = False
        _, drops = self.verdict_watches()  # before the read: a drop during it is seen at the next check
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
            self.metrics.ready.set(False)
            return
        self._verdict_backoff.reset()
        self._verdict_retry_at = 0.0
        self._next_resync = now + self._resync
        self._drops_at_read = drops
        self.verdict = verdict
        self._follow_nodes(verdict)
        self.metrics.ready.set(verdict.ready)
        if before is None or before.ready != verdict.ready or before.explain() != verdict.explain():
            if verdict.ready:
                log.info("verdict %s: releasing gate %s", verdict.summary(), self.gate)
            else:
                log.info("verdict %s (%s): gate %s stays", verdict.summary(), "; ".join(verdict.explain()), self.gate)

    def _follow_nodes(self, verdict: ClusterVerdict) -> None:
        """Watch by name each Node of the verdict that no selector watch follows (a kube-scheduler pod led to
        it: an unlabelled control-plane node), so that its agent's annotations wake the verdict as a labelled
        node's do, not the next resync; stop watching the ones the verdict no longer names."""
        with self._lock:
            if not self._running:
                return
            wanted = {r.node for r in verdict.rows} - self._selected
            gone = [self._by_name.pop(n) for n in list(self._by_name) if n not in wanted]
            new = sorted(n for n in wanted if n not in self._by_name)
            for name in new:
                self._by_name[name] = ListWatcher(
                    self._api, NODES, field_selector=f"metadata.name={name}", name=f"watch node {name}",
                    on_sync=self._nodes_synced, on_event=self._node_event, backoff=self._backoff.fresh(),
                    failure_level=logging.WARNING)
            started = [self._by_name[n] for n in new]
        for w in gone:
            w.stop(0.0)
        for w in started:
            w.start()

    def _leading(self) -> bool:
        return self._elector is None or self._elector.is_leader()

    def _drain(self, pods: list[GatedPod]) -> bool:
        """Release ``pods``, oldest first; True when some failed (retry after a backoff).

        ``concurrency`` workers, each taking the next pod (``ReleaseFeed``) once its last release was answered,
        until none is left or ``_may_send`` says no: the pool stays busy across batch boundaries. Taking a pod,
        and the verdict read that may precede it, happen under one lock, so once the drain stops no release
        starts; the ones in flight (at most ``concurrency``) complete, and the rest waits for the next pass.
        """
        feed = ReleaseFeed(pods, self.batch_size)
        lock = threading.Lock()

        def work() -> bool:
            ok = True
            while True:
                with lock:
                    pod = feed.take(self._may_send)
                if pod is None:
                    return ok
                ok = self._release(pod) and ok

        workers = [self._pool.submit(work) for _ in range(min(self.concurrency, len(pods)))]
        concurrent.futures.wait(workers)
        results = [worker.result() for worker in workers]  # a bug in a release is raised here, all workers done
        self.metrics.batches.inc(feed.batches)
        if feed.stopped and feed.left:
            log.info("drain stopped (verdict %s%s): %d gated pods wait for the next pass",
                     self.verdict.summary() if self.verdict is not None else "unknown",
                     "" if self._leading() else ", leadership lost", feed.left)
        return not all(results)

    def _may_send(self, boundary: bool) -> bool:
        """Whether the drain's next pod may go (``ReleaseFeed.take`` asks under the drain's lock: no worker
        starts a release meanwhile): not once this replica leads no more; otherwise the verdict, read again
        first when a watch behind it delivered a change the verdict in hand has not seen, or, at a batch
        ``boundary``, when it may have changed in another way (``_verdict_may_have_changed``). A check that
        needs no read costs a few lookups, not a round trip."""
        if not self._leading():
            return False
        if self._verdict_may_have_changed() if boundary else self._verdict_stale:
            self._refresh_verdict(self._clock())
        return self.verdict is not None and self.verdict.ready

    def _release(self, pod: GatedPod) -> bool:
        """Remove our gate from ``pod``; False when it should be tried again later (an API failure)."""
        where = f"{pod.namespace}/{pod.name}"
        try:
            result = release_gate(self._api, pod, self.gate, attempts=MAX_CONFLICTS,
                                  on_conflict=self.metrics.conflicts.inc, throttle=self.throttle,
                                  on_throttled=self.metrics.throttled.inc)
        except ApiError as exc:
            log.warning("%s; retrying later", exc)
            return False
        if result.outcome is GateOutcome.KEPT_CHANGING:
            log.warning("pod %s kept changing while we released it; trying again later", where)
            return False
        with self._lock:
            cached = self._pods.get(pod.key)
            if cached is not None and cached.uid == pod.uid:  # not a new pod of the same name
                del self._pods[pod.key]
            if result.outcome is GateOutcome.RELEASED:
                self._released[pod.key] = pod.uid
        if result.outcome is GateOutcome.RELEASED:
            waited = waited_seconds(result.pod, time.time())
            self.metrics.released(waited)
            if log.isEnabledFor(logging.INFO):  # thousands a second in a drain: build the record only if logged
                others = [g for g in result.pod.gates if g != self.gate]
                log.info("released pod %s from gate %s", where, self.gate,
                         extra={"waited_s": round(waited, 1) if waited is not None else None,
                                "other_gates": ",".join(others) or None})
        return True
