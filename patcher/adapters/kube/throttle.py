"""A token bucket (client-go's ``QPS``/``Burst``) that also obeys the API server's ``429 Retry-After``: the pace of
the gatekeeper's release pool, the one place this project sends thousands of requests in a row.

When API Priority and Fairness sheds load (``429`` with ``Retry-After``), ``hold`` stops every worker, not
just the refused one: hammering a server that said "later" only deepens its queues. Thread-safe; ``clock``
and ``sleep`` are injectable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Throttle:
    """A token bucket of ``burst`` tokens refilled at ``qps`` per second, plus a server-imposed pause."""

    def __init__(self, qps: float, burst: int, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"a rate limit needs qps > 0 and burst >= 1 (got qps={qps}, burst={burst})")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = float(burst)
        self._stamp = clock()
        self._not_before = -float("inf")

    def acquire(self) -> None:
        """Block until one request may be sent."""
        while True:
            with self._lock:
                now = self._clock()
                if now < self._not_before:
                    delay = self._not_before - now
                else:
                    self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.qps)
                    self._stamp = now
                    if self._tokens >= 1.0 - 1e-9:  # float rounding must not leave a token just out of reach
                        self._tokens = max(0.0, self._tokens - 1.0)
                        return
                    delay = (1.0 - self._tokens) / self.qps
            self._sleep(delay)

    def hold(self, seconds: float) -> None:
        """The server asked for ``seconds`` of quiet: no caller gets a token before then. The bucket is emptied
        too, so the requests held back do not all leave together the moment the pause ends."""
        with self._lock:
            now = self._clock()
            self._not_before = max(self._not_before, now + max(0.0, seconds))
            self._tokens = 0.0
            self._stamp = max(self._stamp, self._not_before)
