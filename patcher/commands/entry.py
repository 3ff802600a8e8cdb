"""The process entry point: stop signals first, then the command line (which imports the heavy parts)."""

from __future__ import annotations

import os
import sys

from patcher.adapters import signals

#: Seconds the agent's last flush of its output may take before the process ends without it.
FLUSH_BOUND = 1.0


def main() -> int:
    agent = signals.install_for(sys.argv[1:])
    from patcher.commands.cli import main as cli_main  # the heavy imports: after the handlers are in

    code = cli_main()
    if agent:
        exit_now(code)
    return code


def exit_now(code: int) -> None:
    """End the agent's process once its shutdown returned (the manifest restored or kept, the report sent or
    given up), without the interpreter's own shutdown.

    Its daemon threads (the API client's, the folder watch's, the health server's) may still be inside a C call
    or a write to stderr then; CPython's shutdown aborted the process (SIGABRT, exit -6, after a successful
    restore) when such a thread held stderr's lock: "could not acquire lock for <stderr> at interpreter
    shutdown, possibly due to daemon threads". Here the output is flushed while those threads still run (so a
    write in progress finishes), bounded by ``FLUSH_BOUND`` (a thread blocked on a full pipe never finishes),
    then ``os._exit``: nothing of the agent's is left to run at that point."""
    import contextlib  # here, not above: the module's imports are on the exec -> handlers-in path
    import logging
    import threading

    def flush() -> None:
        for handler in logging.getLogger().handlers:
            handler.flush()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # closed, or a broken pipe: nothing more to say
                stream.flush()

    flusher = threading.Thread(target=flush, name="exit-flush", daemon=True)
    flusher.start()
    flusher.join(FLUSH_BOUND)
    os._exit(code)
