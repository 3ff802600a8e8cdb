"""The CPU time a whole process has used, in nanoseconds, threads that have exited included.

Why not ``psutil.Process.cpu_times()``: it reads ``/proc/<pid>/stat``, whose times come in clock ticks (10 ms).
An idle agent uses a few milliseconds a minute, so over the bench's 60 s window either side showed 0 or 1 tick
(0.000 or 0.017 % of a core) by where the tick boundaries fell: the idle row compared rounding, not work.
The per-thread ``schedstat`` files are exact but lose a thread that exited inside the window (our extender probe
runs in a short-lived thread). The kernel's taskstats interface answers for a thread group, exact
(``cpu_run_virtual_total``: the scheduler's own runtime sum) and with its exited threads; it needs a kernel
built with it and the right to ask (root here). ``cpu_ns`` returns None where it cannot; the bench then falls
back to the ticks and says so.
"""

from __future__ import annotations

import contextlib
import socket
import struct

_NETLINK_GENERIC = 16
_GENL_ID_CTRL = 0x10
_CTRL_CMD_GETFAMILY = 3
_CTRL_ATTR_FAMILY_ID = 1
_CTRL_ATTR_FAMILY_NAME = 2
_TASKSTATS_CMD_GET = 1
_TASKSTATS_CMD_ATTR_TGID = 2
_TASKSTATS_TYPE_STATS = 3
_TASKSTATS_TYPE_AGGR_TGID = 5
_NLMSG_ERROR = 2
_NLM_F_REQUEST = 1
#: Offset of ``cpu_run_virtual_total`` in ``struct taskstats`` (linux/taskstats.h, unchanged since version 1): the
#: scheduler's runtime sum (``se.sum_exec_runtime``) in ns. ``cpu_run_real_total`` before it is utime + stime,
#: sampled by the tick like /proc...
_CPU_RUN_VIRTUAL_TOTAL = 72


def _attrs(data: bytes) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    i = 0
    while i + 4 <= len(data):
        length, kind = struct.unpack_from("HH", data, i)
        if length < 4:
            break
        out[kind & 0x3FFF] = data[i + 4:i + length]
        i += (length + 3) & ~3
    return out


def _attr(kind: int, value: bytes) -> bytes:
    return struct.pack("HH", 4 + len(value), kind) + value + b"\0" * (-len(value) % 4)


class TaskStats:
    """A generic-netlink socket to the kernel's taskstats family."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_GENERIC)
        self._sock.bind((0, 0))
        self._seq = 0
        family = self._ask(_GENL_ID_CTRL, _CTRL_CMD_GETFAMILY, _attr(_CTRL_ATTR_FAMILY_NAME, b"TASKSTATS\0"))
        self._family = struct.unpack_from("H", family[_CTRL_ATTR_FAMILY_ID])[0]

    def _ask(self, family: int, cmd: int, attrs: bytes) -> dict[int, bytes]:
        self._seq += 1
        payload = struct.pack("BBH", cmd, 1, 0) + attrs
        self._sock.send(struct.pack("IHHII", 16 + len(payload), family, _NLM_F_REQUEST, self._seq, 0) + payload)
        data = self._sock.recv(65536)
        length, kind = struct.unpack_from("IH", data, 0)
        if kind == _NLMSG_ERROR:
            code = -struct.unpack_from("i", data, 16)[0]
            raise OSError(code, "taskstats")
        return _attrs(data[20:length])

    def cpu_ns(self, pid: int) -> int:
        answer = self._ask(self._family, _TASKSTATS_CMD_GET, _attr(_TASKSTATS_CMD_ATTR_TGID, struct.pack("I", pid)))
        stats = _attrs(answer[_TASKSTATS_TYPE_AGGR_TGID])[_TASKSTATS_TYPE_STATS]
        value: int = struct.unpack_from("Q", stats, _CPU_RUN_VIRTUAL_TOTAL)[0]
        return value

    def close(self) -> None:
        self._sock.close()


def open_taskstats(pid: int) -> TaskStats | None:
    """A taskstats socket when this kernel answers for ``pid`` with a runtime (some kernels leave it 0 without
    delay accounting); None otherwise."""
    try:
        ts = TaskStats()
    except (OSError, KeyError, struct.error):
        return None
    try:
        if ts.cpu_ns(pid) > 0:
            return ts
    except (OSError, KeyError, struct.error):
        pass
    with contextlib.suppress(OSError):
        ts.close()
    return None
