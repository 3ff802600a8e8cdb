"""A ``scheduler-patcher`` child process whose log lines a test can wait for.

Tests of real processes must wait for what the child says it has done (a log line, a probe answer), never for
a fixed delay: on a loaded 2-core machine a child can take seconds to import its modules.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class Child:
    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", "patcher", *args], env=full_env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._eof = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def wait_line(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        """The first log line matching ``pattern`` (a regex); AssertionError if the child ends or times out."""
        regex = re.compile(pattern)
        seen = 0
        with self._cond:
            while True:
                for line in self.lines[seen:]:
                    if m := regex.search(line):
                        return m
                seen = len(self.lines)
                if self._eof:
                    raise AssertionError(f"child ended without a line matching {pattern!r}:\n" + self.output)
                if not self._cond.wait(timeout):
                    raise AssertionError(f"no line matching {pattern!r} within {timeout}s:\n" + self.output)

    @property
    def output(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def health_url(self) -> str:
        return self.wait_line(r"health server listening .*url=(http://\S+)").group(1)

    def get(self, path: str) -> int:
        try:
            with urllib.request.urlopen(self.health_url() + path, timeout=5) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def terminate(self, timeout: float = 60.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        self.proc.kill()
        self.wait(30)

    def wait(self, timeout: float = 60.0) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(10)
        return code
