"""``scheduler-patcher readiness``: print the cluster readiness verdict, or wait until it is Ready, so that a
Helm hook or a CI step can wait for "every scheduler has the extender" with one command."""

from __future__ import annotations

import argparse
import sys
import threading
from typing import TYPE_CHECKING, Any, TextIO

from patcher.adapters.kube.cluster import collect, collect_retrying, node_watchers, wait_ready
from patcher.adapters.kube.schedindex import SchedulerIndex
from patcher.commands.conventions import EXIT_ERROR, EXIT_OK, OUTPUTS, Flags, boolean, duration, emit, with_api
from patcher.core import restart
from patcher.core.readiness import (
    DEFAULT_NODE_SELECTOR,
    LEGACY_MASTER_SELECTOR,
    ClusterVerdict,
    check_expected_hash,
    node_selectors,
    render_table,
)

if TYPE_CHECKING:
    from patcher.adapters.kube.errors import ApiError
    from patcher.adapters.kube.transport import Api


def add_verdict_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``readiness`` and ``gatekeeper``: where the verdict's inputs are."""
    f = Flags(p)
    f.add("--kubeconfig", None, "kubeconfig file (default: as kubectl: $KUBECONFIG, a colon-separated list, "
          "else ~/.kube/config, else the in-cluster service account)")
    f.add("--context", None, "the kubeconfig context to use (kubectl's --context; default: its current context)")
    f.add("--annotation-prefix", "scheduler-patcher.io", "prefix of the agents' Node annotations")
    f.add("--node-selector", DEFAULT_NODE_SELECTOR, "label selector of the control-plane nodes")
    f.add("--legacy-master-label", "true", f"also count nodes labelled {LEGACY_MASTER_SELECTOR}", type=boolean)
    f.add("--mirror-namespace", "kube-system", "namespace of the kube-scheduler mirror pods")
    f.add("--static-pod-name", "kube-scheduler", "name of the scheduler static pod (mirror pods: <name>-<node>)")
    f.add("--container-name", restart.DEFAULT_CONTAINER, "the scheduler container in the mirror pod")
    f.add("--expected-hash", None, "source-hash (or config-hash) every node must run, 12 to 64 hex digits "
          "(default: the one they all agree on)", type=expected_hash)


def expected_hash(value: str) -> str:
    """Checked while parsing, so a bad one is a usage error (exit 64) like any flag value."""
    try:
        check_expected_hash(value or None)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def verdict_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``collect`` keyword arguments from the flags of ``add_verdict_arguments``."""
    return {
        "prefix": args.annotation_prefix, "node_selector": args.node_selector,
        "legacy_master_label": args.legacy_master_label, "mirror_namespace": args.mirror_namespace,
        "static_pod_name": args.static_pod_name, "container_name": args.container_name,
        "expected_hash": args.expected_hash or None,
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_verdict_arguments(p)
    f = Flags(p)
    f.add("--output", "text", "output format", "-o", choices=list(OUTPUTS))
    f.add("--wait", "false", "block until the cluster is Ready or --timeout passes", type=boolean, nargs="?",
          const=True)
    f.add("--timeout", "10m", "how long --wait waits", type=duration)
    f.add("--poll-interval", "5s", "with --wait, re-check at least this often (mirror pods are not watched)",
          type=duration)


def main(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``scheduler-patcher readiness``: exit 0 when the cluster is Ready, 1 when not (or the API fails)."""
    out = out or sys.stdout
    err = err or sys.stderr
    got = with_api(args.kubeconfig, err, lambda api: _verdict(api, args, err), context=args.context)
    if got is None:
        return EXIT_ERROR
    verdict, error = got
    if verdict is None:
        err.write(f"scheduler-patcher: error: {error if error is not None else 'no verdict'}\n")
        return EXIT_ERROR
    if args.output == "text":
        out.write(render_table(verdict))
    else:
        emit(verdict.to_dict(), args.output, out)
    if verdict.ready:
        return EXIT_OK
    if args.wait:
        last = f" (the last attempt failed: {error})" if error is not None else ""
        err.write(f"scheduler-patcher: not ready after {args.timeout:g}s{last}: " + "; ".join(verdict.explain())
                  + "\n")
    return EXIT_ERROR


def _verdict(api: Api, args: argparse.Namespace, err: TextIO) -> tuple[ClusterVerdict | None, ApiError | None]:
    """One verdict read (retried), or with ``--wait`` the verdict once Ready or at ``--timeout``; with the last
    read's error."""
    kwargs = verdict_kwargs(args)
    index: SchedulerIndex | None = None

    def verdict_fn() -> ClusterVerdict:
        return collect(api, index=index, **kwargs)

    if not args.wait:
        return collect_retrying(verdict_fn)
    changed = threading.Event()
    watchers = node_watchers(api, node_selectors(args.node_selector, args.legacy_master_label),
                             on_sync=lambda _nodes: changed.set(), on_event=lambda _kind, _node: changed.set())
    try:
        for w in watchers:
            w.start()
        # Waiting re-reads the verdict: the unlabelled schedulers from a watch of kube-system's metadata (a
        # scheduler pod's change wakes the wait too), not a list of it each time; one read lists it once.
        index = SchedulerIndex(api, kwargs["mirror_namespace"], kwargs["static_pod_name"], on_change=changed.set)
        index.start()

        def progress(v: ClusterVerdict) -> None:
            if not v.ready and args.output == "text":
                err.write(f"waiting: {v.summary()}" + "".join(f"; {r}" for r in v.explain()) + "\n")

        return wait_ready(verdict_fn, timeout=args.timeout, changed=changed, poll_interval=args.poll_interval,
                          on_progress=progress)
    finally:
        for w in watchers:
            w.stop()
        if index is not None:
            index.stop()
