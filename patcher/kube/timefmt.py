"""RFC 3339 timestamps with nanoseconds, to and from integer nanoseconds since the epoch.

The manifest's mtime is an ``int`` of nanoseconds (``os.stat().st_mtime_ns``); operators compare the published
``manifest-mtime`` with the scheduler container's ``startedAt``. ``datetime`` only keeps microseconds, so both
directions are done on integers to keep every digit. Pure: no I/O, shared by the CLI and the agent.
"""

from __future__ import annotations

import calendar
import datetime as dt
import re

_NS_PER_S = 1_000_000_000

_RFC3339 = re.compile(
    r"^(?P<date>\d{4}-\d{2}-\d{2})[Tt ](?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2})"
    r"(?:\.(?P<frac>\d+))?(?P<tz>[Zz]|[+-]\d{2}:\d{2})$"
)


def format_rfc3339_ns(ns: int) -> str:
    """Render ``ns`` (nanoseconds since the epoch) as UTC RFC 3339 with exactly nine fractional digits.

    A fixed width (Go's ``RFC3339Nano`` trims trailing zeros) keeps the values sortable as plain strings.
    """
    seconds, frac = divmod(ns, _NS_PER_S)
    stamp = dt.datetime.fromtimestamp(seconds, tz=dt.UTC)
    return f"{stamp:%Y-%m-%dT%H:%M:%S}.{frac:09d}Z"


def format_rfc3339_s(ns: int) -> str:
    """Render ``ns`` floored to whole seconds, the precision of Kubernetes ``metav1.Time`` fields."""
    stamp = dt.datetime.fromtimestamp(ns // _NS_PER_S, tz=dt.UTC)
    return f"{stamp:%Y-%m-%dT%H:%M:%S}Z"


def parse_rfc3339_ns(text: str) -> int:
    """Parse an RFC 3339 timestamp (any number of fractional digits, ``Z`` or an offset) into nanoseconds.

    Digits beyond the ninth are truncated (not rounded), so a parse never lands later than the instant it
    names. Raises ``ValueError`` for anything that is not a valid RFC 3339 date-time.
    """
    match = _RFC3339.match(text.strip())
    if match is None:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")
    date = dt.date.fromisoformat(match["date"])
    # Validates hour/minute/second ranges the regex cannot.
    clock = dt.time(int(match["h"]), int(match["m"]), int(match["s"]))
    seconds = calendar.timegm((date.year, date.month, date.day, clock.hour, clock.minute, clock.second))
    tz = match["tz"]
    if tz not in ("Z", "z"):
        sign = 1 if tz[0] == "+" else -1
        offset = dt.timedelta(hours=int(tz[1:3]), minutes=int(tz[4:6]))
        if offset >= dt.timedelta(hours=24):
            raise ValueError(f"invalid UTC offset in {text!r}")
        seconds -= sign * int(offset.total_seconds())
    frac = (match["frac"] or "")[:9].ljust(9, "0")
    return seconds * _NS_PER_S + int(frac)
