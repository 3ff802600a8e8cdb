"""The composition root of ``scheduler-patcher run``: ``build_agent`` wires the agent and its adapters from
``Settings``, ``run`` serves the probes around it and tears everything down. The tests build the agent with
``build_agent`` too, so the wiring they run is the one the DaemonSet runs. The event queue is made first, so
every adapter's callback is the queue's ``put``: nothing is bound late."""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from patcher.adapters import fsio, logs
from patcher.adapters.health import Health, HealthServer, Metrics
from patcher.adapters.kube.backoff import Backoff
from patcher.core import manifestedit, settings, yamltext
from patcher.core.errors import PatcherError
from patcher.core.kubeobj import mirror_pod_name
from patcher.core.lifecycle import LoopEvent
from patcher.core.settings import Files, Settings
from patcher.services import nodefiles, process
from patcher.services.agent import Agent
from patcher.services.ports import NO_COORDINATOR, NO_LEADER, Coordinator, NoOwner

if TYPE_CHECKING:  # the API client costs imports: only a run with the API loads it
    from patcher.adapters.kube.mirrorpod import MirrorPodWatcher
    from patcher.adapters.kube.nodehold import NodeHoldWatcher
    from patcher.adapters.kube.owner import OwnerWatcher
    from patcher.adapters.kube.publish import NodeReporter, StatusPublisher
    from patcher.adapters.kube.schedleader import SchedulerLeader
    from patcher.adapters.kube.transport import Api as KubeApi

log = logging.getLogger("patcher.services.runner")


def static_pod_identity(files: Files) -> tuple[str, str]:
    """(name, namespace) of the static pod, from the manifest; kubeadm's defaults when it cannot be read."""
    try:
        node_path, _, _, text = nodefiles.read_manifest(files)  # bounded, and a FIFO does not block the start
        doc = yamltext.parse(text)
        sched = manifestedit.inspect(doc, node_path, prefix=files.prefix, container_name=files.container_name)
        return sched.pod_name or "kube-scheduler", sched.namespace
    except (OSError, UnicodeDecodeError, yamltext.YamlTextError, PatcherError) as exc:
        log.warning("cannot read the static pod's name (%s); assuming kube-scheduler in kube-system", exc)
        return "kube-scheduler", "kube-system"


class _VersionCache:
    """The API server's version, fetched in the background: asking inline would block the loop for a connect
    timeout on every reconcile while the API server is down (which is when we restart it). Refreshed now and
    then, since an upgrade changes it."""

    REFRESH = 600.0

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.value: str | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="api-version", daemon=True).start()

    def _run(self) -> None:
        from patcher.adapters.kube.client import server_version

        backoff = Backoff(2.0, 120.0)
        while not self._stop.is_set():
            found = server_version(self.api)
            if found:
                self.value = found
                backoff.reset()
            self._stop.wait(self.REFRESH if found else backoff.next_delay())

    def __call__(self) -> str | None:
        return self.value

    def stop(self) -> None:
        self._stop.set()


@dataclass(frozen=True)
class Deferred:
    """An API client to build in a background thread (the ``run`` command's case): importing the client's
    transport and loading its TLS context are slow on a small node, and the first reconcile's file work (and
    the signal handling) must not wait for it. The adapters are attached to the running agent once they are built."""

    build: Callable[[], KubeApi]


Api = Union["KubeApi", Deferred, None]


class NoPublisher:
    """The cluster verdict's publisher of an agent that does not publish it (``status.publish`` off)."""

    def start(self) -> None:
        pass

    def kick(self) -> None:
        pass

    def stop(self) -> None:
        pass


@dataclass
class ApiParts:
    """The agent's adapters on the API side, built by ``_api_parts`` and owned (closed) by ``Wiring``."""

    api: KubeApi
    reporter: NodeReporter
    pods: MirrorPodWatcher
    coordinator: Coordinator
    publisher: StatusPublisher | NoPublisher
    versions: _VersionCache
    owner: OwnerWatcher | NoOwner
    holds: NodeHoldWatcher
    leaders: SchedulerLeader | None  # the leader-aware order's view (coordinated only)

    def start(self) -> None:
        self.reporter.start()
        self.pods.start()
        self.holds.start()
        if self.leaders is not None:
            self.leaders.start()
        self.owner.start()
        self.publisher.start()
        self.versions.start()

    def close(self) -> None:
        self.versions.stop()
        self.publisher.stop()
        self.owner.stop()
        self.holds.stop()
        if self.leaders is not None:
            self.leaders.stop()
        self.pods.stop()
        self.reporter.close()
        self.api.close()

    def attach_to(self, agent: Agent, *, announce: bool = True) -> None:
        """``on_phase``: the phase or its message changed here, so the cluster verdict may have changed too."""
        agent.world.attach(reporter=self.reporter, pods=self.pods, coordinator=self.coordinator, owner=self.owner,
                           fallback_version=self.versions, holds=self.holds, leaders=self.leaders or NO_LEADER,
                           on_phase=lambda _: self.publisher.kick(), announce=announce)


def _api_parts(config: Settings, api: KubeApi, notify: Callable[[LoopEvent], None],
               metrics: Metrics) -> ApiParts:
    """Build (not start) the API-side adapters; every callback into the agent is ``notify``, the queue's put."""
    from patcher.adapters.kube.mirrorpod import MirrorPodWatcher
    from patcher.adapters.kube.nodehold import NodeHoldWatcher
    from patcher.adapters.kube.owner import OwnerWatcher
    from patcher.adapters.kube.publish import NodeReporter, StatusPublisher, StatusTarget
    from patcher.adapters.kube.schedleader import SchedulerLeader
    from patcher.services.rollout import RolloutLease

    assert config.api is not None
    files, node_name, retry = config.files, config.pod.node_name, config.api.backoff
    name, namespace = static_pod_identity(files)
    reporter = NodeReporter(api, node_name, prefix=files.prefix + "/",
                            backoff=Backoff(*retry) if retry else None,
                            on_error=lambda kind, exc: metrics.error(f"api-{kind}"))
    pods = MirrorPodWatcher(api, namespace, mirror_pod_name(name, node_name),
                            backoff=Backoff(*retry) if retry else None, on_update=lambda pod: notify(LoopEvent.POD))
    coordinator: Coordinator = NO_COORDINATOR
    leaders = None
    if config.coordinated:
        r = config.rollout
        coordinator = RolloutLease(api, config.pod.namespace, r.lease, node_name, duration=r.lease_duration,
                                   prefix=files.prefix, retry=r.retry, on_change=lambda: notify(LoopEvent.LEASE))
        leaders = SchedulerLeader(api, node_name, files.prefix, retry=retry,
                                  on_change=lambda: notify(LoopEvent.REPLAN))
    publisher: StatusPublisher | NoPublisher = NoPublisher()
    if config.publishes_status:
        s = config.status
        publisher = StatusPublisher(api, StatusTarget(
            namespace=config.pod.namespace, prefix=files.prefix + "/", static_pod_name=name,
            mirror_namespace=namespace, compat_csi_baremetal=s.compat_csi_baremetal,
            compat_namespace=s.compat_namespace))
    owner: OwnerWatcher | NoOwner = NoOwner("the agent does not know its pod (POD_NAME, POD_NAMESPACE)")
    if config.watches_owner:
        owner = OwnerWatcher(api, config.pod.namespace, config.pod.pod_name, node_name,
                             backoff=Backoff(*retry) if retry else None, on_update=lambda: notify(LoopEvent.DAEMONSET))
    holds = NodeHoldWatcher(api, node_name, files.prefix, on_update=lambda: notify(LoopEvent.HOLD),
                            backoff=Backoff(*retry) if retry else None)
    return ApiParts(api, reporter, pods, coordinator, publisher, _VersionCache(api), owner, holds, leaders)


class Wiring:
    """The agent and its parts, as ``build_agent`` made them: ``start`` the adapters, run ``process.run(agent)``
    (in this thread or another), then ``close``."""

    def __init__(self, config: Settings, events: queue.SimpleQueue[LoopEvent], health: Health, metrics: Metrics,
                 agent: Agent, api: Api, parts: ApiParts | None) -> None:
        self.config, self.events, self.health, self.metrics, self.agent = config, events, health, metrics, agent
        self.parts = parts  # set by the connect thread when the client is Deferred
        self._deferred = api if isinstance(api, Deferred) else None
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        """Watch the folders, then bring up the API side: at once for a client, in a thread for a Deferred."""
        process.start_watching(self.agent)
        if self.parts is not None:
            self.parts.start()
            self.agent.world.started()
        if self._deferred is not None:
            threading.Thread(target=self._connect, args=(self._deferred,), name="api-connect", daemon=True).start()

    def _connect(self, deferred: Deferred) -> None:
        from patcher.adapters.kube.client import ApiConfigError

        try:
            api = deferred.build()
        except ApiConfigError as exc:
            log.error("%s", exc)
            self.agent.api_unavailable()
            return
        with self._lock:
            if self._closed:
                api.close()
                return
            self.parts = _api_parts(self.config, api, self.events.put, self.metrics)
            # Attached before started, as build_agent does for a client it is given: an adapter's first event
            # (the owner watch's "daemonset") must find the agent holding the adapter, or it is dropped.
            self.parts.attach_to(self.agent)
            self.parts.start()
            self.agent.world.started()

    def close(self, timeout: float = 1.0) -> None:
        """Stop the API side, bounded: with the API black-holed a close can hang, and the process must exit."""
        def close() -> None:
            with self._lock:
                self._closed = True
                if self.parts is not None:
                    self.parts.close()

        closer = threading.Thread(target=close, name="api-close", daemon=True)
        closer.start()
        closer.join(timeout)


def build_agent(config: Settings, api: Api, *, file_ops: fsio.FileOps = fsio.REAL) -> Wiring:
    """The agent as deployed. ``api``: a client (its adapters are built here and attached from the start), a
    ``Deferred`` one (built and attached by a thread ``start`` runs), or None for a run without a cluster,
    which ``config.api`` must say too; ``file_ops``: what the agent's file writes go through. The returned
    wiring owns the client and closes it."""
    if (api is None) != (config.api is None):
        raise ValueError("build_agent: the API client and config.api disagree about running with a cluster")
    events: queue.SimpleQueue[LoopEvent] = queue.SimpleQueue()  # see Agent.events: a signal handler puts on it
    metrics = Metrics()
    health = Health()
    parts = None if api is None or isinstance(api, Deferred) else _api_parts(config, api, events.put, metrics)
    agent = Agent(config, events=events, health=health, metrics=metrics, coordinated=config.coordinated,
                  api_pending=isinstance(api, Deferred), learns_hold=api is not None, file_ops=file_ops)
    if parts is not None:  # a client given: its adapters are the agent's from the start
        parts.attach_to(agent, announce=False)
    return Wiring(config, events, health, metrics, agent, api, parts)


def api_client(given: settings.Api) -> KubeApi:
    """The API client ``run`` builds; it imports the Kubernetes client, so ``run`` calls it off the loop, through
    a ``Deferred``."""
    from patcher.adapters.kube.client import DEFAULT_TIMEOUT, ClientSettings, build_api_client

    return build_api_client(ClientSettings(kubeconfig=given.kubeconfig, context=given.context,
                                           timeout=given.timeout or DEFAULT_TIMEOUT))


def run(config: Settings) -> int:
    logs.setup(config.serve.log_format, config.serve.log_level)
    api: Api = None if config.api is None else Deferred(functools.partial(api_client, config.api))
    wiring = build_agent(config, api)
    agent = wiring.agent
    process.install_signal_handlers(agent)
    try:
        server: HealthServer | None = HealthServer(wiring.health, wiring.metrics, config.serve.listen)
    except OSError as exc:
        log.error("cannot listen on %s: %s; running without probes", config.serve.listen, exc)
        server = None
    if server:
        # Listening from here on (the kernel queues a probe); served once the start has settled, or at the
        # first connection: its asyncio import stays off the path to the first write (HealthServer's doc).
        server.start(deferred=True)
    wiring.start()
    log.info("agent started", extra={"node": config.pod.node_name or "-",
                                     "manifest": config.files.manifest_path,
                                     "api": "on" if api is not None else "off"})

    try:
        return process.run(agent, settled=server.wake if server else None)
    finally:
        # The stop's release and final report are done or given up already: the exit does not wait for the
        # adapters' threads (the sockets close with the process).
        wiring.close(0.1)
        if server:
            server.stop()
