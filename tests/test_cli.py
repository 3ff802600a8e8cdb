"""The CLI contract: exit codes, output lines, environment variables, error lines."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from patcher.cli import main
from tests.conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = "etc/kubernetes/manifests/kube-scheduler.yaml"


@pytest.fixture
def node(tmp_path: Path) -> Path:
    (tmp_path / "node/etc/kubernetes/manifests").mkdir(parents=True)
    shutil.copy(FIXTURES / "manifests/kubeadm.yaml", tmp_path / "node" / MANIFEST)
    shutil.copytree(ROOT / "examples/scheduler-config", tmp_path / "src")
    return tmp_path


def args(node: Path, *extra: str) -> list[str]:
    return [*extra, "--host-root", str(node / "node"), "--source", str(node / "src")]


def test_plan_apply_plan_restore(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    original = (node / "node" / MANIFEST).read_bytes()
    assert main(args(node, "plan")) == 2
    out = capsys.readouterr().out
    assert "+++ /etc/kubernetes/manifests/kube-scheduler.yaml" in out and "--- /dev/null" in out
    assert (node / "node" / MANIFEST).read_bytes() == original  # plan writes nothing

    assert main(args(node, "apply")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "wrote /etc/kubernetes/manifests/kube-scheduler.yaml"
    assert lines[0].startswith("wrote /etc/kubernetes/scheduler-patcher/config-")

    assert main(args(node, "plan")) == 0
    assert "up to date" in capsys.readouterr().out
    assert main(args(node, "apply")) == 0
    assert capsys.readouterr().out == ""

    assert main(args(node, "status", "--output", "json")) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["patched"] is True and status["foreign_config"] is None
    assert {"config_hash", "manifest_mtime", "up_to_date"} <= set(status)

    assert main(args(node, "restore")) == 0
    assert capsys.readouterr().out.splitlines()[0] == "wrote /etc/kubernetes/manifests/kube-scheduler.yaml"
    assert (node / "node" / MANIFEST).read_bytes() == original
    assert main(args(node, "restore")) == 0
    assert capsys.readouterr().out == ""


def test_errors_are_one_line_naming_the_file(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (node / "node" / MANIFEST).write_text("kind: Deployment\n")
    assert main(args(node, "apply")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["scheduler-patcher: error: /etc/kubernetes/manifests/kube-scheduler.yaml: "
                   "kind is 'Deployment', expected Pod"]


def test_flags_come_from_the_environment(node: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATCHER_HOST_ROOT", str(node / "node"))
    monkeypatch.setenv("PATCHER_SOURCE", str(node / "src"))
    monkeypatch.setenv("PATCHER_HOST_CONFIG_DIR", "/opt/sched")
    assert main(["apply"]) == 0
    assert "wrote /opt/sched/config-" in capsys.readouterr().out
    assert "--config=/opt/sched/config-" in (node / "node" / MANIFEST).read_text()


def test_python_dash_m_entry_point(node: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "patcher", *args(node, "plan")], capture_output=True,
                          text=True, env=env, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "--config=/etc/kubernetes/scheduler-patcher/config-" in proc.stdout
