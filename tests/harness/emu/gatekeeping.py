"""A gatekeeper a test can wait on: it counts its finished passes and the Node events its watches delivered.

A test that checks that something did *not* happen (no release while the verdict is not Ready, no verdict read
for a heartbeat) waits for ``next_pass``: a whole pass that began after the state it checks, and so decided on
it. A sleep instead proves nothing on a machine too busy to run the loop in time.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from patcher.adapters.kube.backoff import Backoff
from patcher.adapters.kube.cluster import collect
from patcher.adapters.kube.schedindex import SchedulerIndex
from patcher.adapters.kube.transport import Api
from patcher.services.gatekeeper import Gatekeeper
from tests.harness.emu.kubeemu import wait_until

__all__ = ["Observed", "indexed", "next_pass"]


class Observed(Gatekeeper):
    """A ``Gatekeeper`` that counts its finished passes (``passes``) and delivered Node events (``node_events``)."""

    def __init__(self, api: Api, **kw: Any) -> None:
        self._seen = threading.Lock()
        self.passes = 0
        self.node_events = 0
        super().__init__(api, **kw)

    def step(self) -> float:
        delay = super().step()
        with self._seen:
            self.passes += 1
        return delay

    def _selected_event(self, kind: str, node: dict[str, Any]) -> None:
        super()._selected_event(kind, node)
        with self._seen:
            self.node_events += 1


def next_pass(gk: Observed, timeout: float = 5.0) -> bool:
    """Wait for a whole pass that began after this call: what it decides about the state seen so far (a
    release is sent within the pass) is done when this returns True. Each poll wakes the loop."""
    begun = gk.passes

    def done() -> bool:
        gk.wake()
        return gk.passes >= begun + 2  # the pass under way now (if any) ends, then one more
    return wait_until(done, timeout)


@contextmanager
def indexed(api: Api, resync_interval: float = 600.0) -> Iterator[Observed]:
    """A gatekeeper whose verdict reads a ``SchedulerIndex`` (as the command's), its loop in a thread, synced
    before the loop starts; stopped, index and watches, on the way out."""
    keeper: list[Gatekeeper] = []
    index = SchedulerIndex(api, on_change=lambda: keeper[0].schedulers_changed() if keeper else None)
    gk = Observed(api, verdict_fn=lambda: collect(api, index=index), backoff=Backoff(0.05, 0.2),
                  resync_interval=resync_interval, scheduler_index=index)
    keeper.append(gk)
    stop = threading.Event()
    thread = threading.Thread(target=gk.run, args=(stop,), daemon=True)
    gk.start()
    try:
        assert gk.wait_synced(5)
        thread.start()
        yield gk
    finally:
        stop.set()
        gk.wake()
        thread.join(5)
        gk.stop()
