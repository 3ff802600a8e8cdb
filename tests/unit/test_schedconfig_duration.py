"""Go durations: what time.ParseDuration accepts, exact nanoseconds, and Go's own formatting."""

from __future__ import annotations

import pytest

from patcher.core.schedconfig.duration import is_duration, parse_duration_ns


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("15s", 15_000_000_000),
        ("1m30s", 90_000_000_000),
        ("0.1s", 100_000_000),  # exact, no float rounding
        ("1.5h", 5_400_000_000_000),
        ("250ms", 250_000_000),
        ("10us", 10_000),
        ("10\u00b5s", 10_000),
        ("3ns", 3),
        ("0", 0),
        ("-2s", -2_000_000_000),
        ("5m0s", 300_000_000_000),
        (".5s", 500_000_000),
    ],
)
def test_parse(text: str, ns: int) -> None:
    assert parse_duration_ns(text) == ns


@pytest.mark.parametrize("text", ["15", "15 s", "", "s", "1d", "1.s5", "15S", "--1s", "1e3s"])
def test_rejects_what_go_rejects(text: str) -> None:
    assert not is_duration(text)
