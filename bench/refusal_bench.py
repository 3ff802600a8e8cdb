"""A FIFO and a 200 MB file in the source folder: how long ``plan``, ``apply`` and a running agent
take to refuse them, and their peak RSS. Before, the render cache's fingerprint read them with
``Path.read_bytes``: ``plan`` never ended on the FIFO (killed after 10 s) and passed 200 MB of RSS on the file.

Each CLI run is a process of its own (``os.wait4`` gives its peak RSS); the agent is ``run --no-api`` on a
valid source, patched first, then the file is put in the folder and the time to its refusal in the log is
taken, and the agent's peak RSS (``VmHWM``) after it. The tests assert the refusals, never these times.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.harness.helpers import EXTENDERS, MANIFEST, node_folders  # noqa: E402

BIG = 200 * 1024 * 1024
LIMIT_S = 10.0


def put(src: Path, name: str, kind: str) -> None:
    """``name`` in the source folder becomes a FIFO or a 200 MB file (sparse: no disk, no page cache)."""
    tmp = src / f".{name}.tmp"
    if kind == "fifo":
        os.mkfifo(tmp)
    else:
        with tmp.open("wb") as f:
            f.write(EXTENDERS.encode())
            f.truncate(BIG)
    os.replace(tmp, src / name)


def cli(command: str, root: Path, src: Path) -> tuple[float, int, int, str]:
    """(seconds, peak RSS in MiB, exit code, first line of stderr) of one CLI run, killed after ``LIMIT_S``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "patcher", command, "--host-root", str(root), "--source", str(src)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    timer = threading.Timer(LIMIT_S, proc.kill)
    timer.start()
    assert proc.stderr is not None
    err = proc.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return seconds, usage.ru_maxrss // 1024, proc.returncode, (err.strip().splitlines() or [""])[0][:150]


def agent(tmp: Path, name: str, kind: str) -> tuple[float | None, int, str]:
    """(seconds from the file's arrival to its refusal in the log, peak RSS in MiB, the log line)."""
    root, src = node_folders(tmp)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "patcher", "run", "--no-api", "--host-root", str(root),
                             "--source", str(src), "--listen", "127.0.0.1:0", "--check-extenders", "false"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    lines: list[tuple[float, str]] = []
    def read(stream: IO[bytes]) -> None:
        for line in stream:
            lines.append((time.perf_counter(), line.decode(errors="replace")))

    threading.Thread(target=read, args=(proc.stderr,), daemon=True).start()
    try:
        deadline = time.monotonic() + 30
        while b"scheduler-patcher" not in (root / MANIFEST).read_bytes():
            if time.monotonic() > deadline:
                raise SystemExit("the agent did not patch the manifest within 30 s")
            time.sleep(0.01)
        time.sleep(0.5)  # settled: the refusal below is the only news
        seen = len(lines)
        t0 = time.perf_counter()
        put(src, name, kind)
        word = "FIFO" if kind == "fifo" else "too large"
        deadline = time.monotonic() + LIMIT_S
        hit = None
        while hit is None and time.monotonic() < deadline:
            hit = next(((t, ln) for t, ln in lines[seen:] if word in ln), None)
            time.sleep(0.005)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        hwm = next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmHWM:")) // 1024
        return (hit[0] - t0 if hit else None), hwm, (hit[1].strip()[:150] if hit else "(no refusal logged)")
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> int:
    print("source folder holding a FIFO / a 200 MB file: time to refuse and peak RSS")
    print(f"{'case':<34} {'who':<6} {'seconds':>8} {'peak MiB':>9}  outcome")
    for name, kind in (("extenders.yaml", "fifo"), ("extenders.yaml", "big"), ("notes.bin", "fifo"),
                       ("notes.bin", "big")):
        case = f"{name} as {'a FIFO' if kind == 'fifo' else 'a 200 MB file'}"
        for command in ("plan", "apply"):
            with tempfile.TemporaryDirectory() as d:
                root, src = node_folders(Path(d))
                put(src, name, kind)
                seconds, rss, code, line = cli(command, root, src)
            print(f"{case:<34} {command:<6} {seconds:>8.3f} {rss:>9}  exit {code}: {line}", flush=True)
        if name == "extenders.yaml":  # an ignored name is not news to the agent: nothing to time
            d = tempfile.mkdtemp()
            try:
                took, rss, line = agent(Path(d), name, kind)
            finally:
                shutil.rmtree(d, ignore_errors=True)
            shown = f"{took:>8.3f}" if took is not None else f"{'>' + str(LIMIT_S):>8}"
            print(f"{case:<34} {'agent':<6} {shown} {rss:>9}  {line}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
