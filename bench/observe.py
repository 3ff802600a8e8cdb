"""Send SIGTERM to a process and see when a file holds given bytes again: ``bench/peer.py``'s "SIGTERM ->
manifest restored", for every side alike. Standard library only, and nothing else runs in this
process.

Usage: ``observe.py PID FILE EXPECTED``: once the watch is in place, sends SIGTERM to PID and prints one JSON
line, ``{"sent": t0, "seen": t1, "policy": "fifo" | "normal"}`` (``time.monotonic()``, the same clock in every
process here), when FILE holds the bytes of the file EXPECTED.

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


#: Read without updating the file's access time. With it, this read was a metadata write of its own, which
#: waits for the journal commit a writer that fsyncs has in flight right after its rename (ours; the peer does
#: not fsync): the observer's write, measured as the restore's.
NOATIME = getattr(os, "O_NOATIME", 0)


def holds(path: str, expected: bytes) -> bool:
    try:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | NOATIME)
        except PermissionError:  # O_NOATIME needs the file's owner (or CAP_FOWNER)
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # the peer removes the manifest before it writes it again (not at its restore)
        return False
    try:
        return os.read(fd, len(expected) + 1) == expected
    finally:
        os.close(fd)


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


def first_to_run() -> str:
    """Run before every ordinary process once woken (SCHED_FIFO, lowest real-time priority), when allowed.

    This process sleeps through the measured window (the watch fires only once a write is complete); what is
    left is how long it waits for a CPU once woken. On 2 busy cores that was 0.1-0.5 ms, and longest for the
    side whose process has more threads waking at its own write (our folder watch sees our rename): the
    observer's queueing, not the restore. Real-time, it runs at once, for every side alike. Not allowed
    (no CAP_SYS_NICE): the ordinary policy, said in the answer."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except (AttributeError, OSError):
        return "normal"
    return "fifo"


def main() -> None:
    pid, path, expected = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    with open(expected, "rb") as f:
        want = f.read()
    policy = first_to_run()
    sent, seen = observe(pid, path, want)
    print(json.dumps({"sent": sent, "seen": seen, "policy": policy}), flush=True)


if __name__ == "__main__":
    main()
