"""``scheduler-patcher restore-nodes``: restore every control-plane node, one pod each, and end when all are.

The uninstall's restore (the chart's post-delete hook Job, ``manifests/uninstall``): no node count to type, and
done as soon as every control-plane node's pod ran ``scheduler-patcher restore`` to exit 0. The work is
``patcher.services.restorenodes``. RBAC: ``podtemplates`` get (the one named), ``pods`` create/get/list/watch in
its namespace, ``nodes`` list and patch (the control-plane Nodes; their annotations once restored).
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from typing import TextIO

from patcher.adapters.kube.client import ApiConfigError, ClientSettings, build_api_client
from patcher.adapters.kube.errors import ApiError
from patcher.core import restorepods
from patcher.core.readiness import DEFAULT_NODE_SELECTOR, LEGACY_MASTER_SELECTOR, node_selectors

EXIT_RESTORED, EXIT_NOT_RESTORED = 0, 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    from patcher.commands.conventions import Flags, boolean, duration

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


def main(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Exit 0 once every control-plane node is restored; 1 when one is not by ``--timeout`` (each named)."""
    from patcher.services.restorenodes import restore_nodes

    out = out or sys.stdout
    err = err or sys.stderr
    try:
        api = build_api_client(ClientSettings(kubeconfig=args.kubeconfig))
    except ApiConfigError as exc:
        err.write(f"scheduler-patcher: error: {exc}\n")
        return EXIT_NOT_RESTORED
    selectors = node_selectors(args.node_selector, args.legacy_master_label)

    def say(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    try:
        result = restore_nodes(api, namespace=args.namespace, template_name=args.pod_template,
                               run=secrets.token_hex(6), selectors=selectors, prefix=args.annotation_prefix,
                               timeout=args.timeout, pod_name=os.environ.get("POD_NAME"), say=say)
    except (ApiError, ValueError) as exc:
        err.write(f"scheduler-patcher: error: {exc}\n")
        return EXIT_NOT_RESTORED
    finally:
        api.close()
    if not result.outcomes:
        err.write(f"scheduler-patcher: error: no control-plane node found ({' or '.join(selectors)}): nothing "
                  "restored\n")
        return EXIT_NOT_RESTORED
    if result.ok:
        say(f"every control-plane node is restored ({len(result.outcomes)})")
        return EXIT_RESTORED
    lines = restorepods.describe(result.outcomes, result.not_ready)
    err.write(f"scheduler-patcher: error: {len(lines)} of {len(result.outcomes)} control-plane node(s) not "
              f"restored after {args.timeout:g}s:\n" + "".join(f"  {line}\n" for line in lines))
    return EXIT_NOT_RESTORED
