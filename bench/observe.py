"""Send SIGTERM to a process and see when a file holds given bytes again: ``bench/peer.py``'s "SIGTERM ->
manifest restored", for every side alike (issue 26). Standard library only, and nothing else runs in this
process.

Usage: ``observe.py PID FILE EXPECTED``: once the watch is in place, sends SIGTERM to PID and prints one JSON
line, ``{"sent": t0, "seen": t1}`` (``time.monotonic()``, the same clock in every process here), when FILE
holds the bytes of the file EXPECTED.

Why its own process: the observer was a thread of the bench, which also runs the API emulators. An
emulator's thread that holds the GIL when the write lands (serving a request of ours, which talks to it; the
peer does not after its start) kept the observer from seeing it for up to a switch interval (5 ms):
"ours with the API" was penalised by the bench, not by its restore.

Why inotify, not a poll: the figure is a fraction of a millisecond, and a poll (``time.sleep(0.0002)``:
0.25-0.3 ms a tick here, plus a read of the file) was a large part of it: up to a tick late, and its
wake-ups, up to 4000 a second, preempted the process being measured on a 2-core machine, either side. The
watch wakes this process only when a write is complete: a file closed after writing (the peer writes the
manifest in place: open with truncate, write, close) or a file moved into place (ours renames its staged file
over the manifest); not on the steps before those (the peer's truncate, our touch of the staged file), where
a wake-up preempted the writer just before its write. A missed event would cost only the fallback tick,
never a wrong figure: the predicate reads the file itself.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import sys
import time

IN_CLOSE_WRITE = 0x8
IN_MOVED_TO = 0x80
TICK = 0.05  # seconds: the fallback re-read when no event comes
TIMEOUT = 30.0


def holds(path: str, expected: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read() == expected
    except OSError:  # the peer removes the manifest before it writes it again (not at its restore)
        return False


def observe(pid: int, path: str, expected: bytes) -> tuple[float, float]:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    try:
        if libc.inotify_add_watch(fd, os.fsencode(os.path.dirname(path)), IN_CLOSE_WRITE | IN_MOVED_TO) < 0:
            raise OSError(ctypes.get_errno(), "inotify_add_watch", path)
        sent = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        while not holds(path, expected):
            if time.monotonic() - sent > TIMEOUT:
                raise TimeoutError(f"{path} not restored within {TIMEOUT:g} s")
            select.select([fd], [], [], TICK)
            try:
                while os.read(fd, 65536):
                    pass
            except BlockingIOError:
                pass
        return sent, time.monotonic()
    finally:
        os.close(fd)


def main() -> None:
    pid, path, expected = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    with open(expected, "rb") as f:
        want = f.read()
    sent, seen = observe(pid, path, want)
    print(json.dumps({"sent": sent, "seen": seen}), flush=True)


if __name__ == "__main__":
    main()
