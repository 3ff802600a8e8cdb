"""The gatekeeper's pods: the watch on Pending pods, and its one write, removing its scheduling gate from a pod
(rebuilding the patch after a conflict).

Its own module, not ``cluster``: the node agent imports ``cluster`` (the status publisher), and the RBAC scan in
``tests/deploy/test_deploy_manifests.py`` rightly counts every API call in the agent's modules as a right it needs;
the agent must not be granted ``patch pods`` nor a cluster-wide pod watch. The patch itself is pure
(``patcher.core.gates``); here it is sent, and a pod that changed meanwhile is read again. Failures leave as
``patcher.adapters.kube.errors`` classes.
"""

from __future__ import annotations

import enum
import functools
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from patcher.adapters.kube.backoff import Backoff
from patcher.adapters.kube.errors import Conflict, Invalid, NotFound, TooManyRequests, api_call
from patcher.adapters.kube.listwatch import ListWatcher
from patcher.adapters.kube.throttle import Throttle
from patcher.adapters.kube.transport import JSON_PATCH, PODS, Api
from patcher.core.gates import GatedPod, release_patch, slim
from patcher.core.kubeobj import Obj

log = logging.getLogger(__name__)

class GateOutcome(enum.Enum):
    """How a release ended (an API failure is raised instead: the caller retries later)."""

    RELEASED = "released"  #: our patch removed the gate
    NOT_WAITING = "not waiting"  #: the pod no longer waits on it: released by another, scheduled, or deleted
    KEPT_CHANGING = "kept changing"  #: every patch met a newer pod; try again on a later pass


@dataclass(frozen=True)
class GateRelease:
    """The outcome, and the pod as last read (for ``RELEASED``, the version the patch was built from)."""

    outcome: GateOutcome
    pod: GatedPod


#: The API server cannot select on ``spec.schedulingGates``; the narrowest it can do: pods not yet bound to a
#: node (``spec.nodeName=``, as the scheduler's own watch) in phase Pending. Both are among the field labels
#: kube-apiserver serves for pods (``metadata.name``/``namespace``, ``spec.nodeName``, ``spec.restartPolicy``,
#: ``spec.schedulerName``, ``spec.serviceAccountName``, ``spec.hostNetwork``, ``status.phase``,
#: ``status.podIP(s)``, ``status.nominatedNodeName``); any other answers 400. The caller filters the gates.
PENDING: Final = "status.phase=Pending,spec.nodeName="
#: Pods per page of the initial list: a backlog of 10 000 real pods is tens of MB of JSON in one answer, and
#: a page is decoded whole before it is slimmed: 100 pods (half a MB) keep that peak small.
PAGE_SIZE: Final = 100
#: 429 answers one release rides out (waiting the server's Retry-After each time) before it gives up
#: until the next pass.
MAX_THROTTLED: Final = 10
#: Seconds to wait after a 429 without a usable Retry-After (kube-apiserver's APF sends 1 s or more).
DEFAULT_RETRY_AFTER: Final = 1.0


def pending_pod_watchers(api: Api, namespaces: Sequence[str], *,
                         on_sync: Callable[[str | None, list[GatedPod]], None],
                         on_event: Callable[[str, GatedPod], None],
                         scheduler_names: Sequence[str], backoff: Backoff, failure_level: int) -> list[ListWatcher]:
    """Unbound Pending pods, as ``GatedPod``s (the rest of each pod is dropped as it arrives): one watcher per
    namespace (or one across the cluster for none) and per scheduler name (or any scheduler for none).
    ``on_sync(namespace or None, pods)`` after each list replaces that namespace's pods."""
    watchers = []
    scopes: list[str | None] = list(namespaces) or [None]
    schedulers: list[str | None] = list(scheduler_names) or [None]
    for ns in scopes:
        for scheduler in schedulers:
            label = ", ".join(x for x in (ns, scheduler and f"scheduler {scheduler}") if x)
            narrowed = f",spec.schedulerName={scheduler}" if scheduler else ""
            watchers.append(ListWatcher(api, PODS, ns, field_selector=PENDING + narrowed,
                                        name=f"watch pods ({label})" if label else "watch pods",
                                        on_sync=functools.partial(on_sync, ns), on_event=on_event,
                                        backoff=backoff.fresh(), failure_level=failure_level, page_size=PAGE_SIZE,
                                        transform=slim))
    return watchers


def release_gate(api: Api, pod: GatedPod | Obj, gate: str, *, attempts: int,
                 on_conflict: Callable[[], None] | None = None, throttle: Throttle | None = None,
                 on_throttled: Callable[[], None] | None = None) -> GateRelease:
    """Remove ``gate`` from ``pod`` with the patch of ``core.gates`` (it tests the gates it was built from).

    A 422 (the ``test`` failed) or a 409 means the pod changed since it was read: ``on_conflict()`` is called,
    the pod is read again and the patch rebuilt from it, up to ``attempts`` patches. A pod that is gone (404)
    no longer waits. Each request first takes a turn from ``throttle``; a 429 holds the throttle for the
    server's ``Retry-After`` (every worker waits, not only this one) and sends the same request again, up to
    ``MAX_THROTTLED`` times. Raises ``ApiError`` for any other failure of the patch or the read.

    The patch is serialised here and sent as bytes (``Api.send``, see ``kube.transport``): the generated
    method's per-call overhead would cost more CPU per released pod than the rest of the release.
    """
    view = pod if isinstance(pod, GatedPod) else slim(pod)
    where = f"{view.namespace}/{view.name}"

    limiter = throttle if throttle is not None else Throttle(1e6, 1_000_000)  # no limit, but 429s are obeyed

    def send(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        throttled = 0
        while True:
            limiter.acquire()
            try:
                with api_call(what):
                    return fn(*args, **kwargs)
            except TooManyRequests as exc:
                throttled += 1
                if on_throttled is not None:
                    on_throttled()
                if throttled > MAX_THROTTLED:
                    raise
                wait = exc.retry_after if exc.retry_after is not None else DEFAULT_RETRY_AFTER
                log.debug("%s: the API server asks to wait %.1fs", what, wait)
                limiter.hold(wait)

    try:
        for _ in range(attempts):
            if not view.waits_on(gate):
                return GateRelease(GateOutcome.NOT_WAITING, view)
            try:
                # The answer (the whole pod) is not decoded: the watch brings the change anyway.
                send(f"release pod {where}", api.send, "PATCH",
                     PODS.path(view.namespace, view.name),
                     json.dumps(release_patch(view, gate)).encode(), JSON_PATCH)
            except (Conflict, Invalid) as exc:  # the pod changed since we read it: read it again
                if on_conflict is not None:
                    on_conflict()
                log.debug("pod %s changed while we released it (%s); reading it again", where, exc.detail)
                view = slim(send(f"read pod {where}", api.get, PODS, view.name, namespace=view.namespace))
                continue
            return GateRelease(GateOutcome.RELEASED, view)
    except NotFound:  # the patch's or the read's: the pod is gone
        return GateRelease(GateOutcome.NOT_WAITING, view)
    return GateRelease(GateOutcome.KEPT_CHANGING, view)
