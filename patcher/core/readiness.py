"""The cluster readiness verdict: is every control-plane scheduler running the expected config? Pure.

A node's own ``Ready`` is not enough: an agent that died after writing it would keep saying so while the
kubelet runs something else. So a node counts only when its mirror pod proves it too, by the same rule the
agent applies to its own node (``patcher.core.restart.decide``). The verdict is computed from the API objects
only, never from a published ConfigMap, so any copy can be checked against the source of truth.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from ruamel.yaml import YAML

from patcher.core import manifestedit, restart
from patcher.core.kubeobj import Obj, dig, mirror_pod_name
from patcher.core.status import DEFAULT_PREFIX, NodeState, annotation_snapshot, normalize_prefix
from patcher.core.timefmt import parse_rfc3339_ns

DEFAULT_NODE_SELECTOR: Final = "node-role.kubernetes.io/control-plane"
#: kubeadm labelled control-plane nodes only ``node-role.kubernetes.io/master`` before 1.20 and both until 1.24;
#: clusters upgraded since may still carry only the old one.
LEGACY_MASTER_SELECTOR: Final = "node-role.kubernetes.io/master"
#: kubeadm's label on the scheduler's static pod (also what the csi-baremetal operator selects on).
DEFAULT_MIRROR_SELECTOR: Final = "component=kube-scheduler"
#: The csi-baremetal contract (operator ``pkg/patcher/extender_readiness.go``, extender
#: ``pkg/scheduler/extender/healthserver``): ConfigMap ``extender-readiness``, key ``nodes.yaml``, mounted at
#: ``/status`` in the extender pods.
COMPAT_NAME: Final = "extender-readiness"
COMPAT_KEY: Final = "nodes.yaml"

_HASH = re.compile(rf"[0-9a-fA-F]{{{restart.MIN_HASH_DIGITS},64}}")


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
    #: False for a node found only through the scheduler pod running on it (outside the node selector).
    selected: bool = True

    def to_dict(self) -> Obj:
        return {
            "node": self.node, "state": self.state, "sourceHash": self.source_hash, "configHash": self.config_hash,
            "manifestMtime": self.manifest_mtime, "schedulerStarted": self.scheduler_started,
            "restartedAt": self.restarted_at, "message": self.message, "mirrorPod": self.mirror_pod,
            "ready": self.ready, "reason": self.reason or None, "selected": self.selected,
        }


@dataclass(frozen=True)
class ClusterVerdict:
    """The rows (sorted by node name), the hash they were held against, and cluster-level problems."""

    rows: tuple[NodeRow, ...]
    #: ``--expected-hash`` when given, else the one source hash (config hash for agents that publish none)
    #: every node agrees on; ``None`` when they do not.
    expected_hash: str | None
    #: Reasons that concern the cluster rather than one node (no nodes found, nodes disagree on the hash).
    problems: tuple[str, ...] = field(default=())
    #: Worth an operator's attention, no reason for NotReady by themselves (a scheduler pod on a node the
    #: DaemonSet's default placement misses: its row says whether an agent reports there anyway).
    warnings: tuple[str, ...] = field(default=())

    @property
    def ready(self) -> bool:
        return bool(self.rows) and not self.problems and all(r.ready for r in self.rows)

    def not_ready(self) -> list[NodeRow]:
        return [r for r in self.rows if not r.ready]

    def hash_kind(self) -> str:
        """``config`` when ``expected_hash`` is only some node's config hash, else ``source``."""
        e = (self.expected_hash or "").lower()
        if any(r.source_hash and r.source_hash.lower().startswith(e) for r in self.rows):
            return "source"
        if any(r.config_hash and r.config_hash.lower().startswith(e) for r in self.rows):
            return "config"
        return "source"

    def summary(self) -> str:
        """One line: ``Ready: 3/3 nodes run source 0123456789ab`` or ``NotReady: …`` (``config`` when the hash
        held against is a config hash)."""
        ready = sum(r.ready for r in self.rows)
        config = (f" {self.hash_kind()} {self.expected_hash[:restart.MIN_HASH_DIGITS]}" if self.expected_hash
                  else "")
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
            "warnings": list(self.warnings),
        }


def _row(node: Obj, pod: Obj | None, *, prefix: str, expected: str | None, static_pod_name: str,
         container: str, selected: bool) -> NodeRow:
    name = str(dig(node, "metadata", "name"))
    ann = annotation_snapshot(node, prefix)
    state, config_hash = ann.get("state"), ann.get("config-hash") or None
    source_hash = ann.get("source-hash") or None
    mtime, message = ann.get("manifest-mtime") or None, ann.get("message") or None
    pod_name = str(dig(pod, "metadata", "name") or "") or mirror_pod_name(static_pod_name, name)
    row = NodeRow(node=name, state=state, source_hash=source_hash, config_hash=config_hash, manifest_mtime=mtime,
                  scheduler_started=restart.started_at(pod, container) if pod is not None else None,
                  restarted_at=ann.get("restarted-at") or None,
                  message=message, mirror_pod=pod_name if pod is not None else None, ready=False, selected=selected)
    digits = restart.MIN_HASH_DIGITS
    if not ann and not selected:
        return replace(row, reason="kube-scheduler runs here, no agent reports")
    if not ann:
        return replace(row, reason="no scheduler-patcher annotations (is the agent running on this node?)")
    if state != NodeState.READY:
        return replace(row, reason=f"state is {state or 'unset'}" + (f": {message}" if message else ""))
    if message:  # Ready with a message: the agent's periodic probe found an extender that stopped answering
        return replace(row, reason=message)
    if config_hash is None:
        return replace(row, reason="no config-hash annotation")
    if expected is not None and not any(h and restart.hashes_match(h, expected) for h in (source_hash, config_hash)):
        runs = f"source {source_hash[:digits]} (config {config_hash[:digits]})" if source_hash else \
            f"config {config_hash[:digits]}"
        return replace(row, reason=f"runs {runs}, expected {expected[:digits]}")
    try:
        mtime_ns = parse_rfc3339_ns(mtime) if mtime else None
    except ValueError:
        mtime_ns = None
    if mtime_ns is None:
        return replace(row, reason="no valid manifest-mtime annotation")
    # The proof is against the node's own config hash (the marker carries its first digits), whatever the
    # expected hash named. The baseline is the pod as it is now: a scheduler that restarted since (it exits
    # when it loses its leader election, routinely) still runs our config; crash loops show as waiting or
    # terminated, except for the second each run lives where the manifest has no startup probe. No settle time
    # here: the agent's Ready (required above) had one, and a verdict must not flap for 10 s after every
    # routine restart.
    decision = restart.decide(pod, marker_key=manifestedit.marker_key(prefix.rstrip("/")), expected_hash=config_hash,
                              manifest_mtime_ns=mtime_ns, baseline=restart.Baseline.of(pod, container),
                              container_name=container)
    if not decision.ready:
        return replace(row, reason=f"mirror pod {pod_name}: {decision.reason}")
    return replace(row, ready=True)


def evaluate(
    nodes: Iterable[Obj],
    mirror_pods: Mapping[str, Obj | None],
    *,
    prefix: str = DEFAULT_PREFIX,
    expected_hash: str | None = None,
    static_pod_name: str = "kube-scheduler",
    container_name: str = restart.DEFAULT_CONTAINER,
    unselected: Iterable[str] = (),
    problems: Iterable[str] = (),
    warnings: Iterable[str] = (),
) -> ClusterVerdict:
    """The verdict for ``nodes`` (Node objects as dicts) and their mirror pods keyed by node name. Pure.

    Without ``expected_hash`` the nodes must agree on one config: during a rollout half the nodes run the new
    config and half the old one, each of them "Ready", and that is exactly the state not to call Ready. They
    are compared by ``source-hash`` (the ConfigMap they rendered from), not ``config-hash``: nodes on different
    kube-scheduler versions (mid-upgrade) render one ConfigMap into different files, legitimately. An agent
    that publishes no ``source-hash`` is compared by its ``config-hash``. ``expected_hash`` (12 to 64 hex
    digits) may name either hash.

    ``unselected`` names the nodes among ``nodes`` that the node selector missed but a scheduler pod runs on
    (``scheduler_pods``): each gets a row, NotReady unless an agent reports there, and a warning. ``problems``
    and ``warnings`` from reading the cluster are carried into the verdict.
    """
    p = normalize_prefix(prefix)
    ordered = sorted(nodes, key=lambda n: str(dig(n, "metadata", "name")))
    outside = frozenset(unselected)
    problems = list(problems)
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
             static_pod_name=static_pod_name, container=container_name,
             selected=str(dig(node, "metadata", "name")) not in outside)
        for node in ordered
    )
    notes = [*warnings, *(
        f"kube-scheduler pod {dig(mirror_pods.get(r.node), 'metadata', 'namespace') or 'kube-system'}/"
        f"{r.mirror_pod} runs on node {r.node}, which the control-plane node selector does not select: the "
        "DaemonSet's default placement puts no agent there (see 'Unlabelled control plane' in "
        "docs/operator-contract.md)" for r in rows if not r.selected)]
    return ClusterVerdict(rows=rows, expected_hash=expected, problems=tuple(problems), warnings=tuple(notes))


def _node_owner(pod: Obj) -> str | None:
    """The Node that owns ``pod`` (how the kubelet marks a mirror pod since 1.20), else ``None``."""
    for ref in dig(pod, "metadata", "ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("kind") == "Node" and isinstance(ref.get("name"), str):
            return str(ref["name"])
    return None


def may_be_unlabelled_scheduler(meta: Obj, static_pod_name: str = "kube-scheduler") -> bool:
    """Whether a pod with this ``metadata`` could be one ``scheduler_pods`` counts without its label: the
    metadata has no ``spec.nodeName``, so this is a superset, judged in full once the pod itself is read."""
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return (isinstance(name, str) and name.startswith(f"{static_pod_name}-")
            and _node_owner({"metadata": meta}) is not None)


@dataclass(frozen=True)
class SchedulerPods:
    """The static kube-scheduler pods found in the cluster, by the node they run on."""

    by_node: dict[str, Obj]
    warnings: tuple[str, ...] = ()


def scheduler_pods(labelled: Iterable[Obj], node_owned: Iterable[Obj], *,
                   static_pod_name: str = "kube-scheduler") -> SchedulerPods:
    """Every static kube-scheduler, whatever its node's labels. Pure.

    ``labelled``: the pods the scheduler label selector (``component=kube-scheduler``) returned; ``node_owned``:
    the other pods of the namespace. A labelled pod counts unless another controller (a ReplicaSet: a second
    scheduler deployed as a workload, which no agent patches) owns it; an unlabelled one counts when a Node
    owns it and it bears the mirror name ``<static-pod-name>-<node>`` (etcd and the apiserver are Node-owned
    too). Where two pods claim one node, the one with the mirror name wins and the other is named in a warning.
    """
    by_node: dict[str, Obj] = {}
    warnings: list[str] = []
    candidates = [pod for pod in labelled if not any(
        isinstance(ref, Mapping) and ref.get("controller") and ref.get("kind") != "Node"
        for ref in dig(pod, "metadata", "ownerReferences") or [])]
    for pod in node_owned:
        node = dig(pod, "spec", "nodeName") or _node_owner(pod)
        if (isinstance(node, str) and _node_owner(pod) is not None
                and dig(pod, "metadata", "name") == mirror_pod_name(static_pod_name, node)):
            candidates.append(pod)
    for pod in candidates:
        node = dig(pod, "spec", "nodeName") or _node_owner(pod)
        name = dig(pod, "metadata", "name")
        if not isinstance(node, str) or not node:
            continue  # not scheduled onto a node (yet): no scheduler runs anywhere for it
        held = by_node.get(node)
        if held is None or held is pod or dig(held, "metadata", "name") == name:
            by_node[node] = pod
            continue
        expected = mirror_pod_name(static_pod_name, node)
        keep, drop = (pod, held) if name == expected else (held, pod)
        by_node[node] = keep
        warnings.append(f"pod {dig(drop, 'metadata', 'name')} on node {node} also looks like a kube-scheduler; "
                        f"the verdict judges {dig(keep, 'metadata', 'name')}")
    return SchedulerPods(by_node=by_node, warnings=tuple(dict.fromkeys(warnings)))


def node_selectors(node_selector: str = DEFAULT_NODE_SELECTOR, legacy_master_label: bool = True) -> list[str]:
    """The label selectors whose union is "the control-plane nodes" (Kubernetes has no OR in one selector)."""
    selectors = [node_selector]
    if legacy_master_label and LEGACY_MASTER_SELECTOR not in selectors:
        selectors.append(LEGACY_MASTER_SELECTOR)
    return selectors


def check_expected_hash(value: str | None) -> None:
    """Raise ``ValueError`` unless ``value`` is ``None`` or 12 to 64 hex digits (fewer could match by accident)."""
    if value is not None and not _HASH.fullmatch(value):
        raise ValueError(f"the expected config hash must be {restart.MIN_HASH_DIGITS} to 64 hex digits, "
                         f"got {value!r}")


# --- output ---------------------------------------------------------------------------------------------

_COLUMNS: Final = ("NODE", "STATE", "SOURCE-HASH", "CONFIG-HASH", "MANIFEST-MTIME", "SCHEDULER-STARTED", "RESTARTED-AT",
                   "READY", "MESSAGE")


def render_table(verdict: ClusterVerdict) -> str:
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
    lines.extend(f"warning: {w}" for w in verdict.warnings)
    return "\n".join(lines) + "\n"


def compat_nodes_yaml(verdict: ClusterVerdict) -> str:
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


def status_data(verdict: ClusterVerdict) -> dict[str, str]:
    return {
        "status.json": json.dumps(verdict.to_dict(), indent=2, sort_keys=True) + "\n",  # as `readiness -o json`
        "ready": "true" if verdict.ready else "false",
        "expected-hash": verdict.expected_hash or "",
    }
