"""``scheduler-patcher gatekeeper``: release a scheduling gate once every scheduler runs the patched config.

A pod created with the gate ``scheduler-patcher.io/extender-ready`` stays Pending until a scheduler that knows
the extender can place it; this command removes exactly that gate while the cluster verdict is Ready, one
replica at a time (a Lease), and with ``--webhook-listen`` also serves the admission webhook that adds it
(``patcher.services.webhook``), on every replica. The rules and their reasons are in docs/scheduling-gates.md
and docs/operator-contract.md; this module is the flags and the wiring.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import ssl
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Final

from patcher.adapters import logs
from patcher.adapters.health import Health, HealthServer
from patcher.adapters.httpserver import CertReloader, HttpServer
from patcher.adapters.kube.client import ApiConfigError, ClientSettings, build_api_client
from patcher.adapters.kube.cluster import DEFAULT_STATUS_NAME, collect
from patcher.adapters.kube.configmapview import ConfigMapView
from patcher.adapters.kube.leader import LeaderElector
from patcher.adapters.kube.schedindex import SchedulerIndex
from patcher.adapters.kube.throttle import Throttle
from patcher.commands.conventions import EXIT_ERROR, EXIT_OK, EXIT_USAGE, Flags, boolean, duration
from patcher.commands.readiness import add_verdict_arguments, verdict_kwargs
from patcher.core.admission import DEFAULT_SCHEDULER, Selection
from patcher.core.gates import DEFAULT_GATE
from patcher.core.readiness import node_selectors
from patcher.services.gatekeeper import BATCH_ROUNDS, DEFAULT_BURST, DEFAULT_QPS, HEARTBEAT, Gatekeeper, GateMetrics
from patcher.services.webhook import AdmissionWebhook

if TYPE_CHECKING:
    from patcher.adapters.kube.transport import Api

log = logging.getLogger(__name__)

DEFAULT_LEASE: Final = "scheduler-patcher-gatekeeper"
DEFAULT_LISTEN: Final = ":9809"
#: Threads that read the verdict: its Node lists (two selectors), the labelled kube-system pod list and the reads
#: by name of the unlabelled schedulers go at once, so a read during a drain (the release workers wait for it)
#: is a round trip or two, not one per read.
VERDICT_READS: Final = 4


def add_arguments(p: argparse.ArgumentParser) -> None:
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
    f.add("--retry-period", "2s", "how often a standby tries the Lease, and a leader a failed renewal",
          type=duration)
    f.add("--renew-period", None, "how often the leader renews the Lease (default: half --renew-deadline, at "
          "least --retry-period); a standby takes over --lease-duration after the last renewal it saw, whatever "
          "this period", type=duration)
    f.add("--scheduler-names", "", "comma-separated spec.schedulerName values whose pods are watched "
          "(default: any); each becomes a server-side field selector")
    f.add("--kube-api-qps", str(DEFAULT_QPS), "release requests per second (client-go's QPS)", type=positive_float)
    f.add("--kube-api-burst", str(DEFAULT_BURST), "release requests that may leave at once (client-go's Burst)",
          type=positive_int)
    f.add("--release-concurrency", None, "releases in flight at once (default: --kube-api-burst)",
          type=positive_int)
    f.add("--release-batch", None, f"pods released between two checks whether the verdict may have changed "
          f"(default: {BATCH_ROUNDS} x the concurrency); a change a watch delivers is read before the next pod",
          type=positive_int)
    f.add("--resync-interval", "5m", "re-evaluate the verdict at least this often, a safety net: it is read "
          "again on every change of a watched Node's annotations (the control-plane Nodes, and each Node only a "
          "kube-scheduler pod led to) or of a kube-scheduler pod", type=duration)
    f.add("--listen", DEFAULT_LISTEN, "address of /healthz, /readyz and /metrics")
    f.add("--webhook-listen", "", "serve the admission webhook (HTTPS, POST /mutate) on this address, e.g. "
          "':8443' (default: off); for clusters without MutatingAdmissionPolicy")
    f.add("--webhook-cert", "", "the webhook's TLS certificate (PEM), reloaded when the file changes")
    f.add("--webhook-key", "", "the webhook's TLS private key (PEM), reloaded with the certificate")
    f.add("--webhook-verdict-configmap", DEFAULT_STATUS_NAME, "the readiness ConfigMap the webhook reads, "
          "'name' (in --namespace) or 'namespace/name': the policy binding's paramRef")
    f.add("--webhook-scheduler-names", DEFAULT_SCHEDULER, "comma-separated spec.schedulerName values the webhook "
          "gates (empty: any scheduler), as the policy's schedulerNames")
    f.add("--webhook-storage-classes", "", "comma-separated StorageClasses: if this or --webhook-csi-drivers is "
          "set, gate only pods with a generic ephemeral volume of one of them (as the policy)")
    f.add("--webhook-csi-drivers", "", "comma-separated CSI drivers: gate only pods with an inline CSI volume of "
          "one of them (with --webhook-storage-classes: either)")
    f.add("--log-format", "text", "log format", choices=["text", "json"])
    f.add("--log-level", "info", "log level", choices=["debug", "info", "warning", "error"])


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value!r}")
    return number


def positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not 0 < number < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number: {value!r}")
    return number


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


def usage_problems(args: argparse.Namespace) -> list[str]:
    """Flags that cannot work together: a usage error (exit 64) before anything starts, as for every command."""
    problems = []
    if args.renew_period is None:  # a failed renewal is then tried every retry period for the other half
        args.renew_period = max(args.retry_period, args.renew_deadline / 2)
    if args.leader_elect and not (0 < args.retry_period <= args.renew_period < args.renew_deadline
                                  < args.lease_duration):
        problems.append(f"--retry-period {args.retry_period:g}s, --renew-period {args.renew_period:g}s, "
                        f"--renew-deadline {args.renew_deadline:g}s, --lease-duration {args.lease_duration:g}s: "
                        "leader election needs 0 < retry period <= renew period < renew deadline < lease duration")
    if args.webhook_listen and not (args.webhook_cert and args.webhook_key):
        problems.append("--webhook-listen needs --webhook-cert and --webhook-key")
    if not args.webhook_verdict_configmap.rpartition("/")[2]:
        problems.append(f"--webhook-verdict-configmap: no name in {args.webhook_verdict_configmap!r}")
    if not args.gate_name:
        problems.append("--gate-name: the gate name must not be empty")
    return problems


def run(args: argparse.Namespace, stop: threading.Event) -> int:
    """The gatekeeper until ``stop`` is set (``main`` without signals and logging setup, for tests)."""
    problems = usage_problems(args)
    for problem in problems:
        log.error("%s", problem)
    if problems:
        return EXIT_USAGE
    kwargs = verdict_kwargs(args)
    try:
        concurrency = args.release_concurrency or args.kube_api_burst
        # Every worker and verdict reader keeps its connection, plus the watches and the Lease: none opened and
        # dropped per request.
        api = build_api_client(ClientSettings(kubeconfig=args.kubeconfig, context=args.context,
                                              pool_size=concurrency + VERDICT_READS + 8))
    except ApiConfigError as exc:
        log.error("%s", exc)
        return EXIT_ERROR
    metrics = GateMetrics()
    health = Health(max_age=max(60.0, 3 * min(args.resync_interval, HEARTBEAT)))
    gatekeeper: Gatekeeper | None = None
    elector: LeaderElector | None = None
    reads = ThreadPoolExecutor(VERDICT_READS, thread_name_prefix="verdict-read")

    def leadership_changed(_leading: bool) -> None:
        if gatekeeper is not None:
            gatekeeper.wake()  # act (or stop acting) now, not at the next resync

    try:
        if args.leader_elect:
            elector = LeaderElector(api, namespace=args.namespace, name=args.lease_name, identity=args.identity,
                                    lease_duration=args.lease_duration, renew_deadline=args.renew_deadline,
                                    retry_period=args.retry_period, renew_period=args.renew_period,
                                    on_change=leadership_changed)
        index = SchedulerIndex(api, kwargs["mirror_namespace"], kwargs["static_pod_name"],
                               on_change=lambda: gatekeeper.schedulers_changed() if gatekeeper else None,
                               failure_level=logging.WARNING)
        gatekeeper = Gatekeeper(
            api, verdict_fn=lambda: collect(api, executor=reads, index=index, **kwargs), gate_name=args.gate_name,
            namespaces=list(split(args.namespaces)),
            node_label_selectors=node_selectors(args.node_selector, args.legacy_master_label),
            prefix=args.annotation_prefix, elector=elector, metrics=metrics, health=health,
            resync_interval=args.resync_interval,
            scheduler_names=list(split(args.scheduler_names)),
            throttle=Throttle(args.kube_api_qps, args.kube_api_burst), concurrency=concurrency,
            batch_size=args.release_batch or None, scheduler_index=index)
        server = HealthServer(health, metrics, args.listen, ready=health.alive)
        webhook = build_webhook(api, args, metrics)
    except (ValueError, OSError, ssl.SSLError) as exc:
        log.error("cannot start the gatekeeper: %s", exc)
        reads.shutdown(wait=False)
        api.close()
        return EXIT_ERROR
    gk = gatekeeper

    def wake_on_stop() -> None:
        stop.wait()
        gk.wake()

    threading.Thread(target=wake_on_stop, name="gatekeeper-stop", daemon=True).start()
    server.start()
    for part in webhook:
        part.start()
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
        for part in reversed(webhook):
            part.stop()
        reads.shutdown(wait=True, cancel_futures=True)
        api.close()
    return EXIT_OK


def split(value: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in value.split(",") if n.strip())


def webhook_selection(args: argparse.Namespace) -> Selection:
    """The policy's variables, from the --webhook-* flags (and the gate from --gate-name)."""
    return Selection(gate=args.gate_name, scheduler_names=split(args.webhook_scheduler_names),
                     storage_classes=split(args.webhook_storage_classes), csi_drivers=split(args.webhook_csi_drivers))


def build_webhook(api: Api, args: argparse.Namespace, metrics: GateMetrics) -> list[ConfigMapView | HttpServer]:
    """The admission webhook's verdict view and HTTPS server, in start order (none without --webhook-listen);
    ``OSError``/``ssl.SSLError`` for a certificate that does not load (``usage_problems`` checked the flags)."""
    if not args.webhook_listen:
        return []
    namespace, _, name = args.webhook_verdict_configmap.rpartition("/")
    view = ConfigMapView(api, namespace or args.namespace, name)
    app = AdmissionWebhook(webhook_selection(args), view.state, metrics.registry)
    return [view, HttpServer(app.handle, args.webhook_listen, certs=CertReloader(args.webhook_cert, args.webhook_key),
                            keep_alive=True, name="webhook server")]
