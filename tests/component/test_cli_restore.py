"""The admin's session of restore and apply on a copy of a node: another annotation prefix, a dry run, a second
restore, status on a --config whose file is gone. Each command's output and exit code, as a user sees them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patcher.commands.cli import main
from tests.conftest import FIXTURES
from tests.harness.helpers import MANIFEST, cli_args, cli_node, snapshot

CONFIG_DIR = "/etc/kubernetes/scheduler-patcher"
WRONG_PREFIX = ("scheduler-patcher: error: /etc/kubernetes/manifests/kube-scheduler.yaml: carries the "
                "scheduler-patcher marker of annotation prefix scheduler-patcher.io (scheduler-patcher.io/patch), "
                "not example.com; pass --annotation-prefix scheduler-patcher.io")


@pytest.fixture
def node(tmp_path: Path) -> Path:
    return cli_node(tmp_path)


def config_file(node: Path) -> Path:
    found = sorted((node / "node" / CONFIG_DIR.lstrip("/")).glob("config-*.yaml"))
    assert len(found) == 1
    return found[0]


def test_restore_and_apply_with_another_prefix_refuse_in_one_line_and_change_nothing(
        node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(cli_args(node, "apply")) == 0
    capsys.readouterr()
    before = snapshot(str(node))
    for command in ("restore", "apply"):
        assert main(cli_args(node, command, "--annotation-prefix", "example.com")) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        assert [line for line in captured.err.splitlines() if not line.startswith("note: ")] == [WRONG_PREFIX]
    assert snapshot(str(node)) == before  # the config file the manifest names is still there
    assert main(cli_args(node, "restore", "--annotation-prefix", "scheduler-patcher.io")) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"removed {CONFIG_DIR}/config-")


def test_restore_dry_run_prints_the_diff_and_writes_nothing(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    original = (node / "node" / MANIFEST).read_text()
    assert main(cli_args(node, "apply")) == 0
    name = config_file(node).name
    capsys.readouterr()
    before = snapshot(str(node))
    assert main(cli_args(node, "restore", "--dry-run")) == 2
    out = capsys.readouterr().out
    assert "--- /etc/kubernetes/manifests/kube-scheduler.yaml\n+++ /etc/kubernetes/manifests/kube-scheduler.yaml\n" \
        in out
    assert f"-    - --config={CONFIG_DIR}/{name}\n" in out
    assert f"--- {CONFIG_DIR}/{name}\n+++ /dev/null\n" in out
    assert snapshot(str(node)) == before
    assert main(cli_args(node, "restore", "--dry-run", "-o", "json")) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["pending"] is True
    assert [(c["path"], c["action"]) for c in doc["changes"]] == [
        ("/etc/kubernetes/manifests/kube-scheduler.yaml", "update"), (f"{CONFIG_DIR}/{name}", "delete")]
    assert main(cli_args(node, "restore")) == 0
    assert (node / "node" / MANIFEST).read_text() == original
    capsys.readouterr()
    assert main(cli_args(node, "restore", "--dry-run")) == 0
    assert capsys.readouterr().out == "# /etc/kubernetes/manifests/kube-scheduler.yaml: unchanged, nothing to restore\n"
    assert main(cli_args(node, "restore")) == 0
    assert capsys.readouterr().out == "/etc/kubernetes/manifests/kube-scheduler.yaml: unchanged\n"


def test_restore_dry_run_says_which_files_the_guard_would_keep(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(cli_args(node, "apply")) == 0
    path = f"{CONFIG_DIR}/{config_file(node).name}"
    kubeadm = (FIXTURES / "manifests/kubeadm.yaml").read_text()
    (node / "node/etc/kubernetes/manifests/kube-scheduler-old.yaml").write_text(
        kubeadm.replace("    - kube-scheduler\n", f"    - kube-scheduler\n    - --config={path}\n", 1))
    capsys.readouterr()
    assert main(cli_args(node, "restore", "--dry-run")) == 2
    out = capsys.readouterr().out
    assert (f"# note: kept {path}: /etc/kubernetes/manifests/kube-scheduler-old.yaml names it in a --config\n"
            in out)
    assert "+++ /dev/null" not in out
    assert main(cli_args(node, "restore")) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"kept {path}: /etc/kubernetes/manifests/kube-scheduler-old.yaml names it in a --config")
    assert config_file(node).is_file()


def test_status_is_an_error_when_the_config_file_is_gone(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(cli_args(node, "apply")) == 0
    gone = config_file(node)
    gone.unlink()
    capsys.readouterr()
    assert main(cli_args(node, "status", "-o", "json")) == 1
    info = json.loads(capsys.readouterr().out)
    path = f"{CONFIG_DIR}/{gone.name}"
    assert info["patched"] is True
    assert info["error"].startswith(f"{path}: kube-scheduler's --config={path} names a missing file")
