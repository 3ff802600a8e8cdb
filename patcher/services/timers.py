"""The agent loop's timers, on the monotonic clock: plan again (the resync), retry a failed pre-flight, probe
the extenders while Ready, ask for the rollout Lease again, save the record into a state folder that refused it,
and stop waiting at the start for the hold watch's answer."""

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
    hold_wait_at: float | None = None  # the end of the start's wait for the hold; cleared once it is known

    def later(self, timer: Literal["probe-retry", "state-folder"], delay: float) -> None:
        at = time.monotonic() + delay
        if timer == "state-folder":
            self.state_retry_at = at
        else:
            self.probe_retry_at = at

    def due(self, now: float, *, fault: bool) -> Due | None:
        """The one timer that fires now, cleared (the resync and the Lease retry are set again by what they run).
        During a state folder fault only the folder's retry and the wait for the hold fire: the others stay due."""
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

    def timeout(self, now: float, *, fault: bool, heartbeat: float, also: tuple[float | None, ...] = ()) -> float:
        """Seconds until the next timer, the heartbeat or one of ``also`` (absolute, or None). During a fault only
        the timers that can fire count: the others would wake the loop again and again for the whole fault."""
        timers = (self.state_retry_at, self.hold_wait_at) if fault else (
            self.resync, self.lease_retry_at, self.probe_retry_at, self.periodic_probe_at, self.state_retry_at,
            self.hold_wait_at, *also)
        return max(FLOOR, min([heartbeat, *(t - now for t in timers if t is not None)]))
