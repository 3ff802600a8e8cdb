"""Command line: ``scheduler-patcher plan|apply|restore|status|run|readiness|gatekeeper|restore-nodes|stop-agents|
completion``.

Exit codes are a contract for scripts and operators (the table is in ``--help`` and in
docs/operator-contract.md): a usage error never shares a code with a result, so a typo in CI cannot pass for
"changes pending". Every flag can come from ``PATCHER_<FLAG>`` so the DaemonSet can configure the agent
through its environment. Paths typed by a user resolve against the working directory, except node paths,
which are read below ``--host-root`` when one is given.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from patcher import __version__
from patcher.commands.conventions import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_PENDING,
    EXIT_PIPE,
    EXIT_USAGE,
    OUTPUTS,
    Flags,
    Parser,
    boolean,
    duration,
    emit,
    exit_codes,
)
from patcher.core.errors import PatcherError
from patcher.core.extprobe import as_data, blocking, summary
from patcher.core.schedconfig.version import SUPPORTED_TEXT
from patcher.core.settings import FLAG, Api, Files, Lifecycle, Loop, Pod, Rollout, Serve, Settings, Status, groups
from patcher.services import nodefiles

#: Flags that name a path on the node: read below --host-root (in the container: /host). Without --host-root
#: they are ordinary local paths and a relative one resolves against the working directory.
NODE_PATH_FLAGS = ("manifest_dir", "host_config_dir", "state_dir")
#: Flags that name a path on the machine the command runs on: a relative one resolves against the working
#: directory.
LOCAL_PATH_FLAGS = ("source", "kubeconfig")
T = TypeVar("T")
#: Where RKE2 keeps its static pods: named in the hint when the kubeadm folder is missing.
RKE2_MANIFEST_DIR = "/var/lib/rancher/rke2/agent/pod-manifests"

#: The --help sections of the node commands, one per group of ``patcher.core.settings.Settings`` (named by its
#: field there): a flag is listed under the group it sets (tests/unit/test_settings.py checks it).
SECTIONS = {
    "files": "node files (every node command)",
    "pod": "this agent (the DaemonSet's downward API)",
    "api": "Kubernetes API",
    "lifecycle": "lifecycle: restart, rollback, extender pre-flight, stop",
    "loop": "the agent's loop",
    "rollout": "rollout (one node at a time)",
    "status": "cluster verdict",
    "serve": "probes and logs",
}


#: Flags of the shared set that ``restore`` does not read (it removes what the marker lists, whatever the source
#: and version): accepted, so one flag set still serves apply and restore in a script, but not in its --help.
RESTORE_IGNORES = frozenset({"--source", "--on-foreign-config", "--kube-version"})


def kube_version(value: str) -> str:
    """``--kube-version``: a Kubernetes version inside the supported range, else a usage error (exit 64)."""
    from patcher.core.schedconfig.version import supported_version

    try:
        return supported_version(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _text(value: Any) -> str | None:
    """A setting's default as a flag's value is typed (``600.0`` seconds: ``10m``)."""
    if value is None or isinstance(value, str | Path):
        return None if value is None else str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    unit, size = next(((u, n) for u, n in (("h", 3600), ("m", 60)) if value >= n and value % n == 0), ("s", 1))
    return f"{value / size:g}{unit}"


def _parser_kw(name: str, hint: Any) -> dict[str, Any]:
    """What argparse needs for a setting of type ``hint`` (a number of seconds is a duration)."""
    if name == "--kube-version":
        return {"type": kube_version}
    if hint is bool:
        return {"type": boolean, "nargs": "?", "const": True}
    if hint in (float, int, float | None):
        return {"type": duration}
    return {"choices": list(typing.get_args(hint))} if typing.get_origin(hint) is Literal else {}


def _add_flags(p: argparse.ArgumentParser, group: str, hidden: frozenset[str] = frozenset()) -> None:
    """The flags of one settings group, declared there (``patcher.core.settings.flag``), in its --help section."""
    kind = groups()[group]
    f, hints = Flags(p.add_argument_group(SECTIONS[group])), typing.get_type_hints(kind)
    for field in dataclasses.fields(kind):
        if (name := field.metadata.get(FLAG)) is not None:
            env, default = field.metadata.get("env"), _text(field.default)
            shown = field.metadata["help"].replace("%", "%%") + (f" ({SUPPORTED_TEXT})" if name == "--kube-version"
                                                                  else "")
            f.add(name, os.environ.get(env, default) if env else default,
                  argparse.SUPPRESS if name in hidden else shown, **_parser_kw(name, hints[field.name]))
    if group == "api":  # the group itself, absent with --no-api
        no_api = next(f for f in dataclasses.fields(Settings) if f.name == "api")
        f.add(no_api.metadata[FLAG], "false", no_api.metadata["help"], type=boolean, nargs="?", const=True)


def _group(kind: type[T], args: argparse.Namespace, **given: Any) -> T:
    """A settings group from the parsed flags that name its fields, ``given`` taking precedence."""
    flagged = {f.name: getattr(args, str(f.metadata[FLAG]).lstrip("-").replace("-", "_"))
               for f in dataclasses.fields(kind) if FLAG in f.metadata}  # type: ignore[arg-type]
    return kind(**{**flagged, **given})


def _files(args: argparse.Namespace) -> Files:
    return _group(Files, args, source=Path(args.source), host_root=Path(args.host_root),
                  host_config_dir=args.host_config_dir.rstrip("/") or "/", prefix=args.annotation_prefix.rstrip("/"))


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
        value, flag = getattr(args, name), "--" + name.replace("_", "-")
        if value.startswith("/"):
            continue
        if args.host_root == "/":
            setattr(args, name, os.path.normpath(os.path.join(cwd, value)))
            typed[flag] = (value, getattr(args, name))
        else:
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


def _check_extenders(args: argparse.Namespace, opts: Files, config: Any) -> list[Any] | None:
    """With ``--check-extenders``: probe every extender of the rendered config (``None`` without the flag)."""
    if not args.check_extenders or config is None:
        return None
    from patcher.adapters import extprobe

    return extprobe.check(opts, config)


def cmd_plan(args: argparse.Namespace) -> int:
    opts = _files(args)
    plan = nodefiles.plan_apply(opts)
    config = plan.config
    notes = [n for n in plan.notes if not n.startswith("source form")]
    probes = _check_extenders(args, opts, config)
    info = None if config is None else {"form": config.form, "api_version": config.api_version,
                                        "hash": config.config_hash, "file": config.main,
                                        "kube_version": config.kube_version or None}
    doc: dict[str, object] = {"config": info, "source_hash": plan.source_hash or None, "notes": notes}
    if probes is not None:
        doc["extenders"] = as_data(probes)
    comments = [] if config is None else [
        f"source form: {config.form}, apiVersion {config.api_version}, config {config.short_hash}"]
    comments += [f"note: {note}" for note in notes] + [f"extender {result.line()}" for result in probes or []]
    if probes == []:
        comments.append("extender: none in the config")
    return _show_changes(args, plan.manifest_path, plan.changes, doc, comments, "up to date, nothing to do")


def _show_changes(args: argparse.Namespace, manifest: str, changes: Sequence[nodefiles.FileChange],
                  doc: dict[str, object], comments: list[str], nothing: str) -> int:
    """plan's and restore --dry-run's output: the diffs and exit 2, or one ``nothing`` line and exit 0."""
    if args.output != "text":
        emit({"manifest": manifest, "pending": bool(changes), "changes": _changes_doc(changes), **doc}, args.output)
        return EXIT_PENDING if changes else EXIT_OK
    for line in comments:
        sys.stdout.write(f"# {line}\n")
    if not changes:
        sys.stdout.write(f"# {manifest}: {nothing}\n")
        return EXIT_OK
    for change in changes:
        sys.stdout.write(change.diff())
    return EXIT_PENDING


def _report(args: argparse.Namespace, manifest: str, lines: list[str], notes: list[str],
            extenders: list[dict[str, object]] | None = None) -> None:
    """apply/restore output: one line per file written or removed, or one ``unchanged`` line."""
    if args.output != "text":
        actions = [{"action": line.split(" ", 1)[0], "path": line.split(" ", 1)[1]} for line in lines]
        doc: dict[str, object] = {"manifest": manifest, "changed": bool(lines), "actions": actions, "notes": notes}
        if extenders is not None:
            doc["extenders"] = extenders
        emit(doc, args.output)
        return
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    for line in lines:
        print(line)
    if not lines:
        print(f"{manifest}: unchanged")


def cmd_apply(args: argparse.Namespace) -> int:
    opts = _files(args)
    plan = nodefiles.plan_apply(opts)
    probes = _check_extenders(args, opts, plan.config) if plan.pending else None
    if probes is not None:
        if args.output == "text":
            for result in probes:
                print(f"extender {result.line()}", file=sys.stderr)
        if blocking(probes):
            print(f"scheduler-patcher: error: not writing: {summary(blocking(probes))}; nothing was changed",
                  file=sys.stderr)
            return EXIT_ERROR
    lines = nodefiles.apply(opts, plan)[0] if plan.pending else []
    _report(args, plan.manifest_path, lines, plan.notes, as_data(probes) if probes is not None else None)
    return EXIT_OK


def _changes_doc(changes: Sequence[nodefiles.FileChange]) -> list[dict[str, object]]:
    return [{"path": c.node_path, "kind": c.kind,
             "action": "create" if c.old is None else "delete" if c.new is None else "update",
             "diff": c.diff()} for c in changes]


def cmd_restore(args: argparse.Namespace) -> int:
    opts = _files(args)
    plan = nodefiles.plan_restore(opts)
    if args.dry_run:  # the diff a restore would make, as plan prints apply's
        changes, kept = nodefiles.restore_preview(opts, plan)
        notes = plan.notes + kept
        return _show_changes(args, plan.manifest_path, changes, {"notes": notes}, [f"note: {n}" for n in notes],
                             "unchanged, nothing to restore")
    lines = nodefiles.restore(opts, plan)
    _report(args, plan.manifest_path, lines, plan.notes)
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    info = nodefiles.status(_files(args))
    if args.output != "text":
        emit(info, args.output)
    else:
        width = max(len(k) for k in info)
        for key in sorted(info):
            value = info[key]
            shown = "-" if value is None else (str(value).lower() if isinstance(value, bool) else str(value))
            print(f"{key.ljust(width)}  {shown}")
    return EXIT_ERROR if info.get("error") else EXIT_OK


#: Ports kube-scheduler listens on in the host network the agent shares (hostNetwork): never the agent's.
SCHEDULER_PORTS = {"10259": "its secure port", "10251": "its insecure port before 1.23"}


class RunFlagError(Exception):
    """A ``run`` flag the agent cannot start with; ``code`` is the exit code the contract gives it."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def run_settings(args: argparse.Namespace) -> Settings:
    """The agent's settings from the parsed ``run`` flags: the one place a flag becomes a setting (each field
    of ``patcher.core.settings`` names its flag; tests/unit/test_settings.py checks the two agree)."""
    port = args.listen.rpartition(":")[2]
    if port in SCHEDULER_PORTS:
        raise RunFlagError(f"--listen {args.listen}: port {port} is kube-scheduler's "
                           f"({SCHEDULER_PORTS[port]}); the agent shares the host's network with it")
    if args.rollout_lease_duration < 1:  # the Lease holds whole seconds: 0.5 s would be a Lease of 0 s
        raise RunFlagError(f"--rollout-lease-duration {args.rollout_lease_duration:g}s: must be at least 1s")
    if args.restart_settle >= args.restart_timeout:
        raise RunFlagError(f"--restart-settle {args.restart_settle:g}s: must be shorter than --restart-timeout "
                           f"({args.restart_timeout:g}s), or no restart could ever count as Ready")
    if not args.no_api and not args.node_name:
        raise RunFlagError("NODE_NAME is not set: the agent cannot tell which Node it runs on. Set it from the "
                           "downward API (spec.nodeName), or pass --no-api for a run without a cluster", EXIT_ERROR)
    settings = Settings(
        files=_files(args), lifecycle=_group(Lifecycle, args), loop=_group(Loop, args),
        pod=_group(Pod, args),
        api=None if args.no_api else _group(Api, args),
        rollout=_group(Rollout, args, lease_duration=int(args.rollout_lease_duration)),
        status=_group(Status, args), serve=_group(Serve, args))
    grace, kill = settings.lifecycle.grace_period, settings.pod.termination_grace
    if kill is not None and grace >= kill:
        raise RunFlagError(f"--grace-period {grace:g}s: must be shorter than --termination-grace-period ({kill:g}s, "
                           "the pod's terminationGracePeriodSeconds), or the kubelet kills the agent inside its "
                           "restore")
    return settings


def cmd_run(args: argparse.Namespace) -> int:
    try:
        config = run_settings(args)
    except RunFlagError as exc:
        print(f"scheduler-patcher run: error: {exc}", file=sys.stderr)
        return exc.code
    from patcher.services import runner

    return runner.run(config)


def cmd_completion(args: argparse.Namespace) -> int:
    """A completion script for bash or zsh, with every command's flags (the cluster commands' too)."""
    import shtab

    sys.stdout.write(shtab.complete(build_parser(), shell=args.shell))
    return EXIT_OK


CLUSTER_COMMANDS = {
    "readiness": (
        "patcher.commands.readiness",
        "cluster verdict: is every control-plane scheduler Ready with the config?",
    ),
    "gatekeeper": ("patcher.commands.gatekeeper", "release scheduling gates once every scheduler runs the extender"),
    "restore-nodes": ("patcher.commands.restorenodes",
                      "restore every control-plane node (one pod each, from a PodTemplate); the uninstall's Job"),
    "stop-agents": ("patcher.commands.stopagents",
                    "delete the agents' DaemonSet in the foreground and wait until its pods are gone (each "
                    "restored its node, one at a time); the uninstall's pre-delete Job"),
}


def build_parser(load: Sequence[str] = tuple(CLUSTER_COMMANDS)) -> Parser:
    parser = Parser(
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
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=exit_codes(name))
        _add_flags(p, "files", RESTORE_IGNORES if name == "restore" else frozenset())
        if name != "run":
            Flags(p).add("--output", "text", "output format", "-o", choices=list(OUTPUTS))
        if name in ("plan", "apply"):
            Flags(p).add("--check-extenders", "false", "call each extender of the config once (a filter request "
                         "with no nodes) and print URL, answer or error, time; apply writes nothing when one that "
                         "is not ignorable does not answer", type=boolean, nargs="?", const=True)
        if name == "restore":
            p.add_argument("--dry-run", action="store_true", help="print the diff the restore would make and write "
                           "nothing (exit 2 when it would change something, as plan)")
        if name == "run":
            for group in [g for g in SECTIONS if g != "files"]:
                _add_flags(p, group)
        p.set_defaults(func=func)
    for name, (module_name, help_text) in CLUSTER_COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=exit_codes(name))
        if name in load:  # importing them loads the Kubernetes client: only for the command that runs
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(func=module.main)
    p = sub.add_parser("completion", help="print a shell completion script (bash or zsh)",
                       description="print a shell completion script, e.g. "
                                   "`source <(scheduler-patcher completion bash)`", epilog=exit_codes("completion"))
    p.add_argument("shell", choices=["bash", "zsh"])
    p.set_defaults(func=cmd_completion)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    command = next((w for w in words if not w.startswith("-")), None)
    parser = build_parser(load=[command] if command in CLUSTER_COMMANDS else [])
    if not words:
        parser.print_help()
        return EXIT_OK
    if command is None and not {"-h", "--help", "--version"} & set(words):
        parser.unknown(words)  # e.g. `--verison`: the closest top-level flag, not "COMMAND is required"
    args, extra = parser.parse_known_args(words)
    if extra:  # refused by the subcommand's parser: its usage, and the closest flag it has
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        typing.cast(Parser, commands.choices[args.command]).unknown(extra)  # add_parser: the parent's class
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
    except BrokenPipeError:  # stdout to /dev/null: the interpreter's final flush cannot raise it again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE
