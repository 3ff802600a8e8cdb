"""The gatekeeper's pods: the watch on Pending pods, and its one write, removing its scheduling gate from a pod
(rebuilding the patch after a conflict).

Its own module, not ``cluster``: the node agent imports ``cluster`` (the status publisher), and the RBAC scan in
``tests/test_deploy_manifests.py`` rightly counts every API call in the agent's modules as a right it needs;
the agent must not be granted ``patch pods`` nor a cluster-wide pod watch. The patch itself is pure
(``patcher.core.gates``); here it is sent, and a pod that changed meanwhile is read again. Failures leave as
``patcher.adapters.kube.errors`` classes.
"""

from __future__ import annotations

import enum
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from kubernetes import client as k8s

from patcher.adapters.kube.backoff import Backoff
from patcher.adapters.kube.errors import Conflict, Invalid, NotFound, api_json
from patcher.adapters.kube.listwatch import ListWatcher
from patcher.core.gates import pod_key, release_patch, waits_on
from patcher.core.kubeobj import Obj

log = logging.getLogger(__name__)

JSON_PATCH: Final = "application/json-patch+json"


class GateOutcome(enum.Enum):
    """How a release ended (an API failure is raised instead: the caller retries later)."""

    RELEASED = "released"  #: our patch removed the gate
    NOT_WAITING = "not waiting"  #: the pod no longer waits on it: released by another, scheduled, or deleted
    KEPT_CHANGING = "kept changing"  #: every patch met a newer pod; try again on a later pass


@dataclass(frozen=True)
class GateRelease:
    """The outcome, and the pod as last read (for ``RELEASED``, the version the patch was built from)."""

    outcome: GateOutcome
    pod: Obj


#: The API server cannot select on ``spec.schedulingGates``: the watch takes Pending pods, the caller filters.
PENDING: Final = "status.phase=Pending"


def pending_pod_watchers(api: k8s.ApiClient, namespaces: Sequence[str], *,
                         on_sync: Callable[[str | None, list[Obj]], None], on_event: Callable[[str, Obj], None],
                         backoff: Backoff | None = None, failure_level: int = logging.INFO) -> list[ListWatcher]:
    """Pending pods (not started): one watcher per namespace, or one across the cluster for none.
    ``on_sync(namespace or None, pods)`` after each list replaces that scope's pods."""
    core = k8s.CoreV1Api(api)
    fresh = backoff.fresh if backoff is not None else (lambda: None)
    if not namespaces:
        return [ListWatcher(core.list_pod_for_all_namespaces, field_selector=PENDING, name="watch pods",
                            on_sync=functools.partial(on_sync, None), on_event=on_event, backoff=fresh(),
                            failure_level=failure_level)]
    return [ListWatcher(core.list_namespaced_pod, ns, field_selector=PENDING, name=f"watch pods ({ns})",
                        on_sync=functools.partial(on_sync, ns), on_event=on_event, backoff=fresh(),
                        failure_level=failure_level)
            for ns in namespaces]


def release_gate(api: k8s.ApiClient, pod: Obj, gate: str, *, attempts: int,
                 on_conflict: Callable[[], None] | None = None) -> GateRelease:
    """Remove ``gate`` from ``pod`` with the patch of ``core.gates`` (it tests the gates it was built from).

    A 422 (the ``test`` failed) or a 409 means the pod changed since it was read: ``on_conflict()`` is called,
    the pod is read again and the patch rebuilt from it, up to ``attempts`` patches. A pod that is gone (404)
    no longer waits. Raises ``ApiError`` for any other failure of the patch or the read.
    """
    core = k8s.CoreV1Api(api)
    ns, name = pod_key(pod)
    where = f"{ns}/{name}"
    for _ in range(attempts):
        if not waits_on(pod, gate):
            return GateRelease(GateOutcome.NOT_WAITING, pod)
        try:
            api_json(f"release pod {where}", core.patch_namespaced_pod, name, ns, release_patch(pod, gate),
                     _content_type=JSON_PATCH)
        except NotFound:
            return GateRelease(GateOutcome.NOT_WAITING, pod)
        except (Conflict, Invalid) as exc:  # the pod changed since we read it: read it again
            if on_conflict is not None:
                on_conflict()
            log.debug("pod %s changed while we released it (%s); reading it again", where, exc.detail)
            try:
                pod = api_json(f"read pod {where}", core.read_namespaced_pod, name, ns)
            except NotFound:
                return GateRelease(GateOutcome.NOT_WAITING, pod)
            continue
        return GateRelease(GateOutcome.RELEASED, pod)
    return GateRelease(GateOutcome.KEPT_CHANGING, pod)
