"""Decide from the mirror pod whether the scheduler restarted with our manifest. Pure; the caller passes the time.

Four facts together prove the kubelet runs the manifest we wrote: the mirror pod carries our marker with the
current config hash (the kubelet copies a static pod's annotations), the scheduler container started no earlier
than our write (``startedAt`` has whole seconds, so the mtime is floored to its second; the marker rules out the
old pod), the pod is Ready, and that same container has run for the settle time: a scheduler that refuses its
config exits about a second after it starts, and for that second the real kubelet reports it started and the
pod Ready (no startup probe, as RKE2's; a manifest that sets ``metadata.uid`` even keeps the pod's UID). The
settle counts from the end of the ``startedAt`` second, so it is never shorter than asked. Crash signals count
only on the pod with the current marker: the old scheduler failing before the kubelet saw the change says
nothing about our config.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from patcher.core.kubeobj import dig, ready
from patcher.core.timefmt import api_seconds, rfc3339

_NS_PER_S = 1_000_000_000
#: The marker's hash is the first 12 hex digits of the config's sha256; never compare on fewer.
MIN_HASH_DIGITS = 12
DEFAULT_CONTAINER = "kube-scheduler"
#: The terminated state the kubelet makes up (exit code 137, no finishedAt) for a container its last status showed
#: and the runtime no longer has: seen on the new pod when kubeadm's write and ours came 0.6 s apart. No process of
#: the scheduler exited, so it is never a crash.
UNKNOWN_TO_THE_KUBELET = "ContainerStatusUnknown"


class Verdict(enum.StrEnum):
    """The outcome of one look at the mirror pod."""

    READY = "Ready"
    WAITING = "Waiting"
    CRASH_LOOPING = "CrashLooping"


@dataclass(frozen=True)
class Baseline:
    """What the mirror pod looked like when we wrote the manifest: its uid and the scheduler's restarts.

    The kubelet replaces a static pod whose manifest changed (new uid, restart count back to 0), so the count
    is a baseline only for the same pod; a different uid starts from 0.
    """

    pod_uid: str | None = None
    restart_count: int | None = None

    @classmethod
    def of(cls, pod: Mapping[str, Any] | None, container_name: str = DEFAULT_CONTAINER) -> Baseline:
        """Record the baseline from the mirror pod seen at write time (``None``: no pod seen)."""
        if pod is None:
            return cls()
        status = container_status(pod, container_name)
        count = status.get("restartCount") if status else None
        return cls(pod_uid=_str(dig(pod, "metadata", "uid")), restart_count=count if isinstance(count, int) else None)

    def restarts_for(self, pod_uid: str | None) -> int:
        """The restart count to compare against for the pod with ``pod_uid``."""
        if self.restart_count is None:
            return 0
        if self.pod_uid is not None and pod_uid is not None and pod_uid != self.pod_uid:
            return 0
        return self.restart_count


@dataclass(frozen=True)
class RestartDecision:
    """A verdict, one human sentence why, and the facts behind it (for logs and annotations)."""

    verdict: Verdict
    reason: str
    started_at: str | None = None
    #: Waiting only for the settle time: the wall time (ns) at which this container will have run it.
    settle_until_ns: int | None = None

    @property
    def ready(self) -> bool:
        return self.verdict is Verdict.READY


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def container_status(pod: Mapping[str, Any], container_name: str = DEFAULT_CONTAINER) -> Mapping[str, Any] | None:
    """The status of the scheduler container: by name, else the pod's only container, else ``None``."""
    statuses = [s for s in dig(pod, "status", "containerStatuses") or [] if isinstance(s, Mapping)]
    for status in statuses:
        if status.get("name") == container_name:
            return status
    return statuses[0] if len(statuses) == 1 else None


def started_at(pod: Mapping[str, Any], container_name: str = DEFAULT_CONTAINER) -> str | None:
    """The ``startedAt`` of the scheduler container's current run, as written; None when it does not run."""
    status = container_status(pod, container_name)
    return _str(dig(status, "state", "running", "startedAt")) if status else None


def marker_hash(pod: Mapping[str, Any], marker_key: str) -> str | None:
    """The ``hash`` recorded in the marker annotation, ``None`` when absent or not the expected JSON."""
    raw = dig(pod, "metadata", "annotations", marker_key)
    if not isinstance(raw, str):
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return _str(value.get("hash")) if isinstance(value, dict) else None


def hashes_match(found: str, expected: str) -> bool:
    """Equal over their common length (the marker may hold 12 digits, the agent the full sha256)."""
    common = min(len(found), len(expected))
    return common >= MIN_HASH_DIGITS and found[:common].lower() == expected[:common].lower()


def settle_left_ns(started_ns: int, now_ns: int, settle_s: float) -> int:
    """How much longer (ns, 0 when done) something started at ``started_ns`` must run to have run ``settle_s``."""
    return max(0, started_ns + round(settle_s * _NS_PER_S) - now_ns)


def decide(
    pod: Mapping[str, Any] | None,
    *,
    marker_key: str,
    expected_hash: str,
    manifest_mtime_ns: int,
    baseline: Baseline | None = None,
    container_name: str = DEFAULT_CONTAINER,
    min_restarts: int = 1,
    now_ns: int | None = None,
    settle_s: float = 0.0,
) -> RestartDecision:
    """Ready, CrashLooping or Waiting (with the reason) for the mirror pod ``pod`` after our write.

    ``min_restarts``: how many restarts since ``baseline`` make a crash loop. kube-scheduler also exits
    normally (a lost leader election), so the agent asks for more than one; CrashLoopBackOff counts at once.
    ``settle_s`` (with ``now_ns``, the node's wall clock): how long the container must have run to be Ready.
    """
    if settle_s > 0 and now_ns is None:
        raise ValueError("decide: a settle time needs now_ns")
    waiting = Verdict.WAITING
    if pod is None:
        return RestartDecision(waiting, "the mirror pod does not exist (yet)")
    if dig(pod, "metadata", "deletionTimestamp"):
        return RestartDecision(waiting, "the mirror pod is being deleted")
    found = marker_hash(pod, marker_key)
    if found is None:
        return RestartDecision(waiting, f"the mirror pod has no valid {marker_key} annotation yet")
    if not hashes_match(found, expected_hash):
        return RestartDecision(
            waiting, f"the mirror pod runs config {found}, not {expected_hash[:MIN_HASH_DIGITS]} yet"
        )
    status = container_status(pod, container_name)
    if status is None:
        return RestartDecision(waiting, f"no status for container {container_name} yet")

    count = status.get("restartCount") if isinstance(status.get("restartCount"), int) else None
    write_s = manifest_mtime_ns // _NS_PER_S
    written = rfc3339(write_s * _NS_PER_S)
    state = status.get("state") if isinstance(status.get("state"), Mapping) else {}
    running, wait, term = (dig(state, k) for k in ("running", "waiting", "terminated"))
    base = (baseline or Baseline()).restarts_for(_str(dig(pod, "metadata", "uid")))
    c = f"container {container_name}"
    if count is not None and count - base >= max(1, min_restarts):
        return RestartDecision(Verdict.CRASH_LOOPING, f"{c} restarted {count - base} time(s) after our write")
    if isinstance(wait, Mapping) and wait.get("reason") == "CrashLoopBackOff":
        detail = _str(wait.get("message"))
        return RestartDecision(Verdict.CRASH_LOOPING, f"{c} is in CrashLoopBackOff" + (f": {detail}" if detail else ""))
    if isinstance(term, Mapping):
        finished = api_seconds(term.get("finishedAt"))
        code = term.get("exitCode")
        if term.get("reason") == UNKNOWN_TO_THE_KUBELET:
            return RestartDecision(waiting, f"{c}: the kubelet lost track of a container it ran "
                                            f"({UNKNOWN_TO_THE_KUBELET}), which says nothing of our config")
        if code != 0 and (finished is None or finished >= write_s):
            return RestartDecision(Verdict.CRASH_LOOPING,
                                   f"{c} exited with code {code} ({term.get('reason', 'Error')})")
        return RestartDecision(waiting, f"{c} has terminated")
    if isinstance(wait, Mapping):
        return RestartDecision(waiting, f"{c} is waiting: {wait.get('reason', 'unknown reason')}")
    if not isinstance(running, Mapping):
        return RestartDecision(waiting, f"{c} is not running yet")
    started_text = _str(running.get("startedAt"))
    started = api_seconds(started_text)
    if started is None:
        return RestartDecision(waiting, f"{c} has no valid startedAt")
    if started < write_s:
        return RestartDecision(waiting, f"{c} started at {started_text}, before the write at {written}", started_text)
    if not ready(pod):
        return RestartDecision(waiting, "the mirror pod is not Ready yet", started_text)
    if now_ns is not None and settle_s > 0:
        left = settle_left_ns((started + 1) * _NS_PER_S, now_ns, settle_s)
        if left:
            return RestartDecision(waiting, f"{c} runs config {found} since {started_text}; Ready once it has run "
                                            f"{settle_s:g}s without a restart ({left / _NS_PER_S:.1f}s more)",
                                   started_text, now_ns + left)
    return RestartDecision(Verdict.READY, f"{c} runs config {found} since {started_text}", started_text)


def runs_unpatched(pod: Mapping[str, Any] | None, *, marker_key: str, manifest_mtime_ns: int,
                   container_name: str = DEFAULT_CONTAINER) -> bool:
    """After a restore: the mirror pod carries no marker and its scheduler runs, started since the write."""
    if pod is None or marker_hash(pod, marker_key) is not None or not ready(pod):
        return False
    started = api_seconds(started_at(pod, container_name))
    return started is not None and started >= manifest_mtime_ns // _NS_PER_S
