"""Command line: ``scheduler-patcher plan|apply|restore|status|run``.

Exit codes are a contract for scripts and operators: 0 success (plan: nothing to do), 2 plan has pending
changes, 1 error. Every flag can come from ``PATCHER_<FLAG>`` so the DaemonSet can configure the agent
through its environment.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from patcher import __version__, engine
from patcher.errors import PatcherError

EXIT_OK, EXIT_ERROR, EXIT_PENDING = 0, 1, 2


def _env(flag: str) -> str:
    return "PATCHER_" + flag.lstrip("-").upper().replace("-", "_")


class _Flags:
    """Adds flags whose default comes from the environment, and says so in --help."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser

    def add(self, flag: str, default: Any = None, help: str = "", **kw: Any) -> None:
        env = _env(flag)
        value = os.environ.get(env, default)
        choices = kw.get("choices")
        if choices and value is not None and value not in choices:
            raise SystemExit(f"scheduler-patcher: error: {env}={value!r} is not one of {', '.join(choices)}")
        shown = f" (default: {default})" if default is not None else ""
        self.parser.add_argument(flag, default=value, help=f"{help}{shown} [env {env}]", **kw)


def _common(p: argparse.ArgumentParser) -> None:
    f = _Flags(p)
    f.add("--manifest-dir", "/etc/kubernetes/manifests", "kubelet static-pod folder (node path)")
    f.add("--manifest-name", "kube-scheduler.yaml", "kube-scheduler manifest file name")
    f.add("--source", "/etc/scheduler-patcher/source", "source folder with the scheduler config (ConfigMap mount)")
    f.add("--host-config-dir", "/etc/kubernetes/scheduler-patcher", "node folder for the rendered config")
    f.add("--state-dir", "/var/lib/scheduler-patcher", "node folder for the agent's state and backups")
    f.add("--host-root", "/", "where the node's file system is mounted (/host in the container)")
    f.add("--annotation-prefix", "scheduler-patcher.io", "prefix of our annotations")
    f.add("--container-name", None, "kube-scheduler container name (default: detected)")
    f.add("--on-foreign-config", "merge", "what to do with a --config we did not add",
          choices=["fail", "replace", "merge"])
    f.add("--kube-version", None, "kube-scheduler version, when the image tag does not tell")


def _options(args: argparse.Namespace) -> engine.Options:
    return engine.Options(
        manifest_dir=args.manifest_dir, manifest_name=args.manifest_name, source=Path(args.source),
        host_config_dir=args.host_config_dir.rstrip("/") or "/", state_dir=args.state_dir,
        host_root=Path(args.host_root), prefix=args.annotation_prefix.rstrip("/"),
        container_name=args.container_name, on_foreign=args.on_foreign_config, kube_version=args.kube_version,
    )


def cmd_plan(args: argparse.Namespace) -> int:
    opts = _options(args)
    plan = engine.plan_apply(opts)
    out = sys.stdout
    config = plan.config
    if config is not None:
        out.write(f"# source form: {config.form}, apiVersion {config.api_version}, config {config.short_hash}\n")
    for note in plan.notes:
        if not note.startswith("source form"):
            out.write(f"# note: {note}\n")
    if not plan.pending:
        out.write(f"# {plan.manifest_path}: up to date, nothing to do\n")
        return EXIT_OK
    for change in plan.changes:
        out.write(change.diff())
    return EXIT_PENDING


def cmd_apply(args: argparse.Namespace) -> int:
    opts = _options(args)
    plan = engine.plan_apply(opts)
    for note in plan.notes:
        print(f"note: {note}", file=sys.stderr)
    if not plan.pending:
        return EXIT_OK
    lines, _ = engine.apply(opts, plan)
    for line in lines:
        print(line)
    return EXIT_OK


def cmd_restore(args: argparse.Namespace) -> int:
    opts = _options(args)
    plan = engine.plan_restore(opts)
    for note in plan.notes:
        print(f"note: {note}", file=sys.stderr)
    for line in engine.restore(opts, plan):
        print(line)
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    info = engine.status(_options(args))
    if args.output == "json":
        print(json.dumps(info, indent=2, sort_keys=True))
    else:
        width = max(len(k) for k in info)
        for key in sorted(info):
            value = info[key]
            shown = "-" if value is None else (str(value).lower() if isinstance(value, bool) else str(value))
            print(f"{key.ljust(width)}  {shown}")
    return EXIT_OK


def _seconds(value: str) -> float:
    """``300``, ``300s``, ``5m``, ``1h``: the DaemonSet's env vars read better with units."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for suffix in ("ms", "s", "m", "h"):
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * units[suffix]
    return float(value)


def _bool(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {value!r}")


def _run_flags(p: argparse.ArgumentParser) -> None:
    f = _Flags(p)
    f.add("--node-name", os.environ.get("NODE_NAME"), "this node's name (the DaemonSet sets NODE_NAME)")
    f.add("--kubeconfig", os.environ.get("KUBECONFIG"), "kubeconfig for runs outside the cluster")
    f.add("--no-api", "false", "run with no Kubernetes API (files only)", type=_bool, nargs="?", const=True)
    f.add("--resync-interval", "5m", "periodic reconcile, a safety net for missed events", type=_seconds)
    f.add("--restart-timeout", "10m", "how long the scheduler may take to come back Ready", type=_seconds)
    f.add("--rollback-on-failure", "true", "roll back when the scheduler does not come back", type=_bool)
    f.add("--restore-on-exit", "always", "restore the manifest on SIGTERM", choices=["always", "never"])
    f.add("--local-check", "false", "check the kube-scheduler process with psutil (needs hostPID)",
          type=_bool, nargs="?", const=True)
    f.add("--listen", ":9808", "address of /healthz, /readyz and /metrics")
    f.add("--grace-period", "25s", "time budget for restoring and reporting on SIGTERM", type=_seconds)
    f.add("--rollout", "coordinated", "one node at a time through a Lease, or each node on its own",
          choices=["coordinated", "independent"])
    f.add("--rollout-lease", "scheduler-patcher-rollout", "name of the rollout Lease")
    f.add("--rollout-lease-duration", "60s", "a dead holder is superseded after this long", type=_seconds)
    f.add("--namespace", os.environ.get("POD_NAMESPACE", "scheduler-patcher"),
          "the agent's namespace (rollout Lease, status ConfigMaps)")
    f.add("--publish-status", "true", "publish the cluster verdict in the scheduler-patcher-status ConfigMap",
          type=_bool)
    f.add("--compat-csi-baremetal", "false", "also publish the csi-baremetal operator's extender-readiness "
          "ConfigMap", type=_bool)
    f.add("--compat-namespace", None, "namespace of the extender-readiness ConfigMap (default: --namespace)")
    f.add("--log-format", "text", "log format", choices=["text", "json"])
    f.add("--log-level", "info", "log level", choices=["debug", "info", "warning", "error"])


def cmd_run(args: argparse.Namespace) -> int:
    from patcher import runner

    return runner.run(_options(args), args)


CLUSTER_COMMANDS = {
    "readiness": ("patcher.readiness", "cluster verdict: is every control-plane scheduler Ready with the config?"),
    "gatekeeper": ("patcher.gatekeeper", "release scheduling gates once every scheduler runs the extender"),
}


def build_parser(load: Sequence[str] = tuple(CLUSTER_COMMANDS)) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scheduler-patcher",
        description="Plug a scheduler extender into a static-pod kube-scheduler, reversibly.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands: list[tuple[str, str, Callable[[argparse.Namespace], int]]] = [
        ("plan", "print the diffs an apply would make (exit 2 when changes are pending)", cmd_plan),
        ("apply", "patch the manifest and copy the config (idempotent)", cmd_apply),
        ("restore", "remove exactly our changes from the current manifest", cmd_restore),
        ("status", "report what is on disk", cmd_status),
        ("run", "the node agent: keep the node patched, report, restore on SIGTERM", cmd_run),
    ]
    for name, help_text, func in commands:
        p = sub.add_parser(name, help=help_text, description=help_text)
        _common(p)
        if name == "status":
            _Flags(p).add("--output", "text", "output format", choices=["text", "json"])
        if name == "run":
            _run_flags(p)
        p.set_defaults(func=func)
    for name, (module_name, help_text) in CLUSTER_COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name in load:  # importing them loads the Kubernetes client: only for the command that runs
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(func=module.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    command = next((w for w in words if not w.startswith("-")), None)
    parser = build_parser(load=[command] if command in CLUSTER_COMMANDS else [])
    args = parser.parse_args(words)
    try:
        return int(args.func(args))
    except PatcherError as exc:
        print(f"scheduler-patcher: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
