"""The cluster as the readiness verdict sees it: the API reads behind it, its watch, its ConfigMaps.

``collect`` lists the control-plane Nodes and reads the kube-scheduler pods (the labelled list, and by name
the unlabelled ones a ``schedindex.SchedulerIndex`` or a metadata-only list found), then hands them to the pure
``patcher.core.readiness.evaluate``; ``wait_ready``/``collect_retrying`` repeat it through API failures;
``publish_status`` writes the verdict into ConfigMaps (``scheduler-patcher-status``, and the csi-baremetal
``extender-readiness``) with a resourceVersion check, so several writers always leave the newest behind.
Every API failure leaves here as a ``patcher.adapters.kube.errors.ApiError``.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from typing import Final, TypeVar, cast

from patcher.adapters.kube.backoff import Backoff
from patcher.adapters.kube.errors import ApiError, Conflict, Forbidden, NotFound, api_json
from patcher.adapters.kube.listwatch import ListWatcher, pages
from patcher.adapters.kube.schedindex import PAGE, SchedulerIndex
from patcher.adapters.kube.transport import CONFIGMAPS, METADATA_LIST, NODES, PODS, Api, Resource
from patcher.core import restart
from patcher.core.kubeobj import Obj, dig, mirror_pod_name
from patcher.core.readiness import (
    COMPAT_KEY,
    COMPAT_NAME,
    DEFAULT_MIRROR_SELECTOR,
    DEFAULT_NODE_SELECTOR,
    ClusterVerdict,
    SchedulerPods,
    check_expected_hash,
    compat_nodes_yaml,
    evaluate,
    may_be_unlabelled_scheduler,
    node_selectors,
    scheduler_pods,
    status_data,
)
from patcher.core.status import DEFAULT_PREFIX

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_STATUS_NAME: Final = "scheduler-patcher-status"
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "scheduler-patcher"}


def fan_out(executor: Executor | None, calls: Sequence[Callable[[], T]]) -> list[T]:
    """The results of ``calls`` in their order: one after another without ``executor``, all at once on it.
    Every call has ended before this returns or raises: no read outlives the verdict it was made for."""
    if executor is None:
        return [call() for call in calls]
    futures = [executor.submit(call) for call in calls]
    concurrent.futures.wait(futures)
    return [f.result() for f in futures]


def _node_items(api: Api, selector: str) -> list[Obj]:
    body = api_json(f"list nodes ({selector})", api.list, NODES, label_selector=selector)
    return [i for i in body.get("items") or [] if isinstance(i, dict)]


def _merge_nodes(lists: Iterable[list[Obj]]) -> list[Obj]:
    """Each Node once (the first list that has it wins), sorted by name."""
    seen: dict[str, Obj] = {}
    for items in lists:
        for item in items:
            name = dig(item, "metadata", "name")
            if isinstance(name, str):
                seen.setdefault(name, item)
    return [seen[name] for name in sorted(seen)]


def _get_pod(api: Api, namespace: str, name: str) -> Obj | None:
    try:
        return cast(Obj, api_json(f"read pod {namespace}/{name}", api.get, PODS, name, namespace=namespace))
    except NotFound:
        return None


def list_pods(api: Api, namespace: str, label_selector: str) -> list[Obj]:
    """Every pod of ``namespace`` matching ``label_selector``, page by page."""
    what = f"list pods in {namespace} ({label_selector})"
    return [i for body in pages(what, api.list, PODS, PAGE, namespace=namespace, label_selector=label_selector)
            for i in body.get("items") or [] if isinstance(i, dict)]


def listed_candidates(api: Api, namespace: str, static_pod_name: str) -> list[str]:
    """The candidates a ``SchedulerIndex`` keeps, from one metadata-only list of ``namespace``, page by page: the
    one-shot read (``readiness``), and the fallback of an index that does not follow the server right now."""
    bodies = pages(f"list pods in {namespace} (metadata)", api.list, PODS, PAGE, namespace=namespace,
                   accept=METADATA_LIST)
    return sorted(str(dig(i, "metadata", "name")) for body in bodies for i in body.get("items") or []
                  if isinstance(i, dict) and may_be_unlabelled_scheduler(i.get("metadata") or {}, static_pod_name))


def listed_by_name(api: Api, resource: Resource, name: str, namespace: str | None = None) -> Obj | None:
    """One object by name (``None`` when absent), as a list with a ``metadata.name`` field selector: ``list``
    is what every verdict reader is granted (the agent has no ``get`` on pods, the gatekeeper none on Nodes);
    the server answers it from one key."""
    where = f" in {namespace}" if namespace else ""
    body = api_json(f"list {resource.plural}{where} (metadata.name={name})", api.list, resource,
                    namespace=namespace, field_selector=f"metadata.name={name}")
    items = [i for i in body.get("items") or [] if isinstance(i, dict) and dig(i, "metadata", "name") == name]
    return items[0] if items else None


def find_schedulers(api: Api, namespace: str, static_pod_name: str, executor: Executor | None = None,
                    index: SchedulerIndex | None = None) -> SchedulerPods | None:
    """Every static kube-scheduler pod in ``namespace``, whatever its node's labels; ``None`` when the caller
    may not list pods there.

    The labelled list finds kubeadm's and RKE2's schedulers; a Node-owned ``<static-pod-name>-<node>`` without
    the label (an owner cannot be selected server-side) is found among the namespace's metadata (``index``'s
    when it follows the server, else one metadata-only list) and read by name. With a fresh ``index`` the
    requests do not grow with the namespace. On ``executor`` the lists go at once, then the reads at once.
    """
    lists: list[Callable[[], object]] = [functools.partial(list_pods, api, namespace, DEFAULT_MIRROR_SELECTOR)]
    known = index.candidates() if index is not None else None
    if known is None:
        lists.append(functools.partial(listed_candidates, api, namespace, static_pod_name))
    try:
        answers = fan_out(executor, lists)
        labelled: list[Obj] = answers[0]  # type: ignore[assignment]
        names: list[str] = answers[1] if known is None else known  # type: ignore[assignment]
        have = {dig(p, "metadata", "name") for p in labelled}
        missing = [n for n in names if n not in have]
        read = fan_out(executor, [functools.partial(listed_by_name, api, PODS, n, namespace) for n in missing])
    except Forbidden:
        return None
    # In the namespace's order (by name), as the whole list gave them: the labelled ones and the candidates.
    node_owned = sorted([*labelled, *(p for p in read if p is not None)],
                        key=lambda p: str(dig(p, "metadata", "name")))
    return scheduler_pods(labelled, node_owned, static_pod_name=static_pod_name)


def collect(
    api: Api,
    *,
    prefix: str = DEFAULT_PREFIX,
    node_selector: str = DEFAULT_NODE_SELECTOR,
    legacy_master_label: bool = True,
    mirror_namespace: str = "kube-system",
    static_pod_name: str = "kube-scheduler",
    container_name: str = restart.DEFAULT_CONTAINER,
    expected_hash: str | None = None,
    executor: Executor | None = None,
    index: SchedulerIndex | None = None,
) -> ClusterVerdict:
    """Read the kube-scheduler pods and the control-plane Nodes and decide. Raises ``ApiError``.

    The verdict starts from the schedulers, not the node labels: a static kube-scheduler on a node the
    selector misses runs without the extender and without an agent, and must make the verdict NotReady.
    ``node_selector`` is unioned with the legacy ``node-role.kubernetes.io/master`` label unless
    ``legacy_master_label`` is false. A caller that may not list pods gets a GET per selected node's mirror
    pod and a problem (the schedulers elsewhere cannot be counted). With an ``executor`` the Node lists and the
    pod reads are sent at once (the gatekeeper's release pool is idle between its batches).
    """
    check_expected_hash(expected_hash)
    selectors = node_selectors(node_selector, legacy_master_label)
    if executor is None:
        nodes = _merge_nodes(_node_items(api, s) for s in selectors)
        found = find_schedulers(api, mirror_namespace, static_pod_name, index=index)
    else:
        node_reads = [executor.submit(_node_items, api, s) for s in selectors]
        try:
            found = find_schedulers(api, mirror_namespace, static_pod_name, executor, index)
        finally:
            concurrent.futures.wait(node_reads)  # no read outlives this verdict
        nodes = _merge_nodes(f.result() for f in node_reads)
    selected = {str(dig(n, "metadata", "name")) for n in nodes}
    problems: list[str] = []
    if found is None:
        pods = {node: _get_pod(api, mirror_namespace, mirror_pod_name(static_pod_name, node)) for node in selected}
        problems.append(f"cannot list pods in {mirror_namespace} (forbidden): kube-schedulers on nodes outside "
                        "the node selector cannot be counted")
        warnings: tuple[str, ...] = ()
    else:
        pods = dict(found.by_node)
        warnings = found.warnings
    outside = sorted(set(pods) - selected)
    # the Nodes only a scheduler pod led to; a bare stand-in for one that is gone (the pod alone makes the row)
    nodes = [*nodes, *(listed_by_name(api, NODES, name) or {"metadata": {"name": name}} for name in outside)]
    return evaluate(nodes, pods, prefix=prefix, expected_hash=expected_hash, static_pod_name=static_pod_name,
                    container_name=container_name, unselected=outside, problems=problems, warnings=warnings)


# --- watching -------------------------------------------------------------------------------------------


def node_watchers(api: Api, selectors: Sequence[str], *, on_sync: Callable[[list[Obj]], None],
                  on_event: Callable[[str, Obj], None], backoff: Backoff | None = None,
                  failure_level: int = logging.INFO) -> list[ListWatcher]:
    """One watcher per selector (not started): ``on_sync(nodes)`` after each list, ``on_event(kind, node)``
    for each change. ``readiness --wait`` and the gatekeeper both watch the control-plane Nodes this way."""
    return [
        ListWatcher(api, NODES, label_selector=sel, name=f"watch nodes ({sel})", on_sync=on_sync,
                    on_event=on_event, backoff=backoff.fresh() if backoff is not None else None,
                    failure_level=failure_level)
        for sel in selectors
    ]


def wait_ready(
    verdict_fn: Callable[[], ClusterVerdict],
    *,
    timeout: float,
    changed: threading.Event,
    poll_interval: float = 5.0,
    on_progress: Callable[[ClusterVerdict], None] | None = None,
) -> tuple[ClusterVerdict | None, ApiError | None]:
    """Re-evaluate until Ready or ``timeout``; return (last verdict, last error — ``None`` if the last try worked).
    ``changed`` is set by a Node watch; ``poll_interval`` bounds the wait anyway, because a mirror pod can
    change (a scheduler crash) without its Node changing. API errors are retried with backoff."""
    deadline = time.monotonic() + timeout
    retry = Backoff(0.5, 10.0)
    last: ClusterVerdict | None = None
    while True:
        changed.clear()
        error: ApiError | None = None
        try:
            verdict = verdict_fn()
        except ApiError as exc:
            error = exc
        else:
            retry.reset()
            if on_progress is not None and (last is None or verdict.explain() != last.explain()):
                on_progress(verdict)
            last = verdict
            if verdict.ready:
                return verdict, None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return last, error
        delay = retry.next_delay() if error is not None else poll_interval
        changed.wait(min(delay, remaining))


def collect_retrying(verdict_fn: Callable[[], ClusterVerdict]) -> tuple[ClusterVerdict | None, ApiError | None]:
    """One verdict, tolerating two API failures (a single 503 while an apiserver restarts is routine)."""
    retry = Backoff(0.25, 2.0)
    error: ApiError | None = None
    for attempt in range(3):
        try:
            return verdict_fn(), None
        except ApiError as exc:
            error = exc
            if attempt < 2:
                time.sleep(retry.next_delay())
    return None, error


# --- publishing -----------------------------------------------------------------------------------------


def _upsert_configmap(api: Api, namespace: str, name: str, make_data: Callable[[], dict[str, str]],
                      attempts: int = 5) -> bool:
    """Create or update ``name`` so that its data includes ``make_data()``, called after each read (409 → read
    again), so what lands is never older than the version it replaces; True when something was written."""
    where = f"{namespace}/{name}"
    for _ in range(attempts):
        try:
            current: Obj | None = api_json(f"read ConfigMap {where}", api.get, CONFIGMAPS, name, namespace=namespace)
        except NotFound:
            current = None
        data = make_data()
        try:
            if current is None:
                body = {"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": name, "namespace": namespace, "labels": dict(MANAGED_BY)}, "data": data}
                api_json(f"create ConfigMap {where}", api.create, CONFIGMAPS, body, namespace=namespace)
                return True
            old = current.get("data") or {}
            if all(old.get(k) == v for k, v in data.items()):
                return False
            current["data"] = {**old, **data}
            api_json(f"update ConfigMap {where}", api.update, CONFIGMAPS, name, current, namespace=namespace)
            return True
        except Conflict:  # changed since we read it, or created by another agent meanwhile
            log.debug("ConfigMap %s changed concurrently; reading it again", where)
    raise Conflict(f"update ConfigMap {where}", f"still conflicting after {attempts} attempts", 409)


def publish_status(
    api: Api,
    verdict: ClusterVerdict | Callable[[], ClusterVerdict],
    *,
    namespace: str,
    compat_csi_baremetal: bool = False,
    compat_namespace: str | None = None,
) -> ClusterVerdict:
    """Write the verdict to the status ConfigMap (and ``extender-readiness`` with compat); return what was written.

    Several writers pass a callable (``lambda: collect(api, ...)``): it is evaluated after each read, so no
    agent overwrites a newer verdict with an older one. ``compat_namespace``: where the csi-baremetal extender
    mounts ``extender-readiness`` (default ``namespace``). Raises ``ApiError`` (the caller retries).
    """
    latest: list[ClusterVerdict] = []

    def current() -> ClusterVerdict:
        v = verdict() if callable(verdict) else verdict
        latest.append(v)
        return v

    _upsert_configmap(api, namespace, DEFAULT_STATUS_NAME, lambda: status_data(current()))
    if compat_csi_baremetal:
        _upsert_configmap(api, compat_namespace or namespace, COMPAT_NAME,
                          lambda: {COMPAT_KEY: compat_nodes_yaml(current())})
    return latest[-1]


