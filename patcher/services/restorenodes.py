"""``restore-nodes``: restore every control-plane node through one pod bound to each, end when all are restored.

The uninstall's restore (the chart's post-delete hook, ``manifests/uninstall``). It needs no node count: it lists
the control-plane Nodes (the readiness verdict's selectors), creates one pod per node from the PodTemplate
(``patcher.core.restorepods.restore_pod``: bound by ``spec.nodeName``, so no scheduler is involved), follows this
run's pods with a watch, and returns as soon as every node's pod succeeded (the offline ``restore`` exited 0,
which it also does on a node that is already clean), or failed for good, or the deadline passed. Each restored
Node gets the annotations a restore on exit leaves (``state: Restored``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from patcher.adapters.kube import restorepods as api_side
from patcher.adapters.kube.errors import ApiError
from patcher.adapters.kube.transport import Api
from patcher.core import restorepods
from patcher.core.kubeobj import dig
from patcher.core.restorepods import NodeRestore, Outcome

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Result:
    outcomes: list[NodeRestore]
    not_ready: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.outcomes) and restorepods.restored(self.outcomes)


def restore_nodes(api: Api, *, namespace: str, template_name: str, run: str, selectors: Sequence[str],
                  prefix: str, timeout: float, pod_name: str | None = None,
                  say: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic) -> Result:
    """Create one restore pod per control-plane node and wait until each succeeded (or ``timeout`` passed)."""
    deadline = clock() + timeout
    template = api_side.read_pod_template(api, namespace, template_name)
    owner = api_side.job_owner_of(api, namespace, pod_name)
    nodes = api_side.control_plane_nodes(api, selectors)
    names = [str(dig(n, "metadata", "name")) for n in nodes]
    not_ready = [str(dig(n, "metadata", "name")) for n in nodes if not restorepods.node_ready(n)]
    if not names:
        return Result([], [])
    say(f"restoring {len(names)} control-plane node(s): {', '.join(names)}")
    pods = api_side.RunPods(api, namespace, run)
    pods.start()
    try:
        for name in names:
            created = api_side.create_pod(api, namespace,
                                          restorepods.restore_pod(template, name, run, namespace, owner))
            log.debug("created pod %s for node %s", dig(created, "metadata", "name"), name)
        reported: set[str] = set()
        while True:
            pods.changed.clear()
            outcomes = restorepods.verdict(names, restorepods.pods_by_node(pods.snapshot()))
            for o in outcomes:
                if o.node in reported or o.outcome not in (Outcome.RESTORED, Outcome.FAILED):
                    continue
                reported.add(o.node)
                say(o.line())
                if o.outcome is Outcome.RESTORED:
                    try:
                        api_side.mark_restored(api, o.node, prefix)
                    except ApiError as exc:  # the files are restored; a stale annotation is only cosmetic
                        say(f"node {o.node}: restored, but its annotations were not updated: {exc.detail}")
            remaining = deadline - clock()
            if restorepods.finished(outcomes) or remaining <= 0:
                return Result(outcomes, not_ready)
            pods.changed.wait(remaining)
    finally:
        pods.stop()
