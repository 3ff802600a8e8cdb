"""Every setting of the node commands, declared once: its type, its default, why it exists, and the flag it
comes from (in its metadata, under ``FLAG``; ``tests/unit/test_settings.py`` holds flags and fields equal), so a
flag cannot reach the agent by a path the tests do not take. Grouped as the flags are (docs/architecture.md,
"Where settings live"); each consumer takes its group. Pure data: frozen and free of I/O, so the core may import
it.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from patcher.core.manifestedit import ForeignMode

RestoreOnExit = Literal["auto", "always", "never"]
RolloutMode = Literal["coordinated", "independent"]
LogFormat = Literal["text", "json"]
LogLevel = Literal["debug", "info", "warning", "error"]

#: The metadata key that names a field's flag.
FLAG = "flag"


def flag(name: str) -> dict[str, str]:
    """The metadata of a field set by the ``run`` flag ``name`` (``--...``)."""
    return {FLAG: name}


@dataclass(frozen=True)
class Files:
    """The node's files, the flags every node command (plan, apply, restore, status, run) shares: ``nodefiles``'
    whole input (``patcher.services.nodefiles`` does the I/O with it)."""

    #: The kubelet's static-pod folder (node path; RKE2: /var/lib/rancher/rke2/agent/pod-manifests).
    manifest_dir: str = field(default="/etc/kubernetes/manifests", metadata=flag("--manifest-dir"))
    manifest_name: str = field(default="kube-scheduler.yaml", metadata=flag("--manifest-name"))
    #: The scheduler config the operator wants (the ConfigMap's mount).
    source: Path = field(default=Path("/etc/scheduler-patcher/source"), metadata=flag("--source"))
    #: Node folder the rendered config is copied to: the scheduler reads it from there.
    host_config_dir: str = field(default="/etc/kubernetes/scheduler-patcher", metadata=flag("--host-config-dir"))
    #: Node folder of the state record, the saved original and the writer lock.
    state_dir: str = field(default="/var/lib/scheduler-patcher", metadata=flag("--state-dir"))
    #: Where the node's file system is mounted (/host in the container): node paths are read below it.
    host_root: Path = field(default=Path("/"), metadata=flag("--host-root"))
    #: Prefix of our annotations (in the manifest and on the Node), without a trailing slash.
    prefix: str = field(default="scheduler-patcher.io", metadata=flag("--annotation-prefix"))
    #: The kube-scheduler container in the manifest; None: detected.
    container_name: str | None = field(default=None, metadata=flag("--container-name"))
    #: What to do with a ``--config`` the scheduler runs with that we did not add.
    on_foreign: ForeignMode = field(default="merge", metadata=flag("--on-foreign-config"))
    #: The scheduler's version when the image tag does not tell; None: from the tag (or the API server).
    kube_version: str | None = field(default=None, metadata=flag("--kube-version"))
    #: Seconds a writer waits for another one (the agent, a CLI run) before refusing.
    lock_wait: float = 10.0

    @property
    def manifest_path(self) -> str:
        return posixpath.join(self.manifest_dir, self.manifest_name)


@dataclass(frozen=True)
class Lifecycle:
    """What ``patcher.core.lifecycle.step`` decides with: the restart wait, the rollback, the extender
    pre-flight, the state folder's retry, the stop."""

    #: How long the scheduler may take to come back Ready on a write before it counts as failed.
    restart_timeout: float = field(default=600.0, metadata=flag("--restart-timeout"))
    #: How long the restarted scheduler must run without a restart before it counts as Ready: a config it
    #: refuses makes it exit about a second after it starts, and for that second the kubelet may show it ready.
    restart_settle: float = field(default=10.0, metadata=flag("--restart-settle"))
    #: Roll back (to the last Ready config, else the original) when the scheduler does not come back.
    rollback_on_failure: bool = field(default=True, metadata=flag("--rollback-on-failure"))
    #: On a stop: restore when the agent leaves the node for good (``auto``: its DaemonSet is gone, being
    #: deleted, no longer selects this node, or cannot be known), always, or never.
    restore_on_exit: RestoreOnExit = field(default="auto", metadata=flag("--restore-on-exit"))
    #: The stop's budget (the pod's terminationGracePeriodSeconds less a margin): every wait of the stop ends
    #: within it.
    grace_period: float = field(default=25.0, metadata=flag("--grace-period"))
    #: Probe the config's extenders before a manifest write: one that is not ignorable and does not answer
    #: holds the write back (Pending, retried).
    check_extenders: bool = field(default=True, metadata=flag("--check-extenders"))
    #: First retry of a failed pre-flight, doubling up to ``probe_retry_max``.
    probe_retry: float = 2.0
    probe_retry_max: float = 60.0
    #: First retry of a state folder that refused the record, doubling up to ``state_retry_max``.
    state_retry: float = 2.0
    state_retry_max: float = 60.0
    #: Take the rollout turn before a write. Not a flag of its own: ``--rollout=coordinated`` with an API
    #: (``Settings.coordinated``); the agent sets it when it is built.
    coordinated: bool = False


@dataclass(frozen=True)
class Loop:
    """The agent's own rhythm: when it wakes up, what it watches."""

    #: Periodic reconcile, a safety net for missed events.
    resync_interval: float = field(default=300.0, metadata=flag("--resync-interval"))
    #: Check the kube-scheduler process with psutil (needs hostPID).
    local_check: bool = field(default=False, metadata=flag("--local-check"))
    #: While Ready, probe the extenders this often (jittered by 20 %); 0: never. One that stops answering makes
    #: the cluster verdict NotReady; the manifest is not touched.
    extender_probe_interval: float = field(default=60.0, metadata=flag("--extender-probe-interval"))
    #: How long an agent that runs with the API waits at its start for the hold watch's first answer before it
    #: writes anything (it may start on a node an operator holds); past it, it goes on as not held.
    hold_wait: float = field(default=30.0, metadata=flag("--hold-wait"))
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

    #: This node's name; empty only for a run without the API.
    node_name: str = field(default="", metadata=flag("--node-name"))
    #: The agent's own pod in ``namespace``: with ``restore_on_exit=auto`` the agent watches the DaemonSet that
    #: owns it. Empty: unknown, and a stop restores.
    pod_name: str = field(default="", metadata=flag("--pod-name"))
    #: The agent's namespace: the rollout Lease and the status ConfigMaps live there.
    namespace: str = field(default="scheduler-patcher", metadata=flag("--namespace"))
    #: The pod's ``terminationGracePeriodSeconds``, as its DaemonSet says (the downward API cannot): the stop's
    #: ``--grace-period`` must end before it, or the kubelet kills the agent inside its restore. None: unknown.
    termination_grace: float | None = field(default=None, metadata=flag("--termination-grace-period"))


@dataclass(frozen=True)
class Api:
    """How to reach the API server and how patiently its adapters retry (the tests use short values). The
    group is None for a run without a cluster (``--no-api``)."""

    #: None: $KUBECONFIG, ~/.kube/config, else in-cluster, as kubectl (see kube.client).
    kubeconfig: str | None = field(default=None, metadata=flag("--kubeconfig"))
    #: The kubeconfig context (kubectl's ``--context``); None: its current context.
    context: str | None = field(default=None, metadata=flag("--context"))
    #: (connect, read) per request; None: the client's default.
    timeout: tuple[float, float] | None = None
    #: (first, longest) delay of the reporter's, pod watch's and owner watch's backoff; None: theirs.
    backoff: tuple[float, float] | None = None


@dataclass(frozen=True)
class Rollout:
    """One node at a time through a Lease (``coordinated``), or each node on its own."""

    mode: RolloutMode = field(default="coordinated", metadata=flag("--rollout"))
    #: The rollout Lease's name (in ``Pod.namespace``).
    lease: str = field(default="scheduler-patcher-rollout", metadata=flag("--rollout-lease"))
    #: Seconds after which a dead holder is superseded (a whole number in the Lease).
    lease_duration: int = field(default=60, metadata=flag("--rollout-lease-duration"))
    #: How often the Lease actor retries a write that got no answer.
    retry: float = 2.0


@dataclass(frozen=True)
class Status:
    """The cluster verdict in the ``scheduler-patcher-status`` ConfigMap (and the csi-baremetal one)."""

    publish: bool = field(default=True, metadata=flag("--publish-status"))
    #: Also publish the csi-baremetal operator's extender-readiness ConfigMap.
    compat_csi_baremetal: bool = field(default=False, metadata=flag("--compat-csi-baremetal"))
    #: Namespace of the extender-readiness ConfigMap; None: the agent's namespace.
    compat_namespace: str | None = field(default=None, metadata=flag("--compat-namespace"))


@dataclass(frozen=True)
class Serve:
    """The process around the agent: its probes and its logs."""

    #: Address of /healthz, /livez, /readyz and /metrics (with hostNetwork a host port: never the scheduler's).
    listen: str = field(default=":9808", metadata=flag("--listen"))
    log_format: LogFormat = field(default="text", metadata=flag("--log-format"))
    log_level: LogLevel = field(default="info", metadata=flag("--log-level"))


@dataclass(frozen=True)
class Settings:
    """Everything ``scheduler-patcher run`` runs with, one group per concern."""

    files: Files = field(default_factory=Files)
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    loop: Loop = field(default_factory=Loop)
    pod: Pod = field(default_factory=Pod)
    #: None: a run without a cluster.
    api: Api | None = field(default_factory=Api, metadata=flag("--no-api"))
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
