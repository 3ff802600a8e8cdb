"""The real promtool for tests: ``tools/get-promtool.sh`` fetches it once (Debian's prometheus package) into a
cache outside the clone; ``find_promtool`` says where, or why not."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
GET_PROMTOOL = ROOT / "tools/get-promtool.sh"
RULES = ROOT / "charts/scheduler-patcher/files/alerts.yaml"
RULE_TESTS = ROOT / "tests/monitoring/alerts.test.yaml"


@functools.cache
def find_promtool() -> tuple[str | None, str]:
    """(path of the real promtool, "") or (None, why not)."""
    proc = subprocess.run(["sh", str(GET_PROMTOOL)], capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        return None, (proc.stderr.strip().splitlines() or [f"{GET_PROMTOOL} failed"])[-1]
    return proc.stdout.strip(), ""


def promtool(binary: str, *args: str, stdin: bytes | None = None, cwd: Path | None = None) -> tuple[int, str]:
    """``promtool args...``: the exit code and its stdout and stderr together (promtool splits its findings
    between the two depending on the command)."""
    proc = subprocess.run([binary, *args], input=stdin, capture_output=True, timeout=120, check=False, cwd=cwd)
    return proc.returncode, (proc.stdout + proc.stderr).decode(errors="replace")
