"""Timestamps for the operator contract.

File mtimes are nanoseconds; the API's ``startedAt`` is whole seconds. The annotation keeps every digit so
an operator can compare either way, in the one format both sides parse: RFC 3339, UTC, ``Z`` suffix.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime


def rfc3339(ns: int, digits: int = 9) -> str:
    """``ns`` since the epoch in RFC 3339 UTC with ``digits`` fraction digits, truncated (0: whole seconds, the
    precision of ``metav1.Time``; 6: ``metav1.MicroTime``; 3: log lines; 9: file mtimes). The one formatter."""
    secs, frac = divmod(ns, 1_000_000_000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
    return f"{stamp}.{frac // 10 ** (9 - digits):0{digits}d}Z" if digits else f"{stamp}Z"


_RFC3339 = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})$")


def parse_rfc3339_ns(value: str) -> int:
    """Nanoseconds since the epoch; accepts whole seconds (API) and up to nine fractional digits."""
    m = _RFC3339.match(value.strip())
    if not m:
        raise ValueError(f"not an RFC 3339 timestamp: {value!r}")
    base, frac, zone = m.groups()
    dt = datetime.fromisoformat(base + ("+00:00" if zone == "Z" else zone))
    secs = int(dt.astimezone(UTC).timestamp())
    return secs * 1_000_000_000 + int((frac or "").ljust(9, "0"))


def api_seconds(stamp: object) -> int | None:
    """Whole seconds since the epoch of an API timestamp (``startedAt``, ``finishedAt``); ``None`` when absent
    or not a timestamp."""
    if not isinstance(stamp, str):
        return None
    try:
        return parse_rfc3339_ns(stamp) // 1_000_000_000
    except ValueError:
        return None
