"""``scheduler-patcher restore-nodes``: restore every control-plane node, one pod each, and end when all are.

The uninstall's restore (the chart's post-delete hook Job, ``manifests/uninstall``) must need no node count typed
by hand and end as soon as every node is restored. So it lists the control-plane Nodes (the readiness verdict's
selectors), creates one pod per node from the PodTemplate, bound by ``spec.nodeName`` (no scheduler involved: it
works while the scheduler does not), follows this run's pods with a watch, and ends when every pod succeeded (the
offline ``restore`` exited 0, as it does on a clean node too), failed for good, or the deadline passed. Each
restored Node gets the annotations a restore on exit leaves (``state: Restored``). RBAC: ``podtemplates`` get (the
one named), ``pods`` create/get/list/watch in its namespace, ``nodes`` list and patch.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from patcher.adapters.kube import restorepods as api_side
from patcher.adapters.kube.errors import ApiError
from patcher.adapters.kube.transport import Api
from patcher.commands.conventions import EXIT_ERROR, EXIT_OK, Flags, boolean, duration, with_api
from patcher.core import restorepods
from patcher.core.kubeobj import dig, ready
from patcher.core.readiness import DEFAULT_NODE_SELECTOR, LEGACY_MASTER_SELECTOR, node_selectors
from patcher.core.restorepods import NodeRestore, Outcome

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    f = Flags(p)
    f.add("--kubeconfig", os.environ.get("KUBECONFIG"), "kubeconfig for runs outside the cluster")
    f.add("--namespace", os.environ.get("POD_NAMESPACE", "scheduler-patcher"),
          "namespace of the PodTemplate and of the pods it creates")
    f.add("--pod-template", "scheduler-patcher-restore", "the PodTemplate each node's pod is made from (it runs "
          "`scheduler-patcher restore` with the node's paths)")
    f.add("--annotation-prefix", "scheduler-patcher.io", "prefix of the agents' Node annotations")
    f.add("--node-selector", DEFAULT_NODE_SELECTOR, "label selector of the control-plane nodes")
    f.add("--legacy-master-label", "true", f"also count nodes labelled {LEGACY_MASTER_SELECTOR}", type=boolean)
    f.add("--timeout", "4m", "give up after this long (helm waits 5 min for a hook by default)", type=duration)


@dataclass(frozen=True)
class Result:
    outcomes: list[NodeRestore]
    not_ready: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.outcomes) and all(o.outcome is Outcome.RESTORED for o in self.outcomes)


def restore_nodes(api: Api, *, namespace: str, template_name: str, run: str, selectors: Sequence[str],
                  prefix: str, timeout: float, pod_name: str | None = None,
                  say: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic) -> Result:
    """Create one restore pod per control-plane node and wait until each succeeded (or ``timeout`` passed)."""
    deadline = clock() + timeout
    template = api_side.read_pod_template(api, namespace, template_name)
    owner = api_side.job_owner_of(api, namespace, pod_name)
    nodes = api_side.control_plane_nodes(api, selectors)
    names = [str(dig(n, "metadata", "name")) for n in nodes]
    not_ready = [str(dig(n, "metadata", "name")) for n in nodes if not ready(n)]
    if not names:
        return Result([])
    say(f"restoring {len(names)} control-plane node(s): {', '.join(names)}")
    pods = api_side.RunPods(api, namespace, run)
    pods.start()
    try:
        for name in names:
            created = api_side.create_pod(api, namespace,
                                          restorepods.restore_pod(template, name, run, namespace, owner))
            log.debug("created pod %s for node %s", dig(created, "metadata", "name"), name)
        said: dict[str, str] = {}  # node -> the last line said for it: a pod's progress shows as it happens
        while True:
            pods.changed.clear()
            by_node = restorepods.pods_by_node(pods.snapshot())
            outcomes = [restorepods.node_outcome(name, by_node.get(name)) for name in names]
            for o in outcomes:
                if o.node not in by_node or said.get(o.node) == (line := o.line()):
                    continue
                said[o.node] = line
                if o.outcome is Outcome.RESTORED:  # the Node marked first: its line says the node is done
                    try:
                        api_side.mark_restored(api, o.node, prefix)
                    except ApiError as exc:  # the files are restored; a stale annotation is only cosmetic
                        line += f"; its annotations were not updated: {exc.detail}"
                say(line)
            remaining = deadline - clock()
            if restorepods.finished(outcomes) or remaining <= 0:
                return Result(outcomes, not_ready)
            pods.changed.wait(remaining)
    finally:
        pods.stop()


def main(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Exit 0 once every control-plane node is restored; 1 when one is not by ``--timeout`` (each named)."""
    err = err or sys.stderr
    say = functools.partial(print, file=out or sys.stdout, flush=True)  # a hook Job's log shows each step now
    selectors = node_selectors(args.node_selector, args.legacy_master_label)
    result = with_api(args.kubeconfig, err, lambda api: restore_nodes(
        api, namespace=args.namespace, template_name=args.pod_template, run=secrets.token_hex(6),
        selectors=selectors, prefix=args.annotation_prefix, timeout=args.timeout, pod_name=os.environ.get("POD_NAME"),
        say=say))
    if result is None:
        return EXIT_ERROR
    if not result.outcomes:
        err.write(f"scheduler-patcher: error: no control-plane node found ({' or '.join(selectors)}): nothing "
                  "restored\n")
        return EXIT_ERROR
    if result.ok:
        say(f"every control-plane node is restored ({len(result.outcomes)})")
        return EXIT_OK
    lines = restorepods.describe(result.outcomes, result.not_ready)
    err.write(f"scheduler-patcher: error: {len(lines)} of {len(result.outcomes)} control-plane node(s) not "
              f"restored after {args.timeout:g}s:\n" + "".join(f"  {line}\n" for line in lines))
    return EXIT_ERROR
