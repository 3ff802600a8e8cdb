"""The release throttle on a fake clock: QPS/burst pacing and the server's 429 pause (no real sleeps)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from patcher.adapters.kube.errors import TooManyRequests, retry_after_seconds, translate
from patcher.adapters.kube.throttle import Throttle


class FakeTime:
    """A clock that only moves when someone sleeps on it."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []
        self._lock = threading.Lock()

    def clock(self) -> float:
        with self._lock:
            return self.now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.sleeps.append(seconds)
            self.now += seconds


def throttle(qps: float, burst: int) -> tuple[Throttle, FakeTime]:
    t = FakeTime()
    return Throttle(qps, burst, clock=t.clock, sleep=t.sleep), t


def test_a_full_bucket_lets_a_burst_through_then_paces_at_qps() -> None:
    th, t = throttle(100.0, 5)
    for _ in range(5):
        th.acquire()
    assert t.sleeps == []
    for _ in range(10):
        th.acquire()
    assert t.now == pytest.approx(100.0 + 10 / 100.0)


def test_a_server_hold_stops_everyone_for_retry_after_and_empties_the_bucket() -> None:
    th, t = throttle(1000.0, 10)
    th.hold(2.0)
    th.acquire()
    assert t.now >= 102.0  # nothing before the server's delay
    assert sum(t.sleeps) == pytest.approx(2.0 + 1 / 1000.0)  # and no burst saved up during the pause
    before = t.now
    th.hold(0.5)
    th.hold(0.1)  # a shorter hold never shortens a longer one
    th.acquire()
    assert t.now - before == pytest.approx(0.5 + 1 / 1000.0)


@given(st.floats(1.0, 5000.0), st.integers(1, 64), st.integers(1, 300))
def test_never_more_than_burst_plus_qps_times_elapsed(qps: float, burst: int, n: int) -> None:
    th, t = throttle(qps, burst)
    for _ in range(n):
        th.acquire()
    elapsed = t.now - 100.0
    assert n <= burst + qps * elapsed + 1e-6
    assert elapsed <= max(0.0, (n - burst) / qps) + 1e-6  # and no slower than that either


def test_invalid_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="qps > 0 and burst >= 1"):
        Throttle(0, 1)
    with pytest.raises(ValueError, match="qps > 0 and burst >= 1"):
        Throttle(10, 0)


def test_retry_after_is_read_as_seconds_and_garbage_counts_as_absent() -> None:
    assert retry_after_seconds("3") == 3.0 and retry_after_seconds(" 0 ") == 0.0
    for bad in (None, "", "soon", "-1", "inf", "Wed, 21 Oct 2026 07:28:00 GMT"):
        assert retry_after_seconds(bad) is None
    err = translate(TooManyRequests("x", "y", retry_after=2.0), "release pod a/b")
    assert isinstance(err, TooManyRequests) and err.retry_after == 2.0
