"""The mirror pod's watch events around one manifest write, reduced to what a restart is judged on, and compared.

tests/real/test_real_kubelet_sequence.py records what the real kubelet of a `kubeadm init` node makes the API server
send when kube-scheduler's manifest changes (tests/fixtures/kubelet/); tests/component/test_kubeletsim_sequence.py
records tests/harness/emu/kubeletsim.py on the API emulator for the same writes and holds the two against each other.
Both go through `compact` (one event: what the agent reads of the pod, and what the kubelet sets beside it) and
`shape` (the steps a watcher sees, without the times and names no two runs share).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from patcher.core import restart
from patcher.core.kubeobj import dig
from patcher.core.timefmt import parse_rfc3339_ns

Obj = dict[str, Any]
CONFIG = "kubernetes.io/config."
KEPT_ANNOTATIONS = (f"{CONFIG}hash", f"{CONFIG}mirror", f"{CONFIG}seen", f"{CONFIG}source")


def compact(kind: str, pod: Mapping[str, Any], at_s: float, marker_key: str) -> Obj:
    """One watch event as the fixture keeps it: its type, arrival (seconds after the write), the pod's identity,
    the kubelet's annotations, whether the agent's marker is there, and the status as sent (times as written)."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    status = pod.get("status") or {}
    return {
        "t": round(at_s, 3), "type": kind, "resourceVersion": meta.get("resourceVersion"), "uid": meta.get("uid"),
        "deletionTimestamp": meta.get("deletionTimestamp"),
        "annotations": {k: annotations[k] for k in (*KEPT_ANNOTATIONS, marker_key) if k in annotations},
        "marker": restart.marker_hash(pod, marker_key),
        "phase": status.get("phase"),
        "conditions": [{k: c.get(k) for k in ("type", "status", "lastTransitionTime")}
                       for c in status.get("conditions") or []],
        "containerStatuses": [{k: s.get(k) for k in ("name", "containerID", "state", "lastState", "started",
                                                        "ready", "restartCount")}
                              for s in status.get("containerStatuses") or []],
    }


def _state(status: Mapping[str, Any] | None) -> str:
    if not status:
        return "-"
    state = status.get("state") or {}
    kind = next(iter(state), "-")
    reason = dig(state, kind, "reason") if kind != "running" else None
    return f"{kind}({reason})" if reason else kind


def shape(events: list[Obj]) -> list[str]:
    """The steps a watcher of the mirror pod sees, one word each, runs of equal steps kept once: ``DELETED``,
    ``ADDED``, and per pod state ``<phase> <container state> started=<s> ready=<r> Ready=<condition>``
    (``new`` marks the first event of a pod whose uid differs from the pod before the write)."""
    out: list[str] = []
    first_uid = events[0]["uid"] if events else None
    for event in events:
        status = event["containerStatuses"][0] if event["containerStatuses"] else None
        ready = next((c["status"] for c in event["conditions"] if c["type"] == "Ready"), "-")
        word = (f"{event['type']} {'new' if event['uid'] != first_uid else 'old'} {event['phase']} {_state(status)} "
                f"started={status.get('started') if status else '-'} ready={status.get('ready') if status else '-'} "
                f"Ready={ready}")
        if event["type"] == "DELETED":
            word = "DELETED"
        if not out or out[-1] != word:
            out.append(word)
    return out


def verdicts(events: list[Obj], *, marker_key: str, expected_hash: str | None, written_ns: int) -> list[str]:
    """What the agent's restart check (`restart.decide` after a patch, `restart.runs_unpatched` after a restore:
    ``expected_hash`` None) says at each event, runs of equal answers kept once. The baseline is the pod before
    the write, as the agent takes it."""
    out: list[str] = []
    before = _pod(events[0]) if events and events[0]["type"] != "DELETED" else None
    baseline = restart.Baseline.of(before)
    for event in events:
        pod = None if event["type"] == "DELETED" else _pod(event)
        if expected_hash is None:
            word = "unpatched" if restart.runs_unpatched(pod, marker_key=marker_key, manifest_mtime_ns=written_ns) \
                else "waiting"
        else:
            decision = restart.decide(pod, marker_key=marker_key, expected_hash=expected_hash,
                                      manifest_mtime_ns=written_ns, baseline=baseline)
            word = decision.verdict.value if decision.ready else f"{decision.verdict.value}: {_kind(decision.reason)}"
        if not out or out[-1] != word:
            out.append(word)
    return out


def _kind(reason: str) -> str:
    """A restart reason without the names, hashes and times in it."""
    for words in ("does not exist", "is being deleted", "annotation yet", "no status", "restarted",
                  "CrashLoopBackOff", "exited with code", "has terminated", "is waiting", "not running yet",
                  "before the write", "not Ready yet", "runs config"):
        if words in reason:
            return words.strip()
    return reason


def _pod(event: Obj) -> Obj:
    """The pod an event stands for, rebuilt from the fixture's record (enough for `restart`)."""
    annotations = dict(event["annotations"])
    return {"metadata": {"uid": event["uid"], "resourceVersion": event["resourceVersion"],
                         "deletionTimestamp": event["deletionTimestamp"], "annotations": annotations},
            "status": {"phase": event["phase"], "conditions": event["conditions"],
                       "containerStatuses": event["containerStatuses"]}}


def relative_s(stamp: str | None, written_ns: int) -> float | None:
    """A status time (whole seconds, as the API writes it) in seconds after the write."""
    return None if stamp is None else round((parse_rfc3339_ns(stamp) - written_ns) / 1e9, 3)
