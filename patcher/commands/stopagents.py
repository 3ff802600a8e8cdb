"""``scheduler-patcher stop-agents``: delete the agents' DaemonSet in the foreground and wait until its pods are gone.

``helm uninstall`` deletes the agents' ServiceAccount and RBAC together with their DaemonSet: every terminating
agent's request for the rollout Lease is then refused and each restores its node at once, so every
kube-scheduler restarts at the same time. The chart's pre-delete hook Job runs this command first: the DaemonSet
is deleted with ``propagationPolicy: Foreground`` while the RBAC is still there, each agent restores its node
when its turn comes (one scheduler restart at a time, the leader's node last), and the command ends when the API
server removed the DaemonSet, which it does only once every one of its pods is gone. Then helm deletes the rest.
A DaemonSet that is not there is nothing to wait for (exit 0). RBAC: ``daemonsets`` delete, list and watch, on
that one name.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from patcher.adapters.kube import foreground
from patcher.adapters.kube.transport import Api
from patcher.commands.conventions import EXIT_ERROR, EXIT_OK, Flags, duration, with_api
from patcher.core.kubeobj import Obj, dig


def add_arguments(p: argparse.ArgumentParser) -> None:
    f = Flags(p)
    f.add("--kubeconfig", os.environ.get("KUBECONFIG"), "kubeconfig for runs outside the cluster")
    f.add("--namespace", os.environ.get("POD_NAMESPACE", "scheduler-patcher"), "namespace of the agents' DaemonSet")
    f.add("--daemonset", "scheduler-patcher", "the agents' DaemonSet")
    f.add("--timeout", "4m", "give up after this long (helm waits 5 min for a hook by default)", type=duration)


@dataclass(frozen=True)
class Result:
    gone: bool
    left: Obj | None = None  # the DaemonSet as last seen, when it is not gone
    watched: bool = True  # the watch of it answered at least once


def stop_agents(api: Api, *, namespace: str, name: str, timeout: float, say: Callable[[str], None] = print,
                clock: Callable[[], float] = time.monotonic) -> Result:
    """Delete the DaemonSet in the foreground and wait (a watch, until ``timeout``) until the server removed it."""
    deadline = clock() + timeout
    follower = foreground.follow(api, namespace, name)
    follower.start()
    try:
        answer = foreground.delete_foreground(api, namespace, name)
        if answer is None:
            say(f"DaemonSet {namespace}/{name} does not exist: no agent to stop")
            return Result(gone=True)
        say(f"deleting DaemonSet {namespace}/{name} in the foreground: each agent restores its node, one "
            "kube-scheduler restart at a time, and ends; waiting until its pods are gone")
        while True:
            follower.changed.clear()
            listed, seen = follower.state()
            if listed and seen is None:
                say(f"DaemonSet {namespace}/{name} and its pods are gone")
                return Result(gone=True)
            remaining = deadline - clock()
            if remaining <= 0:  # what is left: the watch's view once it shows the deletion, else the answer's
                left = seen if seen is not None and dig(seen, "metadata", "deletionTimestamp") else answer
                return Result(gone=False, left=left, watched=listed)
            follower.changed.wait(remaining)
    finally:
        follower.stop()


def describe(namespace: str, name: str, result: Result, timeout: float) -> str:
    """The one error line of a DaemonSet not gone in time: what is left, and how to see which pods."""
    ds = result.left or {}
    since = dig(ds, "metadata", "deletionTimestamp")
    finalizers = ", ".join(str(f) for f in dig(ds, "metadata", "finalizers") or []) or "none"
    labels = dig(ds, "spec", "selector", "matchLabels") or {}
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    state = (f"being deleted since {since} (finalizers: {finalizers})" if since
             else "not marked for deletion")
    watch = "" if result.watched else "; its watch never answered"
    return (f"DaemonSet {namespace}/{name} is still there after {timeout:g}s: {state}: its pods have not all "
            f"ended (kubectl -n {namespace} get pods" + (f" -l {selector}" if selector else "") + f"){watch}")


def main(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Exit 0 once the DaemonSet and its pods are gone (or there was none); 1 when they are not by ``--timeout``."""
    err = err or sys.stderr
    say = functools.partial(print, file=out or sys.stdout, flush=True)  # a hook Job's log shows each step now
    result = with_api(args.kubeconfig, err, lambda api: stop_agents(
        api, namespace=args.namespace, name=args.daemonset, timeout=args.timeout, say=say))
    if result is None:
        return EXIT_ERROR
    if result.gone:
        return EXIT_OK
    err.write(f"scheduler-patcher: error: {describe(args.namespace, args.daemonset, result, args.timeout)}\n")
    return EXIT_ERROR
