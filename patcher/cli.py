"""Command line: ``scheduler-patcher plan|apply|restore|status|run|readiness|gatekeeper|completion``.

Exit codes are a contract for scripts and operators (the table is in ``--help`` and in
docs/operator-contract.md): a usage error never shares a code with a result, so a typo in CI cannot pass for
"changes pending". Every flag can come from ``PATCHER_<FLAG>`` so the DaemonSet can configure the agent
through its environment. Paths typed by a user resolve against the working directory, except node paths,
which are read below ``--host-root`` when one is given.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from patcher import __version__, engine
from patcher.errors import PatcherError

EXIT_OK, EXIT_ERROR, EXIT_PENDING = 0, 1, 2
#: sysexits.h EX_USAGE: a mistyped flag must not look like a result (plan's 2 is "changes pending").
EXIT_USAGE = 64
#: What a shell reports for a process killed by SIGPIPE: the reader of our output went away (``plan | head``).
EXIT_PIPE = 141

EXIT_CODES = f"""\
exit codes:
  {EXIT_OK:<4}success; plan: nothing to do
  {EXIT_ERROR:<4}error (one line on stderr, naming the file and the problem); status: a row reports an error;
      readiness: the cluster is not Ready
  {EXIT_PENDING:<4}plan only: changes pending (the diffs are on stdout; nothing was written)
  {EXIT_USAGE:<4}usage error: unknown flag, invalid flag value, a --host-root that does not exist
  {EXIT_PIPE:<4}the output pipe was closed early (e.g. `plan | head`)
"""

#: Flags that name a path on the node: read below --host-root (in the container: /host). Without --host-root
#: they are ordinary local paths and a relative one resolves against the working directory.
NODE_PATH_FLAGS = ("manifest_dir", "host_config_dir", "state_dir")
#: Flags that name a path on the machine the command runs on: a relative one resolves against the working
#: directory.
LOCAL_PATH_FLAGS = ("source", "kubeconfig")
#: Where RKE2 keeps its static pods: named in the hint when the kubeadm folder is missing.
RKE2_MANIFEST_DIR = "/var/lib/rancher/rke2/agent/pod-manifests"

OUTPUTS = ("text", "json", "yaml")


def _env(flag: str) -> str:
    return "PATCHER_" + flag.lstrip("-").upper().replace("-", "_")


class _Parser(argparse.ArgumentParser):
    """argparse with the project's conventions: no prefix matching, usage errors exit 64, exit codes in help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # `--sour` must not silently mean `--source`
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        kwargs.setdefault("epilog", EXIT_CODES)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


class _Flags:
    """Adds flags whose default comes from the environment, and says so in --help."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser

    def add(self, flag: str, default: Any = None, help: str = "", *names: str, **kw: Any) -> None:
        env = _env(flag)
        value = os.environ.get(env, default)
        choices = kw.get("choices")
        if choices and value is not None and value not in choices:
            raise SystemExit(f"scheduler-patcher: error: {env}={value!r} is not one of {', '.join(choices)}")
        if kw.get("type") is _bool:
            kw.setdefault("metavar", "true|false")
        elif kw.get("type") is _seconds:
            kw.setdefault("metavar", "DURATION")
        elif choices:
            kw.setdefault("metavar", "|".join(choices))
        # A help text that explains its own default (e.g. "(default: detected)") keeps it; an empty default
        # says nothing worth showing.
        shown = f" (default: {default})" if default not in (None, "") and "(default:" not in help else ""
        self.parser.add_argument(*names, flag, default=value, help=f"{help}{shown} [env {env}]", **kw)


def _common(p: argparse.ArgumentParser) -> None:
    f = _Flags(p)
    f.add("--manifest-dir", "/etc/kubernetes/manifests",
          f"kubelet static-pod folder (node path; RKE2: {RKE2_MANIFEST_DIR})")
    f.add("--manifest-name", "kube-scheduler.yaml", "kube-scheduler manifest file name")
    f.add("--source", "/etc/scheduler-patcher/source", "source folder with the scheduler config (ConfigMap mount)")
    f.add("--host-config-dir", "/etc/kubernetes/scheduler-patcher", "node folder for the rendered config (node path)")
    f.add("--state-dir", "/var/lib/scheduler-patcher", "node folder for the agent's state and backups (node path)")
    f.add("--host-root", "/", "where the node's file system is mounted (/host in the container); node paths "
          "are read below it")
    f.add("--annotation-prefix", "scheduler-patcher.io", "prefix of our annotations")
    f.add("--container-name", None, "kube-scheduler container name (default: detected)")
    f.add("--on-foreign-config", "merge", "what to do with a --config we did not add",
          choices=["fail", "replace", "merge"])
    f.add("--kube-version", None, "kube-scheduler version, when the image tag does not tell")


def _output_flag(p: argparse.ArgumentParser) -> None:
    _Flags(p).add("--output", "text", "output format", "-o", choices=list(OUTPUTS))


def _options(args: argparse.Namespace) -> engine.Options:
    return engine.Options(
        manifest_dir=args.manifest_dir, manifest_name=args.manifest_name, source=Path(args.source),
        host_config_dir=args.host_config_dir.rstrip("/") or "/", state_dir=args.state_dir,
        host_root=Path(args.host_root), prefix=args.annotation_prefix.rstrip("/"),
        container_name=args.container_name, on_foreign=args.on_foreign_config, kube_version=args.kube_version,
    )


def resolve_paths(args: argparse.Namespace, cwd: str) -> list[str]:
    """Make the path flags absolute in place; return the usage errors (empty when all is well).

    Pure except for the one ``isdir`` of ``--host-root``: a host root that does not exist is refused instead
    of being created under by the agent.
    """
    problems: list[str] = []
    typed: dict[str, tuple[str, str]] = {}  # flag -> (what the user typed, what it resolved to)
    args.typed_paths = typed
    for name in LOCAL_PATH_FLAGS:
        value = getattr(args, name, None)
        if value and os.pathsep not in value:  # KUBECONFIG may be a list: the client resolves those itself
            setattr(args, name, os.path.normpath(os.path.join(cwd, value)))
            if getattr(args, name) != value:
                typed["--" + name] = (value, getattr(args, name))
    host_root = getattr(args, "host_root", None)
    if host_root is None:
        return problems
    args.host_root = os.path.normpath(os.path.join(cwd, host_root))
    if not os.path.isdir(args.host_root):
        shown = host_root if host_root == args.host_root else f"{host_root} (resolved to {args.host_root})"
        problems.append(f"--host-root {shown}: no such folder")
    for name in NODE_PATH_FLAGS:
        value = getattr(args, name)
        if value.startswith("/"):
            continue
        if args.host_root == "/":
            setattr(args, name, os.path.normpath(os.path.join(cwd, value)))
            typed["--" + name.replace("_", "-")] = (value, getattr(args, name))
        else:
            flag = "--" + name.replace("_", "-")
            problems.append(f"{flag} {value}: a node path must be absolute when --host-root is given "
                            f"(it is read below {args.host_root})")
    return problems


def explain(exc: PatcherError, args: argparse.Namespace) -> str:
    """The error line; for a node path not found, where it was looked for, and hints for a missing manifest folder."""
    text = str(exc)
    host_root = getattr(args, "host_root", "/")
    path = exc.path or ""
    node_folders = [getattr(args, name, "") for name in NODE_PATH_FLAGS]
    under_node_folder = any(f and (path == f or path.startswith(f.rstrip("/") + "/")) for f in node_folders)
    if host_root != "/" and under_node_folder and "not found" in exc.problem:
        text += f" (node path, looked for at {os.path.join(host_root, path.lstrip('/'))})"
    for flag, (value, resolved) in getattr(args, "typed_paths", {}).items():
        if path == resolved or path.startswith(resolved.rstrip("/") + "/"):
            text += f" ({flag} {value} resolved to {resolved})"
            break
    if exc.problem == "manifest folder not found":
        where = ("for a copy of a node's files, point --host-root at its root" if host_root == "/" else
                 f"is --host-root {host_root} a copy of the node's /?")
        text += f"; {where} Else set --manifest-dir (RKE2: {RKE2_MANIFEST_DIR})"
    return text


def emit(obj: Any, fmt: str, out: TextIO | None = None) -> None:
    """Print ``obj`` as JSON or YAML (``text`` is each command's own)."""
    out = out or sys.stdout
    if fmt == "json":
        out.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    else:
        from ruamel.yaml import YAML

        yaml = YAML(typ="safe", pure=True)
        yaml.default_flow_style = False
        yaml.dump(obj, out)


def _config_info(config: Any) -> dict[str, Any] | None:
    if config is None:
        return None
    return {"form": config.form, "api_version": config.api_version, "hash": config.config_hash,
            "file": config.main, "kube_version": config.kube_version or None}


def cmd_plan(args: argparse.Namespace) -> int:
    opts = _options(args)
    plan = engine.plan_apply(opts)
    config = plan.config
    notes = [n for n in plan.notes if not n.startswith("source form")]
    if args.output != "text":
        changes = [{"path": c.node_path, "kind": c.kind,
                    "action": "create" if c.old is None else "delete" if c.new is None else "update",
                    "diff": c.diff()} for c in plan.changes]
        emit({"manifest": plan.manifest_path, "pending": plan.pending, "config": _config_info(config),
              "source_hash": plan.source_hash or None, "notes": notes, "changes": changes}, args.output)
        return EXIT_PENDING if plan.pending else EXIT_OK
    out = sys.stdout
    if config is not None:
        out.write(f"# source form: {config.form}, apiVersion {config.api_version}, config {config.short_hash}\n")
    for note in notes:
        out.write(f"# note: {note}\n")
    if not plan.pending:
        out.write(f"# {plan.manifest_path}: up to date, nothing to do\n")
        return EXIT_OK
    for change in plan.changes:
        out.write(change.diff())
    return EXIT_PENDING


def _report(args: argparse.Namespace, manifest: str, lines: list[str], notes: list[str]) -> None:
    """apply/restore output: one line per file written or removed, or one ``unchanged`` line."""
    if args.output != "text":
        actions = [{"action": line.split(" ", 1)[0], "path": line.split(" ", 1)[1]} for line in lines]
        emit({"manifest": manifest, "changed": bool(lines), "actions": actions, "notes": notes}, args.output)
        return
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    for line in lines:
        print(line)


def cmd_apply(args: argparse.Namespace) -> int:
    opts = _options(args)
    plan = engine.plan_apply(opts)
    lines = engine.apply(opts, plan)[0] if plan.pending else []
    _report(args, plan.manifest_path, lines, plan.notes)
    if not lines and args.output == "text":
        print(f"{plan.manifest_path}: unchanged")
    return EXIT_OK


def cmd_restore(args: argparse.Namespace) -> int:
    opts = _options(args)
    plan = engine.plan_restore(opts)
    _report(args, plan.manifest_path, engine.restore(opts, plan), plan.notes)
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    info = engine.status(_options(args))
    if args.output != "text":
        emit(info, args.output)
    else:
        width = max(len(k) for k in info)
        for key in sorted(info):
            value = info[key]
            shown = "-" if value is None else (str(value).lower() if isinstance(value, bool) else str(value))
            print(f"{key.ljust(width)}  {shown}")
    return EXIT_ERROR if info.get("error") else EXIT_OK


def _seconds(value: str) -> float:
    """``300``, ``300s``, ``5m``, ``1h``: the DaemonSet's env vars read better with units."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    number, factor = value, 1.0
    for suffix in ("ms", "s", "m", "h"):
        if value.endswith(suffix):
            number, factor = value[: -len(suffix)], units[suffix]
            break
    try:
        seconds = float(number) * factor
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {value!r} (examples: 30, 30s, 500ms, 5m, 1h)") from None
    if seconds < 0 or seconds != seconds:
        raise argparse.ArgumentTypeError(f"not a duration: {value!r} (must not be negative)")
    return seconds


def _bool(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {value!r} (true or false)")


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
    f.add("--listen", ":9808", "address of /healthz, /livez, /readyz and /metrics")
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


def cmd_completion(args: argparse.Namespace) -> int:
    """A completion script for bash or zsh, with every command's flags (the cluster commands' too)."""
    import shtab

    sys.stdout.write(shtab.complete(build_parser(), shell=args.shell))
    return EXIT_OK


CLUSTER_COMMANDS = {
    "readiness": ("patcher.readiness", "cluster verdict: is every control-plane scheduler Ready with the config?"),
    "gatekeeper": ("patcher.gatekeeper", "release scheduling gates once every scheduler runs the extender"),
}


def build_parser(load: Sequence[str] = tuple(CLUSTER_COMMANDS)) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="scheduler-patcher",
        description="Plug a scheduler extender into a static-pod kube-scheduler, reversibly.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands: list[tuple[str, str, Callable[[argparse.Namespace], int]]] = [
        ("plan", "print the diffs an apply would make (exit 2 when changes are pending)", cmd_plan),
        ("apply", "patch the manifest and copy the config (idempotent)", cmd_apply),
        ("restore", "remove exactly our changes from the current manifest", cmd_restore),
        ("status", "report what is on disk (exit 1 when it shows an error)", cmd_status),
        ("run", "the node agent: keep the node patched, report, restore on SIGTERM", cmd_run),
    ]
    for name, help_text, func in commands:
        p = sub.add_parser(name, help=help_text, description=help_text)
        _common(p)
        if name != "run":
            _output_flag(p)
        if name == "run":
            _run_flags(p)
        p.set_defaults(func=func)
    for name, (module_name, help_text) in CLUSTER_COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name in load:  # importing them loads the Kubernetes client: only for the command that runs
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(func=module.main)
    p = sub.add_parser("completion", help="print a shell completion script (bash or zsh)",
                       description="print a shell completion script, e.g. "
                                   "`source <(scheduler-patcher completion bash)`")
    p.add_argument("shell", choices=["bash", "zsh"])
    p.set_defaults(func=cmd_completion)
    return parser


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot raise BrokenPipeError again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    command = next((w for w in words if not w.startswith("-")), None)
    parser = build_parser(load=[command] if command in CLUSTER_COMMANDS else [])
    if not words:
        parser.print_help()
        return EXIT_OK
    args = parser.parse_args(words)
    problems = resolve_paths(args, os.getcwd())
    if problems:
        for problem in problems:
            print(f"scheduler-patcher {args.command}: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    try:
        code = int(args.func(args))
        sys.stdout.flush()
        return code
    except PatcherError as exc:
        print(f"scheduler-patcher: error: {explain(exc, args)}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_PIPE
