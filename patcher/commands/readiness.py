"""The cluster readiness verdict: is every control-plane scheduler running the expected config?

Each agent only knows its own node. This module reads every control-plane Node's ``scheduler-patcher.io/``
annotations and the kube-scheduler mirror pods, and decides for the cluster: ``Ready`` only when every node
says ``Ready`` with the same (or the expected) config hash *and* its mirror pod proves it — the marker with
that hash, a running scheduler started no earlier than the manifest write, the pod Ready. The node's word
alone is not enough: an agent that died after writing ``Ready`` would keep saying so while the kubelet runs
something else. The mirror-pod proof is ``patcher.restart.decide``, the same rule the agent itself applies.

Three consumers share the verdict:

* ``scheduler-patcher readiness`` prints it (table or JSON), and with ``--wait`` blocks until Ready — a Helm
  hook or a CI step can wait for "every scheduler has the extender" with one command;
* ``publish_status`` writes it into ConfigMaps for readers that cannot run our code: our own
  ``scheduler-patcher-status`` and, for the csi-baremetal operator's scheduler extender, ``extender-readiness``
  in the shape its health server reads;
* the gatekeeper releases scheduling gates only while it is Ready.

The verdict is computed from the API only; it never trusts a cached ConfigMap, so any copy can be checked
against the source of truth by running the command.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, TextIO

from kubernetes import client as k8s
from ruamel.yaml import YAML

from patcher.adapters.kube.annotations import annotation_snapshot
from patcher.adapters.kube.backoff import Backoff
from patcher.adapters.kube.client import (
    API_ERRORS,
    ApiConfigError,
    ClientSettings,
    build_api_client,
    describe_error,
    error_status,
)
from patcher.adapters.kube.listwatch import ListWatcher, dig
from patcher.adapters.kube.mirrorpod import mirror_pod_name
from patcher.core import manifest, restart
from patcher.core.status import DEFAULT_PREFIX, NodeState, normalize_prefix
from patcher.core.timefmt import parse_rfc3339_ns

log = logging.getLogger(__name__)

Obj = dict[str, Any]

DEFAULT_NODE_SELECTOR: Final = "node-role.kubernetes.io/control-plane"
#: kubeadm labelled control-plane nodes only ``node-role.kubernetes.io/master`` before 1.20 and both until 1.24;
#: clusters upgraded since may still carry only the old one.
LEGACY_MASTER_SELECTOR: Final = "node-role.kubernetes.io/master"
#: kubeadm's label on the scheduler's static pod (also what the csi-baremetal operator selects on).
DEFAULT_MIRROR_SELECTOR: Final = "component=kube-scheduler"
DEFAULT_STATUS_NAME: Final = "scheduler-patcher-status"
STATUS_KEY: Final = "status.json"
#: The csi-baremetal contract (operator ``pkg/patcher/extender_readiness.go``, extender
#: ``pkg/scheduler/extender/healthserver``): ConfigMap ``extender-readiness``, key ``nodes.yaml``, mounted at
#: ``/status`` in the extender pods.
COMPAT_NAME: Final = "extender-readiness"
COMPAT_KEY: Final = "nodes.yaml"
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "scheduler-patcher"}

EXIT_READY, EXIT_NOT_READY = 0, 1
_HASH = re.compile(rf"[0-9a-fA-F]{{{restart.MIN_HASH_DIGITS},64}}")


class ReadinessError(Exception):
    """An API request needed for the verdict (or for publishing it) failed; ``status`` is its HTTP code."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


# --- the verdict ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeRow:
    """What one control-plane node says about itself, what its mirror pod shows, and whether they agree."""

    node: str
    state: str | None
    #: Fingerprint of the ConfigMap the config was rendered from: the same on every node for one ConfigMap.
    source_hash: str | None
    #: The rendered file the scheduler runs: differs between nodes on different kube-scheduler versions.
    config_hash: str | None
    manifest_mtime: str | None
    scheduler_started: str | None
    restarted_at: str | None
    message: str | None
    #: The mirror pod's name when the pod exists (the csi-baremetal ``kube_scheduler`` field).
    mirror_pod: str | None
    ready: bool
    #: Why the node is not ready (empty when it is).
    reason: str = ""

    def to_dict(self) -> Obj:
        return {
            "node": self.node, "state": self.state, "sourceHash": self.source_hash, "configHash": self.config_hash,
            "manifestMtime": self.manifest_mtime, "schedulerStarted": self.scheduler_started,
            "restartedAt": self.restarted_at, "message": self.message, "mirrorPod": self.mirror_pod,
            "ready": self.ready, "reason": self.reason or None,
        }


@dataclass(frozen=True)
class Verdict:
    """The rows (sorted by node name), the hash they were held against, and cluster-level problems."""

    rows: tuple[NodeRow, ...]
    #: ``--expected-hash`` when given, else the one source hash (config hash for agents that publish none)
    #: every node agrees on; ``None`` when they do not.
    expected_hash: str | None
    #: Reasons that concern the cluster rather than one node (no nodes found, nodes disagree on the hash).
    problems: tuple[str, ...] = field(default=())

    @property
    def ready(self) -> bool:
        return bool(self.rows) and not self.problems and all(r.ready for r in self.rows)

    def not_ready(self) -> list[NodeRow]:
        return [r for r in self.rows if not r.ready]

    def summary(self) -> str:
        """One line: ``Ready: 3/3 nodes run config 0123456789ab`` or ``NotReady: …``."""
        ready = sum(r.ready for r in self.rows)
        config = f" config {self.expected_hash[:restart.MIN_HASH_DIGITS]}" if self.expected_hash else ""
        if self.ready:
            return f"Ready: {ready}/{len(self.rows)} nodes run{config}"
        return f"NotReady: {ready}/{len(self.rows)} nodes ready" + (f" for{config}" if config else "")

    def explain(self) -> list[str]:
        """One line per problem: the cluster-level ones first, then ``<node>: <reason>``."""
        return [*self.problems, *(f"{r.node}: {r.reason}" for r in self.not_ready())]

    def to_dict(self) -> Obj:
        return {
            "ready": self.ready, "expectedHash": self.expected_hash, "summary": self.summary(),
            "problems": list(self.problems), "nodes": [r.to_dict() for r in self.rows],
        }


def _started_at(pod: Mapping[str, Any] | None, container: str) -> str | None:
    if pod is None:
        return None
    status = restart.container_status(pod, container)
    value = dig(status, "state", "running", "startedAt")
    return value if isinstance(value, str) and value else None


def _row(node: Obj, pod: Obj | None, *, prefix: str, expected: str | None, static_pod_name: str,
         container: str) -> NodeRow:
    name = str(dig(node, "metadata", "name"))
    ann = annotation_snapshot(node, prefix)
    state, config_hash = ann.get("state"), ann.get("config-hash") or None
    source_hash = ann.get("source-hash") or None
    mtime, message = ann.get("manifest-mtime") or None, ann.get("message") or None
    pod_name = mirror_pod_name(static_pod_name, name)
    row = NodeRow(node=name, state=state, source_hash=source_hash, config_hash=config_hash, manifest_mtime=mtime,
                  scheduler_started=_started_at(pod, container), restarted_at=ann.get("restarted-at") or None,
                  message=message, mirror_pod=pod_name if pod is not None else None, ready=False)

    def not_ready(reason: str) -> NodeRow:
        return replace(row, reason=reason)

    digits = restart.MIN_HASH_DIGITS

    if not ann:
        return not_ready("no scheduler-patcher annotations (is the agent running on this node?)")
    if state != NodeState.READY:
        return not_ready(f"state is {state or 'unset'}" + (f": {message}" if message else ""))
    if config_hash is None:
        return not_ready("no config-hash annotation")
    if expected is not None and not any(h and restart.hashes_match(h, expected) for h in (source_hash, config_hash)):
        runs = f"source {source_hash[:digits]} (config {config_hash[:digits]})" if source_hash else \
            f"config {config_hash[:digits]}"
        return not_ready(f"runs {runs}, expected {expected[:digits]}")
    try:
        mtime_ns = parse_rfc3339_ns(mtime) if mtime else None
    except ValueError:
        mtime_ns = None
    if mtime_ns is None:
        return not_ready("no valid manifest-mtime annotation")
    # The proof is against the node's own config hash (the marker carries its first digits), whatever the
    # expected hash named. The baseline is the pod as it is now: a scheduler that restarted since (it exits
    # when it loses its leader election, routinely) still runs our config; crash loops show as waiting or
    # terminated, never as Ready.
    decision = restart.decide(pod, marker_key=manifest.marker_key(prefix.rstrip("/")), expected_hash=config_hash,
                              manifest_mtime_ns=mtime_ns, baseline=restart.Baseline.of(pod, container),
                              container_name=container)
    if not decision.ready:
        return not_ready(f"mirror pod {pod_name}: {decision.reason}")
    return replace(row, ready=True)


def evaluate(
    nodes: Iterable[Obj],
    mirror_pods: Mapping[str, Obj | None],
    *,
    prefix: str = DEFAULT_PREFIX,
    expected_hash: str | None = None,
    static_pod_name: str = "kube-scheduler",
    container_name: str = restart.DEFAULT_CONTAINER,
) -> Verdict:
    """The verdict for ``nodes`` (Node objects as dicts) and their mirror pods keyed by node name. Pure.

    Without ``expected_hash`` the nodes must agree on one config: during a rollout half the nodes run the new
    config and half the old one, each of them "Ready", and that is exactly the state not to call Ready. They
    are compared by ``source-hash`` (the ConfigMap they rendered from), not ``config-hash``: nodes on different
    kube-scheduler versions (mid-upgrade) render one ConfigMap into different files, legitimately. An agent
    that publishes no ``source-hash`` is compared by its ``config-hash``. ``expected_hash`` (12 to 64 hex
    digits) may name either hash.
    """
    p = normalize_prefix(prefix)
    ordered = sorted(nodes, key=lambda n: str(dig(n, "metadata", "name")))
    problems: list[str] = []
    expected = expected_hash.lower() if expected_hash else None
    if not ordered:
        problems.append("no control-plane nodes found")
    if expected is None:
        by_hash: dict[str, list[str]] = {}
        for node in ordered:
            ann = annotation_snapshot(node, p)
            h = ann.get("source-hash") or ann.get("config-hash")
            if h:
                by_hash.setdefault(h.lower(), []).append(str(dig(node, "metadata", "name")))
        if len(by_hash) == 1:
            expected = next(iter(by_hash))
        elif len(by_hash) > 1:
            problems.append("nodes disagree on the config: " + "; ".join(
                f"{h[:restart.MIN_HASH_DIGITS]} on {', '.join(names)}" for h, names in by_hash.items()))
    rows = tuple(
        _row(node, mirror_pods.get(str(dig(node, "metadata", "name"))), prefix=p, expected=expected,
             static_pod_name=static_pod_name, container=container_name)
        for node in ordered
    )
    return Verdict(rows=rows, expected_hash=expected, problems=tuple(problems))


# --- reading the cluster ------------------------------------------------------------------------------


def api_json(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a client method for its raw JSON body; every failure becomes one ``ReadinessError`` line."""
    try:
        resp = fn(*args, _preload_content=False, **kwargs)
        return json.loads(resp.data)
    except API_ERRORS as exc:
        raise ReadinessError(f"cannot {what}: {describe_error(exc)}", error_status(exc)) from exc


def node_selectors(node_selector: str = DEFAULT_NODE_SELECTOR, legacy_master_label: bool = True) -> list[str]:
    """The label selectors whose union is "the control-plane nodes" (Kubernetes has no OR in one selector)."""
    selectors = [node_selector]
    if legacy_master_label and LEGACY_MASTER_SELECTOR not in selectors:
        selectors.append(LEGACY_MASTER_SELECTOR)
    return selectors


def list_nodes(core: k8s.CoreV1Api, selectors: Sequence[str]) -> list[Obj]:
    """Nodes matching any of ``selectors``, each once, sorted by name."""
    seen: dict[str, Obj] = {}
    for selector in selectors:
        body = api_json(f"list nodes ({selector})", core.list_node, label_selector=selector)
        for item in body.get("items") or []:
            name = dig(item, "metadata", "name")
            if isinstance(name, str):
                seen.setdefault(name, item)
    return [seen[name] for name in sorted(seen)]


def read_mirror_pods(core: k8s.CoreV1Api, namespace: str, pod_names: Iterable[str],
                     label_selector: str | None = DEFAULT_MIRROR_SELECTOR) -> dict[str, Obj | None]:
    """The named pods (``None`` when absent): one labelled list, then a GET for each one the list missed.

    The list is the cheap path for kubeadm clusters; the GETs cover static pods without kubeadm's label and
    callers allowed to ``get`` but not ``list`` pods in that namespace.
    """
    wanted = set(pod_names)
    found: dict[str, Obj | None] = {}
    if label_selector:
        try:
            body = api_json(f"list pods in {namespace} ({label_selector})", core.list_namespaced_pod, namespace,
                            label_selector=label_selector)
        except ReadinessError as exc:
            if exc.status != 403:
                raise
            body = {}
        for item in body.get("items") or []:
            name = dig(item, "metadata", "name")
            if name in wanted:
                found[name] = item
    for name in sorted(wanted - found.keys()):
        try:
            found[name] = api_json(f"read pod {namespace}/{name}", core.read_namespaced_pod, name, namespace)
        except ReadinessError as exc:
            if exc.status != 404:
                raise
            found[name] = None
    return found


def check_expected_hash(value: str | None) -> None:
    """Raise ``ValueError`` unless ``value`` is ``None`` or 12 to 64 hex digits (fewer could match by accident)."""
    if value is not None and not _HASH.fullmatch(value):
        raise ValueError(f"the expected config hash must be {restart.MIN_HASH_DIGITS} to 64 hex digits, "
                         f"got {value!r}")


def collect(
    api: k8s.ApiClient,
    *,
    prefix: str = DEFAULT_PREFIX,
    node_selector: str = DEFAULT_NODE_SELECTOR,
    legacy_master_label: bool = True,
    mirror_namespace: str = "kube-system",
    static_pod_name: str = "kube-scheduler",
    mirror_label_selector: str | None = DEFAULT_MIRROR_SELECTOR,
    container_name: str = restart.DEFAULT_CONTAINER,
    expected_hash: str | None = None,
) -> Verdict:
    """Read the control-plane Nodes and their mirror pods and decide. Raises ``ReadinessError``.

    ``node_selector`` is unioned with the legacy ``node-role.kubernetes.io/master`` label unless
    ``legacy_master_label`` is false. Requests: one Node list per selector, one pod list, a GET per mirror
    pod the list did not return.
    """
    check_expected_hash(expected_hash)
    core = k8s.CoreV1Api(api)
    nodes = list_nodes(core, node_selectors(node_selector, legacy_master_label))
    names = {str(dig(n, "metadata", "name")): mirror_pod_name(static_pod_name, str(dig(n, "metadata", "name")))
             for n in nodes}
    pods = read_mirror_pods(core, mirror_namespace, names.values(), mirror_label_selector) if names else {}
    return evaluate(nodes, {node: pods.get(pod) for node, pod in names.items()}, prefix=prefix,
                    expected_hash=expected_hash, static_pod_name=static_pod_name, container_name=container_name)


# --- watching -------------------------------------------------------------------------------------------


def node_watchers(api: k8s.ApiClient, selectors: Sequence[str], on_change: Callable[[], None], *,
                  backoff: Backoff | None = None) -> list[ListWatcher]:
    """One watcher per selector calling ``on_change()`` on every list and Node event (not started)."""
    core = k8s.CoreV1Api(api)
    return [
        ListWatcher(core.list_node, label_selector=sel, name=f"watch nodes ({sel})",
                    on_sync=lambda _items: on_change(), on_event=lambda _kind, _obj: on_change(),
                    backoff=backoff.fresh() if backoff is not None else None)
        for sel in selectors
    ]


def wait_ready(
    verdict_fn: Callable[[], Verdict],
    *,
    timeout: float,
    changed: threading.Event,
    poll_interval: float = 5.0,
    backoff: Backoff | None = None,
    on_progress: Callable[[Verdict], None] | None = None,
) -> tuple[Verdict | None, ReadinessError | None]:
    """Re-evaluate until Ready or ``timeout``; return (last verdict, last error — ``None`` if the last try worked).

    ``changed`` is set by a Node watch; ``poll_interval`` bounds the wait between evaluations anyway, because
    a mirror pod can change (a scheduler crash) without its Node changing. API errors are retried with backoff
    until the deadline.
    """
    deadline = time.monotonic() + timeout
    retry = backoff if backoff is not None else Backoff(0.5, 10.0)
    last: Verdict | None = None
    while True:
        changed.clear()
        error: ReadinessError | None = None
        try:
            verdict = verdict_fn()
        except ReadinessError as exc:
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


def collect_retrying(verdict_fn: Callable[[], Verdict], *, attempts: int = 3,
                     backoff: Backoff | None = None) -> tuple[Verdict | None, ReadinessError | None]:
    """One verdict, tolerating a few API failures (a single 503 while an apiserver restarts is routine)."""
    retry = backoff if backoff is not None else Backoff(0.25, 2.0)
    error: ReadinessError | None = None
    for attempt in range(attempts):
        try:
            return verdict_fn(), None
        except ReadinessError as exc:
            error = exc
            if attempt + 1 < attempts:
                time.sleep(retry.next_delay())
    return None, error


# --- output ---------------------------------------------------------------------------------------------

_COLUMNS: Final = ("NODE", "STATE", "SOURCE-HASH", "CONFIG-HASH", "MANIFEST-MTIME", "SCHEDULER-STARTED", "RESTARTED-AT",
                   "READY", "MESSAGE")


def render_table(verdict: Verdict) -> str:
    """The human form: one row per node, the overall verdict, then why each node is not ready."""
    rows = [
        (r.node, r.state or "-", (r.source_hash or "-")[:restart.MIN_HASH_DIGITS],
         (r.config_hash or "-")[:restart.MIN_HASH_DIGITS], r.manifest_mtime or "-",
         r.scheduler_started or "-", r.restarted_at or "-", "yes" if r.ready else "no", r.message or "-")
        for r in verdict.rows
    ]
    widths = [max([len(c), *(len(row[i]) for row in rows)]) for i, c in enumerate(_COLUMNS)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
             for line in [_COLUMNS, *rows]]
    lines.append(f"verdict: {verdict.summary()}")
    lines.extend(f"  {reason}" for reason in verdict.explain())
    return "\n".join(lines) + "\n"


def render_json(verdict: Verdict) -> str:
    return json.dumps(verdict.to_dict(), indent=2, sort_keys=True) + "\n"


def compat_nodes_yaml(verdict: Verdict) -> str:
    """``nodes.yaml`` as csi-baremetal reads it: ``nodes: [{node_name, kube_scheduler, restarted}]``.

    ``kube_scheduler`` is the scheduler's (mirror) pod name and ``restarted`` whether that scheduler runs the
    patched config — the operator writes the pod name and "started after the config changed"; the extender's
    health check on each control-plane node looks up its own ``node_name`` and serves only when ``restarted``
    is true (a node missing from the list also fails it). Every control-plane node is listed, with an empty
    ``kube_scheduler`` when its mirror pod does not exist, so that case reads as "not restarted".
    """
    nodes = [{"node_name": r.node, "kube_scheduler": r.mirror_pod or "", "restarted": r.ready} for r in verdict.rows]
    out = io.StringIO()
    YAML().dump({"nodes": nodes}, out)  # round-trip dumper: keeps the operator's field order
    return out.getvalue()


# --- publishing -----------------------------------------------------------------------------------------


def _status_data(verdict: Verdict) -> dict[str, str]:
    return {
        STATUS_KEY: render_json(verdict),
        "ready": "true" if verdict.ready else "false",
        "expected-hash": verdict.expected_hash or "",
    }


def _upsert_configmap(core: k8s.CoreV1Api, namespace: str, name: str, make_data: Callable[[], dict[str, str]],
                      attempts: int) -> bool:
    """Create or update ``name`` so that its data includes ``make_data()``; True when something was written.

    ``make_data`` is called after the ConfigMap is read and again after every conflict, so what lands is never
    older than the version it replaces. Updates carry the resourceVersion that was read (409 → read again);
    other keys, labels and owners are kept. Nothing is written when the data is already there.
    """
    where = f"{namespace}/{name}"
    for _ in range(attempts):
        try:
            current: Obj | None = api_json(f"read ConfigMap {where}", core.read_namespaced_config_map, name, namespace)
        except ReadinessError as exc:
            if exc.status != 404:
                raise
            current = None
        data = make_data()
        try:
            if current is None:
                body = {"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": name, "namespace": namespace, "labels": dict(MANAGED_BY)}, "data": data}
                api_json(f"create ConfigMap {where}", core.create_namespaced_config_map, namespace,
                         k8s.V1ConfigMap.model_validate(body))
                return True
            old = current.get("data") or {}
            if all(old.get(k) == v for k, v in data.items()):
                return False
            current["data"] = {**old, **data}
            api_json(f"update ConfigMap {where}", core.replace_namespaced_config_map, name, namespace,
                     k8s.V1ConfigMap.model_validate(current))
            return True
        except ReadinessError as exc:
            if exc.status != 409:  # 409: changed since we read it, or created by another agent meanwhile
                raise
            log.debug("ConfigMap %s changed concurrently; reading it again", where)
    raise ReadinessError(f"cannot update ConfigMap {where}: still conflicting after {attempts} attempts", 409)


def publish_status(
    api: k8s.ApiClient,
    verdict: Verdict | Callable[[], Verdict],
    *,
    namespace: str,
    name: str = DEFAULT_STATUS_NAME,
    compat_csi_baremetal: bool = False,
    compat_namespace: str | None = None,
    attempts: int = 5,
) -> Verdict:
    """Write the verdict to ConfigMap ``name`` (and ``extender-readiness`` with compat); return what was written.

    Pass a callable (e.g. ``lambda: collect(api, ...)``) rather than a verdict when several writers publish:
    it is evaluated after each ConfigMap is read and again after a conflict, so with the resourceVersion check
    the last successful write is always based on a read made after every earlier write — no agent can
    overwrite a newer verdict with the older one it computed before. ``compat_namespace`` is where the
    csi-baremetal extender mounts ``extender-readiness`` (its Deployment's namespace; default ``namespace``).
    Raises ``ReadinessError`` for an API failure (the caller retries).
    """
    core = k8s.CoreV1Api(api)
    latest: list[Verdict] = []

    def current() -> Verdict:
        v = verdict() if callable(verdict) else verdict
        latest.append(v)
        return v

    _upsert_configmap(core, namespace, name, lambda: _status_data(current()), attempts)
    if compat_csi_baremetal:
        _upsert_configmap(core, compat_namespace or namespace, COMPAT_NAME,
                          lambda: {COMPAT_KEY: compat_nodes_yaml(current())}, attempts)
    return latest[-1]


# --- command line ---------------------------------------------------------------------------------------


def add_verdict_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``readiness`` and ``gatekeeper``: where the verdict's inputs are."""
    from patcher.commands.flags import Flags, boolean

    f = Flags(p)
    f.add("--kubeconfig", os.environ.get("KUBECONFIG"), "kubeconfig for runs outside the cluster")
    f.add("--annotation-prefix", "scheduler-patcher.io", "prefix of the agents' Node annotations")
    f.add("--node-selector", DEFAULT_NODE_SELECTOR, "label selector of the control-plane nodes")
    f.add("--legacy-master-label", "true", f"also count nodes labelled {LEGACY_MASTER_SELECTOR}", type=boolean)
    f.add("--mirror-namespace", "kube-system", "namespace of the kube-scheduler mirror pods")
    f.add("--static-pod-name", "kube-scheduler", "name of the scheduler static pod (mirror pods: <name>-<node>)")
    f.add("--container-name", restart.DEFAULT_CONTAINER, "the scheduler container in the mirror pod")
    f.add("--expected-hash", None, "source-hash (or config-hash) every node must run, 12 to 64 hex digits "
          "(default: the one they all agree on)")


def verdict_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``collect`` keyword arguments from the flags of ``add_verdict_arguments``."""
    return {
        "prefix": args.annotation_prefix, "node_selector": args.node_selector,
        "legacy_master_label": args.legacy_master_label, "mirror_namespace": args.mirror_namespace,
        "static_pod_name": args.static_pod_name, "container_name": args.container_name,
        "expected_hash": args.expected_hash or None,
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``scheduler-patcher readiness``."""
    from patcher.commands.flags import Flags, boolean, duration

    add_verdict_arguments(p)
    f = Flags(p)
    f.add("--output", "text", "output format", "-o", choices=["text", "json", "yaml"])
    f.add("--wait", "false", "block until the cluster is Ready or --timeout passes", type=boolean, nargs="?",
          const=True)
    f.add("--timeout", "10m", "how long --wait waits", type=duration)
    f.add("--poll-interval", "5s", "with --wait, re-check at least this often (mirror pods are not watched)",
          type=duration)


def _fail(message: str, err: TextIO) -> int:
    err.write(f"scheduler-patcher: error: {message}\n")
    return EXIT_NOT_READY


def main(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``scheduler-patcher readiness``: exit 0 when the cluster is Ready, 1 when not (or the API fails)."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        check_expected_hash(args.expected_hash or None)
    except ValueError as exc:
        return _fail(f"--expected-hash: {exc}", err)
    try:
        api = build_api_client(ClientSettings(kubeconfig=args.kubeconfig))
    except ApiConfigError as exc:
        return _fail(str(exc), err)
    kwargs = verdict_kwargs(args)

    def verdict_fn() -> Verdict:
        return collect(api, **kwargs)

    watchers: list[ListWatcher] = []
    error: ReadinessError | None = None
    try:
        if args.wait:
            changed = threading.Event()
            watchers = node_watchers(api, node_selectors(args.node_selector, args.legacy_master_label), changed.set)
            for w in watchers:
                w.start()

            def progress(v: Verdict) -> None:
                if not v.ready and args.output == "text":
                    err.write(f"waiting: {v.summary()}" + "".join(f"; {r}" for r in v.explain()) + "\n")

            verdict, error = wait_ready(verdict_fn, timeout=args.timeout, changed=changed,
                                        poll_interval=args.poll_interval, on_progress=progress)
        else:
            verdict, error = collect_retrying(verdict_fn)
    finally:
        for w in watchers:
            w.stop()
        api.close()
    if verdict is None:
        return _fail(str(error) if error is not None else "no verdict", err)
    if args.output == "yaml":
        from patcher.commands.flags import emit

        emit(json.loads(render_json(verdict)), "yaml", out)
    else:
        out.write(render_json(verdict) if args.output == "json" else render_table(verdict))
    if verdict.ready:
        return EXIT_READY
    if args.wait:
        last = f" (the last attempt failed: {error})" if error is not None else ""
        err.write(f"scheduler-patcher: not ready after {args.timeout:g}s{last}: " + "; ".join(verdict.explain())
                  + "\n")
    return EXIT_NOT_READY
