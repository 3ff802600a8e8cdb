"""The benchmark scripts behind the README's figures still run (tiny sizes; the figures come from make bench)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*argv: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_engine_bench_runs() -> None:
    out = run("bench/run.py", "-n", "3")
    assert "apply (config changed: plan + write, kubeadm)" in out and "median" in out


def test_agent_bench_runs() -> None:
    out = run("bench/agent_bench.py", "--changes", "2", "--pods", "1", "--sigterms", "1", "--idle-seconds", "1",
              "--starts", "1", "--black-holes", "0")
    for what in ("manifest rewritten", "/readyz 200", "SIGTERM -> manifest restored", "RSS", "signal-safe"):
        assert what in out


def test_limits_bench_runs() -> None:
    assert "largest accepted manifest" in run("bench/limits.py")
