"""What the agent's thread is handed by the API side (``patcher.services.runner`` builds them): the Node's
reporter, the mirror pod's view, the rollout Lease actor and the view of the agent's own DaemonSet; and the
folder watch (``process``). Protocols, so that the executor's parts (``restartwatch``, ``stopping``) and the
tests' fakes share one shape, and one of each that does nothing, for an agent without them (``--no-api``, or
until the API adapters are attached), so that the executor calls them without asking whether they are there."""

from __future__ import annotations

from typing import Any, Protocol

from patcher.core import lifecycle
from patcher.core.status import NodeStatus


class Reporter(Protocol):
    def publish(self, status: NodeStatus, *, reason: str | None = None, message: str | None = None) -> None: ...
    def note(self, reason: str, message: str, *, warning: bool = False) -> None: ...
    def flush(self, timeout: float) -> bool: ...


class PodSource(Protocol):
    """The mirror pod as the API server shows it (``adapters/kube/mirrorpod.MirrorPodWatcher``)."""

    pod_name: str  # the mirror pod watched; "" for none (``NoPods``): then it gives no restart verdict at all

    @property
    def fresh(self) -> bool: ...  # ``latest`` follows the API server right now

    def latest(self) -> dict[str, Any] | None: ...


class Coordinator(Protocol):
    """One manifest change at a time across the control plane (see ``patcher.services.rollout``): an actor whose
    methods never wait for the API, except ``settle``/``wait_held``/``close``, which are bounded."""

    held: bool
    refused_bad: bool
    current_holder: str | None
    api_answered: bool | None  # did its last round trip get an answer (None: none finished yet)

    @property
    def unanswered(self) -> bool: ...  # an intent posted and its round trip not ended
    @property
    def denied(self) -> str | None: ...  # the refusal (401/403) of its last failed request

    def acquire(self, source_hash: str = "") -> bool: ...
    def release(self, *, bad_hash: str | None = None) -> None: ...
    def settle(self, timeout: float) -> bool: ...
    def wait_held(self, timeout: float) -> bool: ...
    def close(self, timeout: float) -> None: ...


class OwnerSource(Protocol):
    """What the agent knows of the DaemonSet that owns its pod (``patcher.adapters.kube.owner``)."""

    def view(self) -> lifecycle.DaemonSetView: ...
    def confirm(self, timeout: float) -> lifecycle.DaemonSetView: ...


class HoldSource(Protocol):
    """The operator's hold on this node (``adapters/kube/nodehold``): its value, None when the Node has none."""

    def hold(self) -> str | None: ...
    def known(self) -> bool: ...  # the watch's first list answered: ``hold`` is the Node's, not a default


class LeaderSource(Protocol):
    """Which kube-scheduler leads and what the other control-plane nodes say (``adapters/kube/schedleader``)."""

    def view(self) -> lifecycle.Schedulers: ...


class Watcher(Protocol):
    """The folder watch (``adapters/watch.FolderWatcher``) as the agent's thread uses it."""

    def expect(self, name: str) -> None: ...  # our own write: the folder's events that follow are ours
    def stop(self) -> None: ...


class NoWatcher:
    """Before ``process.start_watching`` (an agent driven by hand): nothing watched, nothing to expect or stop."""

    def expect(self, name: str) -> None:
        pass

    def stop(self) -> None:
        pass


class NoReporter:
    """The reporter of an agent without the API (``--no-api``, or until the API adapters are attached): nothing
    to tell, everything delivered."""

    def publish(self, status: NodeStatus, *, reason: str | None = None, message: str | None = None) -> None:
        pass

    def note(self, reason: str, message: str, *, warning: bool = False) -> None:
        pass

    def flush(self, timeout: float) -> bool:
        return True


class NoHold:
    """The hold of an agent without the API: none, and never known (the start does not wait for it)."""

    def hold(self) -> str | None:
        return None

    def known(self) -> bool:
        return False


class NoLeader:
    """The leader-aware order's view of an agent without it (not coordinated, no API): unknown, so not applied."""

    def view(self) -> lifecycle.Schedulers:
        return lifecycle.Schedulers()


class NoPods:
    """The mirror pod of an agent without the API: none watched, so the restart is judged by the local check
    alone (or taken as live), never waited for."""

    pod_name = ""
    fresh = False

    def latest(self) -> dict[str, Any] | None:
        return None


class NoCoordinator:
    """The Lease actor of an agent without one (not coordinated, or the API adapters not attached yet): the
    turn is never held, a request is answered at once (refused), and there is nothing to release or close."""

    held = False
    refused_bad = False
    current_holder: str | None = None
    api_answered: bool | None = None
    unanswered = False
    denied: str | None = None

    def acquire(self, source_hash: str = "") -> bool:
        return False

    def release(self, *, bad_hash: str | None = None) -> None:
        pass

    def settle(self, timeout: float) -> bool:
        return True

    def wait_held(self, timeout: float) -> bool:
        return False

    def close(self, timeout: float) -> None:
        pass


class NoOwner:
    """The DaemonSet view of an agent that does not watch its owner: unknown, for the reason ``detail``."""

    def __init__(self, detail: str) -> None:
        self.detail = detail

    def view(self) -> lifecycle.DaemonSetView:
        return lifecycle.DaemonSetView(detail=self.detail)

    def confirm(self, timeout: float) -> lifecycle.DaemonSetView:
        return self.view()

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


# An agent's collaborators until the API adapters are attached, or for good without the API (stateless: one of
# each serves every agent).
NO_REPORTER, NO_PODS, NO_COORDINATOR, NO_LEADER = NoReporter(), NoPods(), NoCoordinator(), NoLeader()
NOT_ATTACHED = NoOwner("the API adapters are not there")
