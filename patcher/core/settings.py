"""Every setting of the node commands, declared once: its type, its default, why it exists, and the flag it
comes from (in its metadata, under ``FLAG``; ``tests/unit/test_settings.py`` holds flags and fields equal), so a
flag cannot reach the agent by a path the tests do not take. Grouped as the flags are (docs/architecture.md,
"Where settings live"); each consumer takes its group. Pure data: frozen and free of I/O, so the core may import
it.
"""

from __future__ import annotations

import dataclasses
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from patcher.core.manifestedit import ForeignMode

RestoreOnExit = Literal["auto", "always", "never"]
RolloutMode = Literal["coordinated", "independent"]
LogFormat = Literal["text", "json"]
LogLevel = Literal["debug", "info", "warning", "error"]

#: The metadata key that names a field's flag.
FLAG = "flag"


def flag(name: str, help: str, **argparse: Any) -> dict[str, Any]:
    """The metadata of a field set by the flag ``name`` (``--...``): its --help text, and what the parser needs
    beyond the field's type and default (``env``: the downward-API variable its default comes from)."""
    return {FLAG: name, "help": help, **argparse}


@dataclass(frozen=True)
class Files:
    """The node's files, the flags every node command (plan, apply, restore, status, run) shares: ``nodefiles``'
    whole input (``patcher.services.nodefiles`` does the I/O with it)."""

    manifest_dir: str = field(default="/etc/kubernetes/manifests", metadata=flag(
        "--manifest-dir", "kubelet static-pod folder (node path; RKE2: /var/lib/rancher/rke2/agent/pod-manifests)"))
    manifest_name: str = field(default="kube-scheduler.yaml", metadata=flag(
        "--manifest-name", "kube-scheduler manifest file name"))
    source: Path = field(default=Path("/etc/scheduler-patcher/source"), metadata=flag(
        "--source", "source folder with the scheduler config (ConfigMap mount)"))
    host_config_dir: str = field(default="/etc/kubernetes/scheduler-patcher", metadata=flag(
        "--host-config-dir", "node folder for the rendered config (node path)"))
    #: The state record, the saved original and the writer lock.
    state_dir: str = field(default="/var/lib/scheduler-patcher", metadata=flag(
        "--state-dir", "node folder for the agent's state and backups (node path)"))
    host_root: Path = field(default=Path("/"), metadata=flag(
        "--host-root", "where the node's file system is mounted (/host in the container); node paths are read "
        "below it"))
    #: In the manifest and on the Node, without a trailing slash.
    prefix: str = field(default="scheduler-patcher.io", metadata=flag(
        "--annotation-prefix", "prefix of our annotations"))
    container_name: str | None = field(default=None, metadata=flag(
        "--container-name", "kube-scheduler container name (default: detected)"))
    on_foreign: ForeignMode = field(default="merge", metadata=flag(
        "--on-foreign-config", "what to do with a --config we did not add"))
    #: None: from the image tag (or the API server).
    kube_version: str | None = field(default=None, metadata=flag(
        "--kube-version", "kube-scheduler version, when the image tag does not tell"))
    #: Seconds a writer waits for another one (the agent, a CLI run) before refusing.
    lock_wait: float = 10.0

    @property
    def manifest_path(self) -> str:
        return posixpath.join(self.manifest_dir, self.manifest_name)


@dataclass(frozen=True)
class Lifecycle:
    """What ``patcher.core.lifecycle.step`` decides with: the restart wait, the rollback, the extender
    pre-flight, the state folder's retry, the stop."""

    restart_timeout: float = field(default=600.0, metadata=flag(
        "--restart-timeout", "how long the scheduler may take to come back Ready"))
    restart_settle: float = field(default=10.0, metadata=flag(
        "--restart-settle", "how long the restarted scheduler must run without a restart before it counts as "
        "Ready (a refused config makes it exit about a second after it starts)"))
    #: To the last Ready config, else the original.
    rollback_on_failure: bool = field(default=True, metadata=flag(
        "--rollback-on-failure", "roll back when the scheduler does not come back"))
    restore_on_exit: RestoreOnExit = field(default="auto", metadata=flag(
        "--restore-on-exit", "on SIGTERM: restore the manifest when the agent leaves the node for good (auto: its "
        "DaemonSet is gone, being deleted, no longer selects the node, or cannot be read), always, or never"))
    #: The pod's terminationGracePeriodSeconds less a margin: every wait of the stop ends within it.
    grace_period: float = field(default=25.0, metadata=flag(
        "--grace-period", "time budget for restoring and reporting on SIGTERM"))
    check_extenders: bool = field(default=True, metadata=flag(
        "--check-extenders", "before writing the manifest, call each extender of the config once; one that is "
        "not ignorable and does not answer holds the write back (Pending, retried)"))
    #: First retry of a failed pre-flight, doubling up to ``probe_retry_max``.
    probe_retry: float = 2.0
    probe_retry_max: float = 60.0
    #: First retry of a state folder that refused the record, doubling up to ``state_retry_max``.
    state_retry: float = 2.0
    state_retry_max: float = 60.0
    leader_wait: float = field(default=300.0, metadata=flag(
        "--leader-wait", "with --rollout=coordinated, how long a node may wait for the leader-aware order (its "
        "kube-scheduler leads and another node still has to change, or no other scheduler is Ready) before it takes "
        "its turn anyway"))
    #: Take the rollout turn before a write. Not a flag of its own: ``--rollout=coordinated`` with an API
    #: (``Settings.coordinated``); the agent sets it when it is built.
    coordinated: bool = False


@dataclass(frozen=True)
class Loop:
    """The agent's own rhythm: when it wakes up, what it watches."""

    resync_interval: float = field(default=300.0, metadata=flag(
        "--resync-interval", "periodic reconcile, a safety net for missed events"))
    local_check: bool = field(default=False, metadata=flag(
        "--local-check", "check the kube-scheduler process with psutil (needs hostPID)"))
    extender_probe_interval: float = field(default=60.0, metadata=flag(
        "--extender-probe-interval", "while Ready, probe the extenders this often (jittered by 20 %; 0: never); "
        "one that stops answering makes the cluster verdict NotReady, the manifest is not touched"))
    #: The agent may start on a node an operator holds.
    hold_wait: float = field(default=30.0, metadata=flag(
        "--hold-wait", "with the API, how long the agent waits at its start to learn whether its Node is held (the "
        "hold annotation) before it writes anything; then it goes on as not held"))
    #: The kubelet's local health endpoint (its healthzBindAddress and healthzPort; kubeadm and RKE2 keep both),
    #: reached through hostNetwork: while it says the kubelet is not healthy no manifest is written, and a restart
    #: timeout is no verdict on the config. Empty: no check.
    kubelet_healthz: str = field(default="http://127.0.0.1:10248/healthz", metadata=flag(
        "--kubelet-healthz", "the node's kubelet health endpoint (http, on the node's loopback: needs hostNetwork); "
        "while it is not healthy no manifest is written and a restart timeout marks no config bad (empty: no "
        "check)"))
    #: Quiet time after a folder event (open writers are waited for on top: watch.py).
    debounce: float = 0.02
    #: Restarts after our write that make a crash loop.
    crash_restarts: int = 2
    #: How often the local process table is read while a restart is awaited (with ``local_check``).
    local_poll: float = 1.0
    #: How often a node waiting for the rollout Lease asks again.
    lease_retry: float = 2.0
    #: Idle wake-up for /healthz (max age 60 s): a quarter of it, no more wake-ups.
    heartbeat: float = 15.0


@dataclass(frozen=True)
class Pod:
    """Who the agent is, from the downward API (the DaemonSet sets NODE_NAME, POD_NAME, POD_NAMESPACE)."""

    #: Empty only for a run without the API.
    node_name: str = field(default="", metadata=flag(
        "--node-name", "this node's name (the DaemonSet sets NODE_NAME)", env="NODE_NAME"))
    #: Empty: unknown, and a stop restores.
    pod_name: str = field(default="", metadata=flag(
        "--pod-name", "the agent's own pod (the DaemonSet sets POD_NAME): with --restore-on-exit=auto its "
        "DaemonSet is read through it", env="POD_NAME"))
    namespace: str = field(default="scheduler-patcher", metadata=flag(
        "--namespace", "the agent's namespace (rollout Lease, status ConfigMaps)", env="POD_NAMESPACE"))
    #: Else the kubelet kills the agent inside its restore. None: unknown.
    termination_grace: float | None = field(default=None, metadata=flag(
        "--termination-grace-period", "the pod's terminationGracePeriodSeconds (the DaemonSet sets it; the "
        "downward API cannot): --grace-period must be shorter"))


@dataclass(frozen=True)
class Api:
    """How to reach the API server and how patiently its adapters retry (the tests use short values). The
    group is None for a run without a cluster (``--no-api``)."""

    kubeconfig: str | None = field(default=None, metadata=flag(
        "--kubeconfig", "kubeconfig file (default: as kubectl: $KUBECONFIG, a colon-separated list, else "
        "~/.kube/config, else the in-cluster service account)"))
    context: str | None = field(default=None, metadata=flag(
        "--context", "the kubeconfig context to use (kubectl's --context; default: its current context)"))
    #: (connect, read) per request; None: the client's default.
    timeout: tuple[float, float] | None = None
    #: (first, longest) delay of the reporter's, pod watch's and owner watch's backoff; None: theirs.
    backoff: tuple[float, float] | None = None


@dataclass(frozen=True)
class Rollout:
    """One node at a time through a Lease (``coordinated``), or each node on its own."""

    mode: RolloutMode = field(default="coordinated", metadata=flag(
        "--rollout", "one node at a time through a Lease, or each node on its own"))
    lease: str = field(default="scheduler-patcher-rollout", metadata=flag(
        "--rollout-lease", "name of the rollout Lease (in the agent's namespace)"))
    #: Whole seconds in the Lease.
    lease_duration: int = field(default=60, metadata=flag(
        "--rollout-lease-duration", "a dead holder is superseded after this long"))
    #: How often the Lease actor retries a write that got no answer.
    retry: float = 2.0


@dataclass(frozen=True)
class Status:
    """The cluster verdict in the ``scheduler-patcher-status`` ConfigMap (and the csi-baremetal one)."""

    publish: bool = field(default=True, metadata=flag(
        "--publish-status", "publish the cluster verdict in the scheduler-patcher-status ConfigMap"))
    compat_csi_baremetal: bool = field(default=False, metadata=flag(
        "--compat-csi-baremetal", "also publish the csi-baremetal operator's extender-readiness ConfigMap"))
    compat_namespace: str | None = field(default=None, metadata=flag(
        "--compat-namespace", "namespace of the extender-readiness ConfigMap (default: --namespace)"))


@dataclass(frozen=True)
class Serve:
    """The process around the agent: its probes and its logs."""

    listen: str = field(default=":9808", metadata=flag(
        "--listen", "address of /healthz, /livez, /readyz and /metrics (with hostNetwork a host port: never the "
        "scheduler's 10259)"))
    log_format: LogFormat = field(default="text", metadata=flag("--log-format", "log format"))
    log_level: LogLevel = field(default="info", metadata=flag("--log-level", "log level"))


@dataclass(frozen=True)
class Settings:
    """Everything ``scheduler-patcher run`` runs with, one group per concern."""

    files: Files = field(default_factory=Files)
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    loop: Loop = field(default_factory=Loop)
    pod: Pod = field(default_factory=Pod)
    #: None: a run without a cluster.
    api: Api | None = field(default_factory=Api, metadata=flag("--no-api", "run with no Kubernetes API (files only)"))
    rollout: Rollout = field(default_factory=Rollout)
    status: Status = field(default_factory=Status)
    serve: Serve = field(default_factory=Serve)

    @property
    def coordinated(self) -> bool:
        """Take the rollout turn before a write: only with an API to hold the Lease through."""
        return self.api is not None and self.rollout.mode == "coordinated"

    @property
    def watches_owner(self) -> bool:
        """Watch the owning DaemonSet: only ``auto`` reads it, and only a pod with a name can have one."""
        return self.api is not None and self.lifecycle.restore_on_exit == "auto" and bool(self.pod.pod_name)

    @property
    def publishes_status(self) -> bool:
        return self.api is not None and self.status.publish


def groups() -> dict[str, type[Any]]:
    """Every group of ``Settings``: its field name there to its dataclass (each group's default is one)."""
    out: dict[str, type[Any]] = {}
    for f in dataclasses.fields(Settings):
        kind = f.default_factory
        if not isinstance(kind, type):
            raise TypeError(f"Settings.{f.name}: a group's default must be its dataclass")
        out[f.name] = kind
    return out
