"""Pure helpers of the Kubernetes adapters: timestamps, annotation values, event bodies, backoff."""

from __future__ import annotations

import random

import pytest

from patcher.adapters.kube.backoff import Backoff
from patcher.core.status import (
    NodeState,
    NodeStatus,
    desired_annotations,
    event_body,
    merge_patch,
    normalize_prefix,
    transition_event,
)
from patcher.core.timefmt import parse_rfc3339_ns, rfc3339

NS = 1_000_000_000


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "1970-01-01T00:00:00.000000000Z"),
        (1795304401 * NS + 123456789, "2026-11-21T23:40:01.123456789Z"),
        (1795304401 * NS + 5, "2026-11-21T23:40:01.000000005Z"),
    ],
)
def test_mtime_annotation_keeps_every_nanosecond(ns: int, text: str) -> None:
    values = desired_annotations(NodeStatus(NodeState.PENDING, manifest_mtime_ns=ns))
    assert values["scheduler-patcher.io/manifest-mtime"] == text


@pytest.mark.parametrize(
    ("digits", "text"),
    [
        (0, "2026-11-21T23:40:01Z"),  # metav1.Time (events): whole seconds, truncated, never rounded up
        (3, "2026-11-21T23:40:01.999Z"),  # log lines
        (6, "2026-11-21T23:40:01.999999Z"),  # metav1.MicroTime (Lease renewTime)
        (9, "2026-11-21T23:40:01.999999999Z"),  # file mtimes
    ],
)
def test_one_formatter_for_every_precision(digits: int, text: str) -> None:
    ns = 1795304401 * NS + 999_999_999
    assert rfc3339(ns, digits) == text
    assert parse_rfc3339_ns(text) == ns - ns % 10 ** (9 - digits)


def test_event_times_are_whole_seconds() -> None:
    body = event_body(transition_event(NodeStatus(NodeState.READY), 1795304401 * NS + 999_999_999),
                      node_name="cp-1", node_uid=None)
    assert body["lastTimestamp"] == "2026-11-21T23:40:01Z"


def test_prefix_is_normalized() -> None:
    assert normalize_prefix("scheduler-patcher.io") == "scheduler-patcher.io/"
    assert normalize_prefix("example.com/") == "example.com/"
    with pytest.raises(ValueError):
        normalize_prefix("/")


def test_annotations_cover_every_key_and_drop_message_outside_failures() -> None:
    ready = NodeStatus(NodeState.READY, "ab" * 32, 1795304401 * NS + 1, 1795304405 * NS)
    assert desired_annotations(ready, "example.com") == {
        "example.com/state": "Ready",
        "example.com/config-hash": "ab" * 32,
        "example.com/source-hash": None,
        "example.com/manifest-mtime": "2026-11-21T23:40:01.000000001Z",
        "example.com/restarted-at": "2026-11-21T23:40:05.000000000Z",
        "example.com/message": None,
    }
    failed = NodeStatus(NodeState.ROLLED_BACK, None, None, message="config abc crash-looped")
    values = desired_annotations(failed)
    assert values["scheduler-patcher.io/message"] == "config abc crash-looped"
    assert values["scheduler-patcher.io/config-hash"] is None
    stale = desired_annotations(NodeStatus(NodeState.RESTORED, "ab" * 32, message="stale"))
    assert stale["scheduler-patcher.io/message"] is None
    # WaitingForRestart keeps one only because a restart deadline passed without a healthy kubelet (lifecycle
    # clears it on every new wait)
    kubelet = desired_annotations(NodeStatus(NodeState.WAITING_FOR_RESTART, "ab" * 32, message="kubelet on this"))
    assert kubelet["scheduler-patcher.io/message"] == "kubelet on this"
    # Ready keeps one only because the periodic extender probe set it (the verdict reads it as NotReady)
    down = desired_annotations(NodeStatus(NodeState.READY, "ab" * 32, message="extenders stopped answering: x"))
    assert down["scheduler-patcher.io/message"] == "extenders stopped answering: x"
    with_source = desired_annotations(NodeStatus(NodeState.READY, "ab" * 32, source_hash="cd" * 32))
    assert with_source["scheduler-patcher.io/source-hash"] == "cd" * 32
    assert merge_patch(values) == {"metadata": {"annotations": values}}


def test_transition_events_have_camelcase_reasons_and_warning_types() -> None:
    status = NodeStatus(NodeState.WAITING_FOR_RESTART, "0123456789abcdef")
    spec = transition_event(status, 5)
    assert (spec.reason, spec.type) == ("SchedulerPatched", "Normal")
    assert "0123456789ab" in spec.message and "0123456789abc" not in spec.message
    rolled = transition_event(NodeStatus(NodeState.ROLLED_BACK, message="bad config"), 5)
    assert (rolled.reason, rolled.type, rolled.message) == ("PatchRolledBack", "Warning", "bad config")
    custom = transition_event(NodeStatus(NodeState.READY), 5, reason="SchedulerAdopted", message="m" * 5000)
    assert custom.reason == "SchedulerAdopted" and len(custom.message) == 1024


def test_event_body_stands_in_node_name_for_unknown_uid() -> None:
    spec = transition_event(NodeStatus(NodeState.RESTORED), 1795304401 * NS + 42)
    body = event_body(spec, node_name="cp-1", node_uid=None)
    assert body["metadata"] == {"name": f"cp-1.{1795304401 * NS + 42:x}", "namespace": "default"}
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "cp-1", "uid": "cp-1"}
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2026-11-21T23:40:01Z"
    assert body["reason"] == "SchedulerRestored"
    assert event_body(spec, node_name="cp-1", node_uid="u-1")["involvedObject"]["uid"] == "u-1"


def test_backoff_grows_caps_and_jitters() -> None:
    b = Backoff(initial=1.0, maximum=8.0, factor=2.0, jitter=0.5, rng=random.Random(1))
    delays = [b.next_delay() for _ in range(8)]
    ceilings = [1, 2, 4, 8, 8, 8, 8, 8]
    assert all(c * 0.5 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert len(set(delays)) == len(delays)  # jittered
    assert b.failures == 8
    b.reset()
    assert b.failures == 0 and b.next_delay() <= 1.0
    with pytest.raises(ValueError):
        Backoff(initial=0)
