"""The gatekeeper's one write: remove its scheduling gate from a pod, rebuilding the patch after a conflict.

Its own module, not ``cluster``: the node agent imports ``cluster`` (the status publisher), and the RBAC scan in
``tests/test_deploy_manifests.py`` rightly counts every API call in the agent's modules as a right it needs;
the agent must not be granted ``patch pods``. The patch itself is pure (``patcher.core.gates``); here it is
sent, and a pod that changed meanwhile is read again. Failures leave as ``patcher.adapters.kube.errors`` classes.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from kubernetes import client as k8s

from patcher.adapters.kube.errors import Conflict, Invalid, NotFound, api_json
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


def release_gate(core: k8s.CoreV1Api, pod: Obj, gate: str, *, attempts: int,
                 on_conflict: Callable[[], None] | None = None) -> GateRelease:
    """Remove ``gate`` from ``pod`` with the patch of ``core.gates`` (it tests the gates it was built from).

    A 422 (the ``test`` failed) or a 409 means the pod changed since it was read: ``on_conflict()`` is called,
    the pod is read again and the patch rebuilt from it, up to ``attempts`` patches. A pod that is gone (404)
    no longer waits. Raises ``ApiError`` for any other failure of the patch or the read.
    """
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
