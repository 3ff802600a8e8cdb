"""Go durations, as kube-scheduler parses them: exactly what ``time.ParseDuration`` accepts (anything else makes
the scheduler exit), compared exactly (``0.1s`` is 100000000 ns, not 99999999).
"""

from __future__ import annotations

import re
from fractions import Fraction

_UNIT_NS: dict[str, int] = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
_COMPONENT = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_WHOLE = re.compile(r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:ns|us|\u00b5s|\u03bcs|ms|s|m|h))+")
_MAX_NS = 2**63 - 1


def parse_duration_ns(text: str) -> int:
    """Return the duration in nanoseconds, or raise ValueError with Go's reason.

    Mirrors ``time.ParseDuration``: a sequence of decimal numbers with a unit each, an optional sign, and the
    special case ``0`` without a unit. Fractions below a nanosecond are truncated, as Go does.
    """
    if text in ("0", "+0", "-0"):
        return 0
    if not _WHOLE.fullmatch(text):
        raise ValueError(f"invalid duration {text!r} (expected e.g. 15s, 500ms, 1m30s)")
    sign = -1 if text.startswith("-") else 1
    total = Fraction(0)
    for number, unit in _COMPONENT.findall(text.lstrip("+-")):
        total += Fraction(number) * _UNIT_NS[unit]
    ns = int(total)  # truncates toward zero, like Go
    if ns > _MAX_NS:
        raise ValueError(f"invalid duration {text!r}: overflows int64 nanoseconds")
    return sign * ns


def is_duration(text: str) -> bool:
    """True when ``text`` is a duration the scheduler would accept."""
    try:
        parse_duration_ns(text)
    except ValueError:
        return False
    return True
