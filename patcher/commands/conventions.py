"""The command line's conventions, shared by every command: exit codes, the parser, env-backed flags, value
types and machine-readable output. Its own module so that the cluster commands (readiness, gatekeeper) and the
node commands use one set of rules without importing each other."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, TextIO, TypeVar

if TYPE_CHECKING:
    from patcher.adapters.kube.transport import Api

T = TypeVar("T")

EXIT_OK, EXIT_ERROR, EXIT_PENDING = 0, 1, 2
#: sysexits.h EX_USAGE: a mistyped flag must not look like a result (plan's 2 is "changes pending").
EXIT_USAGE = 64
#: What a shell reports for a process killed by SIGPIPE: the reader of our output went away (``plan | head``).
EXIT_PIPE = 141

#: Each command's exit codes, as its --help ends with them (docs/operator-contract.md has the same table): a
#: command lists only the codes it can give.
_CODES: dict[str, list[tuple[int, str]]] = {
    "plan": [(EXIT_OK, "nothing to do"), (EXIT_ERROR, "error (one line on stderr, naming the file and the problem)"),
             (EXIT_PENDING, "changes pending (the diffs are on stdout; nothing was written)")],
    "apply": [(EXIT_OK, "applied, or nothing to do (\"unchanged\")"),
              (EXIT_ERROR, "error (one line on stderr, naming the file and the problem; nothing written)")],
    "restore": [(EXIT_OK, "restored, or nothing to restore (\"unchanged\"); --dry-run: nothing to restore"),
                (EXIT_ERROR, "error (one line on stderr, naming the file and the problem; nothing written)"),
                (EXIT_PENDING, "--dry-run: changes pending (the diffs are on stdout; nothing was written)")],
    "status": [(EXIT_OK, "every row is fine"), (EXIT_ERROR, "a row reports an error, or the command failed")],
    "run": [(EXIT_OK, "stopped by SIGTERM/SIGINT, the manifest restored or kept"),
            (EXIT_ERROR, "could not start (no NODE_NAME, no usable credentials), or the restore on exit failed")],
    "readiness": [(EXIT_OK, "every control-plane scheduler is Ready with the config"),
                  (EXIT_ERROR, "not Ready (after --timeout with --wait), or the API failed")],
    "gatekeeper": [(EXIT_OK, "stopped by SIGTERM/SIGINT"),
                   (EXIT_ERROR, "could not start (credentials, a certificate, the listen address)")],
    "restore-nodes": [(EXIT_OK, "every control-plane node restored"),
                      (EXIT_ERROR, "a node not restored within --timeout (each one named), or the API failed")],
    "stop-agents": [(EXIT_OK, "the agents' DaemonSet and its pods are gone (or there was none)"),
                    (EXIT_ERROR, "still there after --timeout (what is left named), or the API failed")],
    "completion": [(EXIT_OK, "the script is on stdout")],
}
_USAGE = (EXIT_USAGE, "usage error: unknown flag, invalid flag or PATCHER_* value, a --host-root that does not exist")
_PIPE = (EXIT_PIPE, "the output pipe was closed early (e.g. `plan | head`)")
#: Commands that print to a pipe a reader may close.
_PRINTERS = ("plan", "apply", "restore", "status", "readiness", "completion")


def exit_codes(command: str | None = None) -> str:
    """The ``exit codes:`` section of ``command``'s --help (``None``: the top-level help, every code)."""
    if command is None:
        rows = [(EXIT_OK, "success"), (EXIT_ERROR, "error (see each command's --help)"),
                (EXIT_PENDING, "plan, restore --dry-run: changes pending"), _USAGE, _PIPE]
    else:
        rows = [*_CODES[command], _USAGE] + ([_PIPE] if command in _PRINTERS else [])
    return "exit codes:\n" + "".join(f"  {code:<4}{meaning}\n" for code, meaning in rows)


OUTPUTS = ("text", "json", "yaml")


class Parser(argparse.ArgumentParser):
    """argparse with the project's conventions: no prefix matching, usage errors exit 64, exit codes in help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # `--sour` must not silently mean `--source`
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        kwargs.setdefault("epilog", exit_codes())
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")

    def unknown(self, words: list[str]) -> NoReturn:
        """Refuse words this (sub)command does not take, with its own usage and the closest flag it has."""
        import difflib

        flags = sorted({o for a in self._actions if a.help != argparse.SUPPRESS for o in a.option_strings
                        if o.startswith("--")})
        hints = {}
        for word in words:
            typed = word.split("=", 1)[0]
            close = difflib.get_close_matches(typed, flags, n=1, cutoff=0.6) if typed.startswith("--") else []
            if close:
                hints[typed] = close[0]
        said = [f"did you mean {flag}?" if len(hints) == 1 else f"{typed}: did you mean {flag}?"
                for typed, flag in hints.items()]
        self.error(f"unrecognized arguments: {' '.join(words)}" + "".join(f"; {h}" for h in said))


class Flags:
    """Adds flags whose default comes from the environment, and says so in --help."""

    def __init__(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        self.parser = parser  # a parser, or one of its --help sections

    def add(self, flag: str, default: Any = None, help: str = "", *names: str, **kw: Any) -> None:
        env = "PATCHER_" + flag.lstrip("-").upper().replace("-", "_")
        value = os.environ.get(env, default)
        choices = kw.get("choices")
        if choices and "type" not in kw:
            # Checked when the command that has the flag parses (argparse converts a string default through
            # `type`, never through `choices`): a bad PATCHER_* value is then that command's usage error (64), and
            # no concern of the other commands (PATCHER_OUTPUT=xml must not stop `run`, which has no --output).
            kw["type"] = _one_of(tuple(choices), env, os.environ.get(env))
        if kw.get("type") is boolean:
            kw.setdefault("metavar", "true|false")
        elif kw.get("type") is duration:
            kw.setdefault("metavar", "DURATION")
        elif choices:
            kw.setdefault("metavar", "|".join(choices))
        # A help text that explains its own default (e.g. "(default: detected)") keeps it; an empty default
        # says nothing worth showing.
        shown = f" (default: {default})" if default not in (None, "") and "(default:" not in help else ""
        text = help if help == argparse.SUPPRESS else f"{help}{shown} [env {env}]"  # hidden: accepted, not listed
        self.parser.add_argument(*names, flag, default=value, help=text, **kw)


def _one_of(choices: tuple[str, ...], env: str, from_env: str | None) -> Any:
    def check(value: str) -> str:
        if value in choices:
            return value
        where = f" (from {env})" if value == from_env else ""
        raise argparse.ArgumentTypeError(f"{value!r} is not one of {', '.join(choices)}{where}")

    return check


def emit(obj: Any, fmt: str, out: TextIO | None = None) -> None:
    """Print ``obj`` as JSON or YAML (``text`` is each command's own)."""
    out = out or sys.stdout
    if fmt == "json":
        out.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    else:
        from ruamel.yaml import YAML

        yaml = YAML(typ="safe", pure=True)
        yaml.default_flow_style = False
        yaml.representer.add_representer(str, _block_text)
        yaml.dump(obj, out)


def _block_text(representer: Any, text: str) -> Any:
    """A string of several lines (a diff) as a literal block (``|``), read as it is printed; the emitter falls
    back to a quoted scalar by itself for text a block cannot hold (trailing spaces on a line, control bytes)."""
    style = "|" if "\n" in text.rstrip("\n") else None
    return representer.represent_scalar("tag:yaml.org,2002:str", text, style=style)


def with_api(kubeconfig: str | None, err: TextIO, work: Callable[[Api], T], context: str | None = None) -> T | None:
    """``work(api)`` with a client from ``--kubeconfig`` (else kubectl's order) and ``--context``, closed after;
    ``None`` once the one error line is on ``err`` (no usable credentials, or the API failed): the cluster
    commands' exit 1."""
    from patcher.adapters.kube.client import ApiConfigError, ClientSettings, build_api_client
    from patcher.adapters.kube.errors import ApiError

    api = None
    try:
        api = build_api_client(ClientSettings(kubeconfig=kubeconfig, context=context))
        return work(api)
    except (ApiConfigError, ApiError, ValueError) as exc:
        err.write(f"scheduler-patcher: error: {exc}\n")
        return None
    finally:
        if api is not None:
            api.close()


def duration(value: str) -> float:
    """``300``, ``300s``, ``5m``, ``1h``: the DaemonSet's env vars read better with units."""
    number, factor = value, 1.0
    for suffix, size in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):  # "ms" before "s"
        if value.endswith(suffix):
            number, factor = value[: -len(suffix)], size
            break
    try:
        seconds = float(number) * factor
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {value!r} (examples: 30, 30s, 500ms, 5m, 1h)") from None
    if seconds < 0 or seconds != seconds:
        raise argparse.ArgumentTypeError(f"not a duration: {value!r} (must not be negative)")
    return seconds


def boolean(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {value!r} (true or false)")
