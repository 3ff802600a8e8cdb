"""Go durations, as kube-scheduler parses them.

Extender timeouts and leader-election periods are ``metav1.Duration`` strings (``15s``, ``1m30s``) in every
KubeSchedulerConfiguration since v1beta1. Validating means accepting exactly what Go's ``time.ParseDuration``
accepts — anything else makes the scheduler exit — and comparing them exactly (no float rounding: ``0.1s`` is
100000000 ns, not 99999999).
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


def format_duration(ns: int) -> str:
    """Format nanoseconds the way Go's ``Duration.String`` does for whole units (``15s``, ``1m30s``, ``250ms``).

    Used in messages about a duration (``5s <= 10s, the default``), so that they read like the config.
    """
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("us", 1_000)):
            if ns % size == 0:
                return f"{sign}{ns // size}{unit}"
        return f"{sign}{ns}ns"
    hours, rest = divmod(ns, 3600 * 1_000_000_000)
    minutes, rest = divmod(rest, 60 * 1_000_000_000)
    seconds = Fraction(rest, 1_000_000_000)
    sec_text = str(seconds.numerator // seconds.denominator) if seconds.denominator == 1 else _decimal(seconds)
    text = ""
    if hours:
        text += f"{hours}h"
    if hours or minutes:
        text += f"{minutes}m"
    return f"{sign}{text}{sec_text}s"


def _decimal(value: Fraction) -> str:
    """Exact decimal form of a fraction whose denominator divides 10**9."""
    scaled = value * 1_000_000_000
    whole, frac = divmod(int(scaled), 1_000_000_000)
    return f"{whole}.{frac:09d}".rstrip("0")
