"""Wiring for ``scheduler-patcher run``: builds the adapters around the agent loop and tears them down.

Kept out of the agent so that the loop can be driven in tests with in-process fakes of nothing but the
network: the same objects this module builds, pointed at a local API emulator.
"""

from __future__ import annotations

import argparse
import logging
import threading
from typing import TYPE_CHECKING

from patcher.adapters import logs
from patcher.adapters.health import Health, HealthServer, Metrics
from patcher.adapters.kube.backoff import Backoff
from patcher.core import manifest, yamltext
from patcher.core.errors import PatcherError
from patcher.services import engine
from patcher.services.agent import Agent, AgentOptions

if TYPE_CHECKING:  # the Kubernetes client costs ~1 s of imports: only a run with the API loads it
    from kubernetes.client import ApiClient

    from patcher.adapters.kube.annotations import NodeReporter
    from patcher.adapters.kube.client import TimeoutApiClient
    from patcher.adapters.kube.mirrorpod import MirrorPodWatcher
    from patcher.services.statuspub import StatusPublisher

log = logging.getLogger("patcher.services.runner")


def static_pod_identity(files: engine.Options) -> tuple[str, str]:
    """(name, namespace) of the static pod, from the manifest; kubeadm's defaults when it cannot be read."""
    try:
        node_path, _, _, text = engine.read_manifest(files)  # bounded, and a FIFO does not block the start
        doc = yamltext.parse(text)
        sched = manifest.inspect(doc, node_path, prefix=files.prefix, container_name=files.container_name)
        return sched.pod_name or "kube-scheduler", sched.namespace or "kube-system"
    except (OSError, UnicodeDecodeError, yamltext.YamlTextError, PatcherError) as exc:
        log.warning("cannot read the static pod's name (%s); assuming kube-scheduler in kube-system", exc)
        return "kube-scheduler", "kube-system"


class _VersionCache:
    """The API server's version, fetched in the background: asking inline would block the loop for a connect
    timeout on every reconcile while the API server is down (which is when we restart it). Refreshed now and
    then, since an upgrade changes it."""

    def __init__(self, api: ApiClient | None, refresh: float = 600.0) -> None:
        self.api = api
        self.value: str | None = None
        self.refresh = refresh
        self._stop = threading.Event()
        if api is not None:
            threading.Thread(target=self._run, name="api-version", daemon=True).start()

    def _run(self) -> None:
        from patcher.adapters.kube.client import server_version

        backoff = Backoff(2.0, 120.0)
        while not self._stop.is_set():
            assert self.api is not None
            found = server_version(self.api)
            if found:
                self.value = found
                backoff.reset()
            self._stop.wait(self.refresh if found else backoff.next_delay())

    def __call__(self) -> str | None:
        return self.value

    def stop(self) -> None:
        self._stop.set()


class _Connection:
    """The API side of the agent, built in a thread of its own: importing the Kubernetes client alone takes
    ~1 s on a small node, and the first reconcile's file work (and the signal handling) must not wait for it.
    When everything is built the adapters are attached to the running agent."""

    def __init__(self, files: engine.Options, args: argparse.Namespace, agent: Agent, metrics: Metrics) -> None:
        self.files, self.args, self.agent, self.metrics = files, args, agent, metrics
        self.api: TimeoutApiClient | None = None
        self.reporter: NodeReporter | None = None
        self.pods: MirrorPodWatcher | None = None
        self.publisher: StatusPublisher | None = None
        self.versions: _VersionCache | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._connect, name="api-connect", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _connect(self) -> None:
        from patcher.adapters.kube.annotations import NodeReporter
        from patcher.adapters.kube.client import ApiConfigError, ClientSettings, build_api_client
        from patcher.adapters.kube.mirrorpod import MirrorPodWatcher, mirror_pod_name
        from patcher.services.rollout import RolloutLease
        from patcher.services.statuspub import StatusPublisher, StatusTarget

        args, files, agent = self.args, self.files, self.agent
        try:
            api = build_api_client(ClientSettings(kubeconfig=args.kubeconfig))
        except ApiConfigError as exc:
            log.error("%s", exc)
            agent.request_stop(code=1)
            return
        with self._lock:
            if self._closed:
                api.close()
                return
            self.api = api
            self.reporter = NodeReporter(api, args.node_name, prefix=files.prefix + "/",
                                         on_error=lambda kind, exc: self.metrics.error(f"api-{kind}"))
            name, namespace = static_pod_identity(files)
            self.pods = MirrorPodWatcher(api, namespace, mirror_pod_name(name, args.node_name),
                                         on_update=lambda pod: agent.notify("pod"))
            coordinator = None
            if args.rollout == "coordinated":
                coordinator = RolloutLease(api, args.namespace, args.rollout_lease, args.node_name,
                                           duration=int(args.rollout_lease_duration), prefix=files.prefix,
                                           on_change=lambda: agent.notify("lease"))
            if args.publish_status:
                self.publisher = StatusPublisher(api, StatusTarget(
                    namespace=args.namespace, prefix=files.prefix + "/", static_pod_name=name,
                    mirror_namespace=namespace, compat_csi_baremetal=args.compat_csi_baremetal,
                    compat_namespace=args.compat_namespace))
            self.versions = _VersionCache(api)
            self.reporter.start()
            self.pods.start()
            if self.publisher:
                self.publisher.start()
            publisher = self.publisher
            agent.attach(reporter=self.reporter, pods=self.pods, coordinator=coordinator,
                         fallback_version=self.versions,
                         on_phase=(lambda phase: publisher.kick()) if publisher else None)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self.versions:
                self.versions.stop()
            if self.publisher:
                self.publisher.stop()
            if self.pods:
                self.pods.stop()
            if self.reporter:
                self.reporter.close()
            if self.api is not None:
                self.api.close()


def run(files: engine.Options, args: argparse.Namespace) -> int:
    logs.setup(args.log_format, args.log_level)
    metrics = Metrics()
    health = Health(metrics=metrics)
    use_api = not args.no_api
    if use_api and not args.node_name:
        log.error("NODE_NAME is not set: the agent cannot tell which Node it runs on. Set it from the "
                  "downward API (spec.nodeName), or pass --no-api for a run without a cluster")
        return 1
    opts = AgentOptions(
        files=files, node_name=args.node_name or "", resync_interval=args.resync_interval,
        restart_timeout=args.restart_timeout, rollback_on_failure=args.rollback_on_failure,
        restore_on_exit=args.restore_on_exit, local_check=args.local_check, grace_period=args.grace_period,
    )
    agent = Agent(opts, health=health, metrics=metrics, api_pending=use_api,
                  coordinated=use_api and args.rollout == "coordinated")
    agent.install_signal_handlers()
    try:
        server: HealthServer | None = HealthServer(health, metrics, args.listen)
    except OSError as exc:
        log.error("cannot listen on %s: %s; running without probes", args.listen, exc)
        server = None
    if server:
        server.start()
    agent.start_watching()
    connection = _Connection(files, args, agent, metrics) if use_api else None
    if connection:
        connection.start()
    log.info("agent started", extra={"node": args.node_name or "-", "manifest": files.manifest_path,
                                     "api": "on" if use_api else "off"})
    try:
        return agent.run()
    finally:
        if connection:  # bounded: with the API black-holed a close can hang, and the process must still exit
            closer = threading.Thread(target=connection.close, name="api-close", daemon=True)
            closer.start()
            closer.join(2.0)
        if server:
            server.stop()
