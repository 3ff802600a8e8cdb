"""The restart decision table: marker, hash, whole-second startedAt against a nanosecond mtime, crash loops."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from patcher.core.restart import Baseline, Verdict, container_status, decide, hashes_match, marker_hash
from tests.harness.emu.kubeemu import make_mirror_pod

NS = 1_000_000_000
KEY = "scheduler-patcher.io/patch"
HASH = "0123456789ab" + "cd" * 26  # a full sha256 as the agent knows it
WRITE_S = 1795304401  # 2026-11-21T23:40:01Z
MTIME = WRITE_S * NS + 999_999_999  # written at 23:40:01.999999999


def marker(h: str = HASH[:12]) -> dict[str, str]:
    return {KEY: json.dumps({"hash": h, "added": ["--config", "volume", "volumeMount"]})}


def pod(**kw: Any) -> dict[str, Any]:
    kw.setdefault("annotations", marker())
    kw.setdefault("started_at", "2026-11-21T23:40:02Z")
    p = make_mirror_pod(node_name="cp-1", **kw)
    p["metadata"]["uid"] = "uid-new"
    return p


def run(p: dict[str, Any] | None, baseline: Baseline | None = None, mtime: int = MTIME) -> tuple[Verdict, str]:
    d = decide(p, marker_key=KEY, expected_hash=HASH, manifest_mtime_ns=mtime, baseline=baseline)
    return d.verdict, d.reason


def test_ready_when_marker_hash_start_and_condition_agree() -> None:
    d = decide(pod(), marker_key=KEY, expected_hash=HASH, manifest_mtime_ns=MTIME)
    assert d.verdict is Verdict.READY and d.ready
    assert d.started_at == "2026-11-21T23:40:02Z"
    assert run(pod(restart_count=1))[0] is Verdict.CRASH_LOOPING  # it read the pod's restart count, 0


@pytest.mark.parametrize(
    ("started_at", "mtime", "verdict"),
    [
        # Same whole second as the write: startedAt cannot say more, the mtime is floored to 23:40:01.
        ("2026-11-21T23:40:01Z", WRITE_S * NS + 999_999_999, Verdict.READY),
        ("2026-11-21T23:40:01Z", WRITE_S * NS, Verdict.READY),
        # A fractional startedAt in the same second is floored too.
        ("2026-11-21T23:40:01.2Z", WRITE_S * NS + 900_000_000, Verdict.READY),
        ("2026-11-21T23:40:01.000000001Z", WRITE_S * NS + 900_000_000, Verdict.READY),
        # One second earlier is before the write, however close.
        ("2026-11-21T23:40:00Z", WRITE_S * NS, Verdict.WAITING),
        ("2026-11-21T23:40:00.999999999Z", WRITE_S * NS, Verdict.WAITING),
        ("2026-11-22T01:40:00+02:00", WRITE_S * NS, Verdict.WAITING),
        ("2026-11-22T01:40:01+02:00", WRITE_S * NS, Verdict.READY),
        ("not a time", WRITE_S * NS, Verdict.WAITING),
    ],
)
def test_started_at_is_compared_at_second_granularity(started_at: str, mtime: int, verdict: Verdict) -> None:
    assert run(pod(started_at=started_at), mtime=mtime)[0] is verdict


def test_started_before_write_says_when() -> None:
    verdict, reason = run(pod(started_at="2026-11-21T23:39:00Z"))
    assert verdict is Verdict.WAITING
    assert "2026-11-21T23:39:00Z" in reason and "2026-11-21T23:40:01" in reason


@pytest.mark.parametrize(
    ("annotations", "expected_reason"),
    [
        ({}, "no valid"),
        ({KEY: "{not json"}, "no valid"),
        ({KEY: json.dumps(["hash", HASH])}, "no valid"),
        ({KEY: json.dumps({"added": []})}, "no valid"),
        (marker("ffffffffffff"), "ffffffffffff"),  # stale hash: the kubelet still runs the previous patch
        (marker(HASH[:8]), HASH[:8]),  # fewer than 12 digits never match
    ],
)
def test_waiting_without_the_current_marker(annotations: dict[str, str], expected_reason: str) -> None:
    verdict, reason = run(pod(annotations=annotations))
    assert verdict is Verdict.WAITING and expected_reason in reason


def test_full_and_short_hashes_match_over_their_common_length() -> None:
    assert hashes_match(HASH[:12], HASH) and hashes_match(HASH, HASH) and hashes_match(HASH.upper()[:12], HASH)
    assert not hashes_match(HASH[:11], HASH)
    assert not hashes_match(HASH[:12] + "00", HASH)
    assert run(pod(annotations=marker(HASH)))[0] is Verdict.READY
    assert marker_hash(pod(), KEY) == HASH[:12]


def test_not_ready_condition_waits() -> None:
    assert run(pod(ready=False)) == (Verdict.WAITING, "the mirror pod is not Ready yet")


def test_missing_or_deleting_pod_waits() -> None:
    assert run(None)[0] is Verdict.WAITING
    p = pod()
    p["metadata"]["deletionTimestamp"] = "2026-11-21T23:40:03Z"
    assert run(p) == (Verdict.WAITING, "the mirror pod is being deleted")


def test_restart_count_rising_after_the_write_is_a_crash_loop() -> None:
    assert run(pod(restart_count=1))[0] is Verdict.CRASH_LOOPING  # new pod, no baseline: counts from 0
    same = Baseline(pod_uid="uid-new", restart_count=2)  # adopted: the pod already had 2 restarts
    assert run(pod(restart_count=2), same)[0] is Verdict.READY
    verdict, reason = run(pod(restart_count=3), same)
    assert verdict is Verdict.CRASH_LOOPING and "1 time(s)" in reason
    # The kubelet replaced the pod (new uid): the old pod's count is no baseline.
    old = Baseline(pod_uid="uid-old", restart_count=5)
    assert run(pod(restart_count=0), old)[0] is Verdict.READY
    assert run(pod(restart_count=1), old)[0] is Verdict.CRASH_LOOPING


def test_crash_loop_backoff_and_error_exit_after_write() -> None:
    verdict, reason = run(pod(waiting_reason="CrashLoopBackOff"), Baseline("uid-new", 0))
    assert verdict is Verdict.CRASH_LOOPING and "CrashLoopBackOff" in reason
    after = pod(terminated_exit_code=1, finished_at="2026-11-21T23:40:01Z")
    assert run(after)[0] is Verdict.CRASH_LOOPING
    before = pod(terminated_exit_code=1, finished_at="2026-11-21T23:39:59Z")
    assert run(before) == (Verdict.WAITING, "container kube-scheduler has terminated")
    clean = pod(terminated_exit_code=0, finished_at="2026-11-21T23:40:05Z")
    assert run(clean)[0] is Verdict.WAITING


def test_a_container_the_kubelet_lost_track_of_is_no_crash() -> None:
    """The real kubelet (1.37.2, `kubeadm upgrade node` and the agent's write 0.64 s apart) showed the new pod's
    scheduler as terminated with exit code 137 and reason ContainerStatusUnknown, no finishedAt: a state it makes
    up for a container its last status named and the runtime no longer has. Read as a crash, it rolled back a good
    config and marked it bad; it is a wait, and the scheduler's own exit or restarts still say crash."""
    lost = pod()
    lost["status"]["containerStatuses"][0]["state"] = {"terminated": {
        "exitCode": 137, "reason": "ContainerStatusUnknown",
        "message": "The container could not be located when the pod was terminated"}}
    verdict, reason = run(lost)
    assert verdict is Verdict.WAITING and "ContainerStatusUnknown" in reason
    lost["status"]["containerStatuses"][0]["restartCount"] = 3
    assert run(lost, Baseline("uid-new", 0))[0] is Verdict.CRASH_LOOPING  # restarts since the write still count


def test_crash_signals_on_a_pod_without_our_marker_are_not_ours() -> None:
    assert run(pod(annotations={}, restart_count=7, waiting_reason="CrashLoopBackOff"))[0] is Verdict.WAITING
    assert run(pod(annotations=marker("ffffffffffff"), restart_count=7))[0] is Verdict.WAITING


def test_waiting_container_reports_its_reason() -> None:
    assert run(pod(waiting_reason="ContainerCreating")) == (
        Verdict.WAITING, "container kube-scheduler is waiting: ContainerCreating"
    )


def test_container_is_found_by_name_or_as_the_only_one() -> None:
    p = pod()
    sidecar = {"name": "log-shipper", "restartCount": 9, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
    p["status"]["containerStatuses"].insert(0, sidecar)
    assert run(p)[0] is Verdict.READY  # the sidecar's crash loop is not the scheduler's
    renamed = pod(container="scheduler")
    assert run(renamed)[0] is Verdict.READY  # the only container, whatever its name
    renamed["status"]["containerStatuses"].append(sidecar)
    assert run(renamed) == (Verdict.WAITING, "no status for container kube-scheduler yet")
    assert container_status({"status": {}}) is None


def test_baseline_is_read_from_the_pod_seen_at_write_time() -> None:
    p = pod(restart_count=4)
    assert Baseline.of(p) == Baseline(pod_uid="uid-new", restart_count=4)
    assert Baseline.of(None) == Baseline()
    assert Baseline().restarts_for("anything") == 0


# --- the settle time: the same container has run long enough -------------------------------------------------

STARTED_S = WRITE_S + 1  # pod()'s startedAt, 23:40:02Z


def settle(p: dict[str, Any], now_ns: int, settle_s: float = 10.0) -> Any:
    return decide(p, marker_key=KEY, expected_hash=HASH, manifest_mtime_ns=MTIME, now_ns=now_ns, settle_s=settle_s)


def test_a_restarted_scheduler_is_ready_once_it_has_run_the_settle_time() -> None:
    """Counted from the end of its startedAt second: it may have started as late as 23:40:02.999999999."""
    early = settle(pod(), (STARTED_S + 3) * NS)
    assert early.verdict is Verdict.WAITING and early.settle_until_ns == (STARTED_S + 11) * NS
    assert "Ready once it has run 10s without a restart (8.0s more)" in early.reason
    assert settle(pod(), (STARTED_S + 11) * NS - 1).verdict is Verdict.WAITING
    done = settle(pod(), (STARTED_S + 11) * NS)
    assert done.verdict is Verdict.READY and done.settle_until_ns is None
    assert settle(pod(), STARTED_S * NS, 0.0).verdict is Verdict.READY  # no settle time: as before


def test_a_scheduler_that_exits_within_the_settle_time_is_never_ready() -> None:
    """What the real kubelet showed for an RKE2 manifest (no probes, its own metadata.uid): the refused scheduler
    running and the pod Ready for the second it lives, then exited, restarted, exited: each look sees a
    container younger than the settle time, or an exit."""
    uid = "uid-rke2"
    before = pod(restart_count=3)
    before["metadata"]["uid"] = uid
    base = Baseline.of(before)
    t = (STARTED_S + 1) * NS
    looks = [pod(restart_count=4, started_at="2026-11-21T23:40:02Z"),  # the edit's restart, ready for a second
             pod(restart_count=4, terminated_exit_code=1, finished_at="2026-11-21T23:40:03Z"),
             pod(restart_count=5, started_at="2026-11-21T23:40:03Z")]
    verdicts = []
    for i, p in enumerate(looks):
        p["metadata"]["uid"] = uid
        d = decide(p, marker_key=KEY, expected_hash=HASH, manifest_mtime_ns=MTIME, baseline=base, min_restarts=2,
                   now_ns=t + i * NS // 2, settle_s=10.0)
        verdicts.append(d.verdict)
    assert verdicts == [Verdict.WAITING, Verdict.CRASH_LOOPING, Verdict.CRASH_LOOPING]


def test_a_settle_time_needs_the_time() -> None:
    with pytest.raises(ValueError, match="needs now_ns"):
        decide(pod(), marker_key=KEY, expected_hash=HASH, manifest_mtime_ns=MTIME, settle_s=1.0)


@given(started=st.integers(min_value=WRITE_S, max_value=WRITE_S + 100),
       now_offset_ns=st.integers(min_value=-5 * NS, max_value=200 * NS),
       settle_ms=st.integers(min_value=1, max_value=60_000))
def test_ready_only_after_the_container_can_have_run_the_settle_time(started: int, now_offset_ns: int,
                                                                        settle_ms: int) -> None:
    """Whatever the fraction of its startedAt second: Ready means it has run at least the settle time, and the
    time a Waiting look names is the first at which the same container is Ready."""
    stamp = datetime.fromtimestamp(started, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    p, settle_s = pod(started_at=stamp), settle_ms / 1000
    now = started * NS + now_offset_ns
    d = settle(p, now, settle_s)
    latest_start = (started + 1) * NS  # exclusive: it started before this
    if d.verdict is Verdict.READY:
        assert now - latest_start >= settle_s * NS - 1
    else:
        assert d.verdict is Verdict.WAITING and d.settle_until_ns is not None and d.settle_until_ns > now
        assert settle(p, d.settle_until_ns, settle_s).verdict is Verdict.READY
        assert settle(p, d.settle_until_ns - 1, settle_s).verdict is Verdict.WAITING
