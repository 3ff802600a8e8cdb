"""Capped exponential backoff with jitter, the one retry pace of everything that talks to the API server.

The API server is unreachable for seconds to minutes while control-plane pods restart; agents retrying in
lock-step would hit it together the moment it returns, hence the jitter.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Final

#: A 401/403 is retried at the ordinary pace this many times in a row before it waits the longest delay: a
#: restarting kube-apiserver denies until its RBAC informers synced ("clusterrole ... not found"), and a Role
#: applied a moment after the pod starts heals as fast. One that persists needs the Role or the token changed.
DENIED_QUICK_RETRIES: Final = 3


@dataclass
class Backoff:
    """Delays ``initial * factor**n`` capped at ``maximum``, each reduced by a random share up to ``jitter``."""

    initial: float = 0.5
    maximum: float = 30.0
    factor: float = 2.0
    jitter: float = 0.5
    rng: random.Random = field(default_factory=random.Random, repr=False)
    _attempt: int = field(default=0, init=False, repr=False)
    _denials: int = field(default=0, init=False, repr=False)  # 401/403 answers in a row

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.maximum < self.initial or self.factor < 1 or not 0 <= self.jitter < 1:
            raise ValueError(f"invalid backoff settings: {self!r}")

    def next_delay(self, denied: bool = False) -> float:
        """The delay before the next attempt; each call counts one more failure. ``denied`` (a 401/403, an
        ``errors.Denied``): past ``DENIED_QUICK_RETRIES`` of them in a row, the longest delay."""
        base = min(self.maximum, self.initial * self.factor ** min(self._attempt, 64))
        self._attempt += 1
        self._denials = self._denials + 1 if denied else 0
        return self.maximum if self._denials > DENIED_QUICK_RETRIES else base * (1.0 - self.jitter * self.rng.random())

    def reset(self, *, denials: bool = True) -> None:
        """Forget past failures (call after a success; ``denials=False``: start over from the shortest delay,
        with the 401/403 answers still counted)."""
        self._attempt = 0
        self._denials = 0 if denials else self._denials

    @property
    def failures(self) -> int:
        """Consecutive failures counted since the last reset."""
        return self._attempt

    def fresh(self) -> Backoff:
        """An independent copy with the same settings and no failures (one per retry loop)."""
        return Backoff(self.initial, self.maximum, self.factor, self.jitter)
