"""The interpreter's cyclic garbage collector, kept out of the agent's reaction times.

A full (generation 2) collection walks every container object the process holds and stops every thread,
the agent loop and its signal handling included, while it does. Almost all of those objects are the program
itself: modules, classes and functions, the Kubernetes client's ~900 model classes, the compiled schemas.
With the API client imported they are many, so a full collection is a pause a user can see, and it falls at
an unpredictable moment: the slowest ConfigMap swaps were those (the measured figures are in
docs/benchmarks.md).

``settle`` is called once a start-up phase has imported and built what the agent keeps for its life: it
collects once (so no garbage is kept forever), then moves every survivor to the permanent generation, which
the collector never walks (``gc.freeze``). Frozen objects are still freed by reference counting; only a
reference cycle among them that dies later would be kept, and what is frozen is the program and what it keeps
for its life (modules, the client, the probes' server), so that cost is bounded by the two settles.
Later full collections walk only what the agent allocated since: a few thousand objects.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)


def settle(phase: str) -> int:
    """Collect, then freeze what survives; returns how many objects were frozen now. ``phase`` is for the log."""
    started = time.perf_counter()
    gc.collect()
    before = gc.get_freeze_count()
    gc.freeze()
    frozen = gc.get_freeze_count() - before
    log.debug("heap settled after %s: %d objects out of the collector's walk (%.1f ms)", phase, frozen,
              (time.perf_counter() - started) * 1000)
    return frozen
