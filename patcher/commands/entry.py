"""The process entry point: stop signals first, then the command line (which imports the heavy parts)."""

from __future__ import annotations

import sys

from patcher.adapters import signals


def main() -> int:
    signals.install_for(sys.argv[1:])
    from patcher.commands.cli import main as cli_main  # ~0.35 s of imports: after the handlers are in

    return cli_main()
