"""The command line's conventions, shared by every command: exit codes, the parser, env-backed flags, value
types and machine-readable output. Its own module so that the cluster commands (readiness, gatekeeper) and the
node commands use one set of rules without importing each other."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, NoReturn, TextIO

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
  {EXIT_PENDING:<4}plan, restore --dry-run: changes pending (the diffs are on stdout; nothing was written)
  {EXIT_USAGE:<4}usage error: unknown flag, invalid flag value, a --host-root that does not exist
  {EXIT_PIPE:<4}the output pipe was closed early (e.g. `plan | head`)
"""

OUTPUTS = ("text", "json", "yaml")


def env_name(flag: str) -> str:
    return "PATCHER_" + flag.lstrip("-").upper().replace("-", "_")


class Parser(argparse.ArgumentParser):
    """argparse with the project's conventions: no prefix matching, usage errors exit 64, exit codes in help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # `--sour` must not silently mean `--source`
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        kwargs.setdefault("epilog", EXIT_CODES)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


class Flags:
    """Adds flags whose default comes from the environment, and says so in --help."""

    def __init__(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        self.parser = parser  # a parser, or one of its --help sections

    def add(self, flag: str, default: Any = None, help: str = "", *names: str, **kw: Any) -> None:
        env = env_name(flag)
        value = os.environ.get(env, default)
        choices = kw.get("choices")
        if choices and value is not None and value not in choices:
            raise SystemExit(f"scheduler-patcher: error: {env}={value!r} is not one of {', '.join(choices)}")
        if kw.get("type") is boolean:
            kw.setdefault("metavar", "true|false")
        elif kw.get("type") is duration:
            kw.setdefault("metavar", "DURATION")
        elif choices:
            kw.setdefault("metavar", "|".join(choices))
        # A help text that explains its own default (e.g. "(default: detected)") keeps it; an empty default
        # says nothing worth showing.
        shown = f" (default: {default})" if default not in (None, "") and "(default:" not in help else ""
        self.parser.add_argument(*names, flag, default=value, help=f"{help}{shown} [env {env}]", **kw)


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


def duration(value: str) -> float:
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


def boolean(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {value!r} (true or false)")
