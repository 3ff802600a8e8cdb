"""The agent loop's timers: when to plan again (the resync), retry a failed pre-flight, probe the extenders
while Ready, ask for the rollout Lease again, save the record into a state folder that refused it, and stop
waiting at the start for the hold watch's answer. All on
the monotonic clock; ``due`` names the one that fires, ``timeout`` is how long the loop may sleep."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

Due = Literal["hold-wait", "state-folder", "resync", "probe-retry", "periodic-probe", "lease-retry"]

#: The loop's shortest sleep: a timer already due must not make it spin.
FLOOR = 0.05


@dataclass
class Timers:
    resync: float = 0.0  # any reconcile sets the next one
    lease_retry_at: float | None = None  # cleared when the turn comes, is refused or released, and by a write
    probe_retry_at: float | None = None
    periodic_probe_at: float | None = None
    state_retry_at: float | None = None
    #: The end of the start's wait for the hold (``Loop.hold_wait``); cleared once the hold is known.
    hold_wait_at: float | None = None

    def later(self, timer: Literal["probe-retry", "state-folder"], delay: float) -> None:
        at = time.monotonic() + delay
        if timer == "state-folder":
            self.state_retry_at = at
        else:
            self.probe_retry_at = at

    def due(self, now: float, *, fault: bool) -> Due | None:
        """The one timer that fires now, in this order, cleared (the resync and the Lease retry are set again by
        what they run). During a state folder fault only the folder's retry and the end of the wait for the hold
        fire: the others stay due."""
        if self.hold_wait_at is not None and now >= self.hold_wait_at:
            self.hold_wait_at = None
            return "hold-wait"
        if self.state_retry_at is not None and now >= self.state_retry_at:
            self.state_retry_at = None
            return "state-folder"
        if fault:
            return None
        if now >= self.resync:
            return "resync"
        if self.probe_retry_at is not None and now >= self.probe_retry_at:
            self.probe_retry_at = None
            return "probe-retry"
        if self.periodic_probe_at is not None and now >= self.periodic_probe_at:
            self.periodic_probe_at = None
            return "periodic-probe"
        if self.lease_retry_at is not None and now >= self.lease_retry_at:
            return "lease-retry"
        return None

    def timeout(self, now: float, *, fault: bool, heartbeat: float, also: tuple[float, ...] = ()) -> float:
        """Seconds until the next timer, the heartbeat or one of ``also`` (other deadlines, absolute). While
        the record cannot be saved, only the folder's retry counts: the other timers stay due (``due`` holds
        them back), and counting them would wake the loop again and again for the whole fault."""
        if fault:
            return max(FLOOR, min([heartbeat, *(t - now for t in (self.state_retry_at, self.hold_wait_at)
                                                if t is not None)]))
        wake = [self.resync - now, heartbeat, *(t - now for t in also)]
        for t in (self.lease_retry_at, self.probe_retry_at, self.periodic_probe_at, self.state_retry_at,
                  self.hold_wait_at):
            if t is not None:
                wake.append(t - now)
        return max(FLOOR, min(wake))
