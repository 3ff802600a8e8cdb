"""What ``scheduler-patcher run`` is told, as one typed value (like kopf's settings).

The command line builds it (``patcher.commands.cli.agent_config``), ``patcher.services.runner.build_agent``
wires the agent from it, and the tests build it too: so a flag cannot reach the agent by a path the tests do
not take. Frozen, and free of the Kubernetes client, so building one costs no import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from patcher.services.agent import AgentOptions

RolloutMode = Literal["coordinated", "independent"]
LogFormat = Literal["text", "json"]
LogLevel = Literal["debug", "info", "warning", "error"]


@dataclass(frozen=True)
class ApiSettings:
    """How to reach the API server and how patiently its adapters retry (the tests use short values)."""

    kubeconfig: str | None = None  # None: in-cluster, or $KUBECONFIG / ~/.kube/config (see kube.client)
    timeout: tuple[float, float] | None = None  # (connect, read) per request; None: the client's default
    retry: tuple[float, float] | None = None  # (first, longest) delay of the reporter's and pod watch's backoff


@dataclass(frozen=True)
class RolloutSettings:
    """One node at a time through a Lease (``coordinated``), or each node on its own."""

    mode: RolloutMode = "coordinated"
    lease: str = "scheduler-patcher-rollout"
    lease_duration: int = 60  # seconds: a dead holder is superseded after this long (an integer in the Lease)
    retry: float = 2.0  # how often the Lease actor retries a write that got no answer


@dataclass(frozen=True)
class StatusSettings:
    """The cluster verdict in the ``scheduler-patcher-status`` ConfigMap (and the csi-baremetal one)."""

    publish: bool = True
    compat_csi_baremetal: bool = False
    compat_namespace: str | None = None  # None: the agent's namespace


@dataclass(frozen=True)
class AgentConfig:
    """Everything the agent process runs with. ``api`` is None for a run without a cluster (``--no-api``)."""

    agent: AgentOptions  # files, node identity, timeouts, the loop's tunables
    api: ApiSettings | None = field(default_factory=ApiSettings)
    namespace: str = "scheduler-patcher"  # the agent's own: rollout Lease and status ConfigMaps live there
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    status: StatusSettings = field(default_factory=StatusSettings)
    listen: str = ":9808"  # /healthz, /livez, /readyz and /metrics
    log_format: LogFormat = "text"
    log_level: LogLevel = "info"
    #: The agent's own pod in ``namespace`` (downward API): with ``restore_on_exit=auto`` the agent watches the
    #: DaemonSet that owns it. Empty: unknown, and a stop restores.
    pod_name: str = ""

    @property
    def coordinated(self) -> bool:
        """Take the rollout turn before a write: only with an API to hold the Lease through."""
        return self.api is not None and self.rollout.mode == "coordinated"

    @property
    def watches_owner(self) -> bool:
        """Watch the owning DaemonSet: only ``auto`` reads it, and only a pod with a name can have one."""
        return self.api is not None and self.agent.restore_on_exit == "auto" and bool(self.pod_name)

    @property
    def publishes_status(self) -> bool:
        return self.api is not None and self.status.publish
