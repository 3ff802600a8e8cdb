"""The CLI contract: exit codes, output lines, environment variables, error lines."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from patcher.commands.cli import main
from tests.harness.helpers import MANIFEST, cli_args, cli_node

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def node(tmp_path: Path) -> Path:
    return cli_node(tmp_path)


def test_plan_apply_plan_restore(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    original = (node / "node" / MANIFEST).read_bytes()
    assert main(cli_args(node, "plan")) == 2
    out = capsys.readouterr().out
    assert "+++ /etc/kubernetes/manifests/kube-scheduler.yaml" in out and "--- /dev/null" in out
    assert (node / "node" / MANIFEST).read_bytes() == original  # plan writes nothing

    assert main(cli_args(node, "apply")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "wrote /etc/kubernetes/manifests/kube-scheduler.yaml"
    assert lines[0].startswith("wrote /etc/kubernetes/scheduler-patcher/config-")

    assert main(cli_args(node, "plan")) == 0
    assert "up to date" in capsys.readouterr().out
    assert main(cli_args(node, "apply")) == 0
    assert capsys.readouterr().out == "/etc/kubernetes/manifests/kube-scheduler.yaml: unchanged\n"

    assert main(cli_args(node, "status", "--output", "json")) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["patched"] is True and status["foreign_config"] is None
    assert {"config_hash", "manifest_mtime", "up_to_date"} <= set(status)

    assert main(cli_args(node, "restore")) == 0
    assert capsys.readouterr().out.splitlines()[0] == "wrote /etc/kubernetes/manifests/kube-scheduler.yaml"
    assert (node / "node" / MANIFEST).read_bytes() == original
    assert main(cli_args(node, "restore")) == 0
    assert capsys.readouterr().out == "/etc/kubernetes/manifests/kube-scheduler.yaml: unchanged\n"


def test_errors_are_one_line_naming_the_file(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (node / "node" / MANIFEST).write_text("kind: Deployment\n")
    assert main(cli_args(node, "apply")) == 1
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
    proc = subprocess.run([sys.executable, "-m", "patcher", *cli_args(node, "plan")], capture_output=True,
                          text=True, env=env, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "--config=/etc/kubernetes/scheduler-patcher/config-" in proc.stdout


# -- conventions: paths, exit codes, argparse, pipes, output formats -------------------------------


def run_cli(*argv: str, cwd: Path | None = None, stdout: Any = subprocess.PIPE,
            extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PATCHER_")} | (extra_env or {})
    env["PYTHONPATH"] = str(ROOT)
    env["COLUMNS"] = "200"  # argparse wraps help at the terminal width: keep each flag on one line
    return subprocess.run([sys.executable, "-m", "patcher", *argv], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, env=env, cwd=cwd, check=False)


def test_relative_paths_resolve_against_the_working_directory(node: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(node)
    shutil.copytree(node / "node/etc/kubernetes/manifests", node / "man")
    # no --host-root: the node paths are local paths, so a relative one is relative to the cwd
    assert main(["plan", "--manifest-dir", "man", "--source", "src"]) == 2
    assert f"+++ {node}/man/kube-scheduler.yaml" in capsys.readouterr().out
    assert main(["plan", "--manifest-dir", "./man/", "--source", "./src"]) == 2
    capsys.readouterr()
    # a relative --host-root, with the node paths below it
    assert main(["plan", "--host-root", "node", "--source", "src"]) == 2
    assert "+++ /etc/kubernetes/manifests/kube-scheduler.yaml" in capsys.readouterr().out


def test_an_error_about_a_relative_path_names_what_was_typed(node: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(node)
    assert main(["plan", "--host-root", "node", "--source", "srcx"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert f"(--source srcx resolved to {node}/srcx)" in line, line


def test_a_relative_node_path_under_a_host_root_is_a_usage_error(node: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(node)
    assert main(["plan", "--host-root", "node", "--manifest-dir", "man", "--source", "src"]) == 64
    assert "--manifest-dir man: a node path must be absolute when --host-root is given" in capsys.readouterr().err


def test_a_missing_host_root_is_refused_and_nothing_is_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--no-api", "--host-root", "nodee"]) == 64
    err = capsys.readouterr().err
    assert f"--host-root nodee (resolved to {tmp_path}/nodee): no such folder" in err
    assert list(tmp_path.iterdir()) == []


def test_a_missing_manifest_folder_names_where_it_looked_and_what_to_try(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nodee").mkdir()
    assert main(["plan", "--host-root", "nodee", "--source", str(ROOT / "examples/scheduler-config")]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("scheduler-patcher: error: /etc/kubernetes/manifests: manifest folder not found")
    assert f"looked for at {tmp_path}/nodee/etc/kubernetes/manifests" in line
    assert f"is --host-root {tmp_path}/nodee a copy of the node's /?" in line
    assert "set --manifest-dir (RKE2: /var/lib/rancher/rke2/agent/pod-manifests)" in line


@pytest.mark.parametrize("argv", [
    ["plan", "--host-rot", "node"],  # a typo of a flag
    ["plan", "--sour", "src"],  # a prefix of --source: no abbreviations
    ["status", "-o", "xml"],
    ["run", "--resync-interval", "10x"],
    ["run", "--no-api", "maybe"],
])
def test_usage_errors_exit_64_never_2(argv: list[str]) -> None:
    proc = run_cli(*argv)
    assert proc.returncode == 64, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.startswith("usage: scheduler-patcher ")
    assert "Traceback" not in proc.stderr and "_seconds" not in proc.stderr and "_bool" not in proc.stderr


def test_duration_and_boolean_errors_say_what_was_expected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--resync-interval", "10x"])
    assert exc.value.code == 64
    assert "argument --resync-interval: not a duration: '10x' (examples: 30, 30s, 500ms, 5m, 1h)" in \
        capsys.readouterr().err


def test_no_arguments_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: scheduler-patcher") and "exit codes:" in out


def help_of(*command: str) -> str:
    proc = run_cli(*command, "--help")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


#: The exit codes each command's --help lists: only those it can give.
HELP_CODES = {"plan": {0, 1, 2, 64, 141}, "apply": {0, 1, 64, 141}, "restore": {0, 1, 2, 64, 141},
              "status": {0, 1, 64, 141}, "run": {0, 1, 64}, "readiness": {0, 1, 64, 141}, "gatekeeper": {0, 1, 64},
              "completion": {0, 64, 141}}


@pytest.mark.parametrize("command", ["plan", "apply", "restore", "status", "run", "readiness", "gatekeeper"])
def test_help_has_the_exit_code_table_and_no_argparse_leaks(command: str) -> None:
    text = help_of(command)
    table = text.split("exit codes:\n", 1)[1]
    assert {int(line.split()[0]) for line in table.splitlines() if line.strip()} == HELP_CODES[command]
    assert "64  usage error" in table
    assert not re.search(r"--[a-z-]+ \[[A-Z_]+\]", text), "an optional value shown as its dest, e.g. [NO_API]"
    assert not re.search(r"\(default: [^)]*\)\s*\(default:", text), "a default shown twice"
    assert "(default: )" not in text


def test_status_exits_1_on_an_error_row(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (node / "src/extenders.yaml").write_text("extenders: [{urlPrefix: 42}]\n")
    assert main(cli_args(node, "status", "-o", "json")) == 1
    info = json.loads(capsys.readouterr().out)
    assert info["error"] and info["up_to_date"] is None


def test_a_closed_pipe_ends_quietly(node: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write: `plan | head -0`, deterministically
    try:
        proc = run_cli(*cli_args(node, "plan"), stdout=write_end)
    finally:
        os.close(write_end)
    assert proc.returncode == 141
    assert proc.stderr == ""


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_every_command_that_prints_objects_speaks_json_and_yaml(node: Path, fmt: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from ruamel.yaml import YAML

    def parsed(*argv: str) -> Any:
        out = capsys.readouterr().out
        return json.loads(out) if fmt == "json" else YAML(typ="safe", pure=True).load(out)

    assert main(cli_args(node, "plan", "-o", fmt)) == 2
    plan = parsed()
    assert plan["pending"] is True and plan["manifest"] == "/etc/kubernetes/manifests/kube-scheduler.yaml"
    assert {c["kind"] for c in plan["changes"]} == {"config", "manifest"}
    assert plan["config"]["hash"] and plan["source_hash"]
    assert main(cli_args(node, "apply", "--output", fmt)) == 0
    applied = parsed()
    assert applied["changed"] is True and applied["actions"][-1] == {"action": "wrote", "path": plan["manifest"]}
    assert main(cli_args(node, "apply", "-o", fmt)) == 0
    assert parsed()["changed"] is False
    assert main(cli_args(node, "status", "-o", fmt)) == 0
    assert parsed()["config_hash"] == plan["config"]["hash"]
    assert main(cli_args(node, "restore", "-o", fmt)) == 0
    assert parsed()["actions"][0] == {"action": "wrote", "path": plan["manifest"]}


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_shell_completion_knows_every_command_and_flag(shell: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", shell]) == 0
    script = capsys.readouterr().out
    for word in ("plan", "apply", "restore", "status", "run", "readiness", "gatekeeper",
                 "--manifest-dir", "--host-root", "--no-api", "--gate-name", "--expected-hash"):
        assert word in script, word
    if shell == "bash" and shutil.which("bash"):
        check = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True, check=False)
        assert check.returncode == 0, check.stderr


# --- run: flags to Settings ----------------------------------------------------------------------------

#: A value other than the default for every flag of `run`: each must change the Settings it builds.
RUN_FLAG_VALUES = {
    "--manifest-dir": "/m", "--manifest-name": "s.yaml", "--source": "/s", "--host-config-dir": "/h",
    "--state-dir": "/st", "--host-root": "/r", "--annotation-prefix": "p.example", "--container-name": "sched",
    "--on-foreign-config": "fail", "--kube-version": "v1.30.0",
    "--node-name": "cp-9", "--kubeconfig": "/kc", "--context": "admin@other", "--no-api": "true",
    "--resync-interval": "7s",
    "--restart-timeout": "12s", "--restart-settle": "3s", "--rollback-on-failure": "false",
    "--restore-on-exit": "never",
    "--local-check": "true", "--listen": ":1", "--grace-period": "3s", "--rollout": "independent",
    "--rollout-lease": "other", "--rollout-lease-duration": "9s", "--namespace": "ns",
    "--publish-status": "false", "--compat-csi-baremetal": "true", "--compat-namespace": "compat",
    "--log-format": "json", "--log-level": "debug", "--check-extenders": "false",
    "--extender-probe-interval": "5m", "--pod-name": "scheduler-patcher-x1", "--termination-grace-period": "60",
    "--hold-wait": "5s", "--leader-wait": "7s", "--kubelet-healthz": "http://127.0.0.1:1/healthz",
}


def run_config(*argv: str) -> Any:
    from patcher.commands.cli import build_parser, run_settings

    return run_settings(build_parser(load=[]).parse_args(["run", "--node-name", "cp-1", *argv]))


def test_every_run_flag_reaches_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from patcher.commands.cli import build_parser

    for name in [k for k in os.environ if k.startswith("PATCHER_")] + ["NODE_NAME", "KUBECONFIG", "POD_NAMESPACE",
                                                                          "POD_NAME"]:
        monkeypatch.delenv(name, raising=False)
    commands = next(a for a in build_parser(load=[])._actions if isinstance(a, argparse._SubParsersAction))
    run: argparse.ArgumentParser = commands.choices["run"]
    flags = {o for a in run._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
    assert flags == set(RUN_FLAG_VALUES)  # a new flag needs a value here, and a place in Settings
    base = run_config()
    assert base.api is not None and base.pod.node_name == "cp-1" and base.coordinated and base.publishes_status
    for flag, value in RUN_FLAG_VALUES.items():
        assert run_config(flag, value) != base, f"{flag} {value} does not reach the agent's config"


def test_run_settings_groups_the_flags() -> None:
    config = run_config("--rollout-lease-duration", "90s", "--compat-csi-baremetal", "true", "--kubeconfig", "/kc",
                        "--restart-timeout", "2m", "--no-api", "false")
    assert config.rollout.lease_duration == 90 and isinstance(config.rollout.lease_duration, int)
    assert config.status.compat_csi_baremetal and config.api.kubeconfig == "/kc"
    assert config.lifecycle.restart_timeout == 120.0
    no_api = run_config("--no-api")
    assert no_api.api is None and not no_api.coordinated and not no_api.publishes_status


def test_the_health_port_never_takes_the_schedulers(capsys: pytest.CaptureFixture[str]) -> None:
    # hostNetwork: the agent's port is a host port, next to kube-scheduler's
    assert main(["run", "--node-name", "cp-1", "--listen", ":10259"]) == 64
    assert capsys.readouterr().err == ("scheduler-patcher run: error: --listen :10259: port 10259 is kube-scheduler's "
                                       "(its secure port); the agent shares the host's network with it\n")
    assert run_config("--listen", "127.0.0.1:9818").serve.listen == "127.0.0.1:9818"
    assert run_config().lifecycle.check_extenders
    assert not run_config("--check-extenders=false").lifecycle.check_extenders


def test_a_lease_shorter_than_a_second_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--node-name", "cp-1", "--rollout-lease-duration", "500ms"]) == 64
    assert capsys.readouterr().err == \
        "scheduler-patcher run: error: --rollout-lease-duration 0.5s: must be at least 1s\n"


def test_a_settle_time_as_long_as_the_restart_timeout_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing could ever be Ready: every write would roll back at its timeout."""
    assert main(["run", "--node-name", "cp-1", "--restart-timeout", "20s", "--restart-settle", "20s"]) == 64
    assert capsys.readouterr().err == ("scheduler-patcher run: error: --restart-settle 20s: must be shorter than "
                                       "--restart-timeout (20s), or no restart could ever count as Ready\n")
    assert run_config().lifecycle.restart_settle == 10.0
    assert run_config("--restart-timeout", "20s", "--restart-settle", "0s").lifecycle.restart_settle == 0.0


def test_a_stop_grace_as_long_as_the_pods_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """The kubelet would kill the agent inside its restore: the setting the pod's grace lands in is checked."""
    assert main(["run", "--node-name", "cp-1", "--grace-period", "30s", "--termination-grace-period", "30"]) == 64
    assert capsys.readouterr().err == (
        "scheduler-patcher run: error: --grace-period 30s: must be shorter than --termination-grace-period (30s, "
        "the pod's terminationGracePeriodSeconds), or the kubelet kills the agent inside its restore\n")
    config = run_config("--grace-period", "20s", "--termination-grace-period", "30")
    assert (config.lifecycle.grace_period, config.pod.termination_grace) == (20.0, 30.0)
    assert run_config("--grace-period", "90s").pod.termination_grace is None  # unknown: nothing to check against


# --- usage errors: exit 64, the subcommand's usage, a "did you mean" ------------------------------------------


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["plan", "--kube-version", "banana"], {},
     "scheduler-patcher plan: error: argument --kube-version: not a Kubernetes version: 'banana' "
     "(expected e.g. 1.34 or v1.34.2)"),
    (["apply", "--kube-version=1.18"], {},
     "scheduler-patcher apply: error: argument --kube-version: kube-scheduler 1.18 is too old: outside the supported "
     "range (supported: 1.19 to 1.37)"),
    (["plan", "--kube-version", "v1.38.0"], {}, "kube-scheduler 1.38.0 is too new: outside the supported range"),
    (["plan"], {"PATCHER_KUBE_VERSION": "banana"}, "not a Kubernetes version: 'banana'"),
    (["plan"], {"PATCHER_OUTPUT": "xml"},
     "scheduler-patcher plan: error: argument -o/--output: 'xml' is not one of text, json, yaml (from PATCHER_OUTPUT)"),
    (["status", "-o", "xml"], {}, "scheduler-patcher status: error: argument -o/--output: 'xml' is not one of text, "
                                  "json, yaml"),
    (["plan", "--sourse", "src"], {},
     "scheduler-patcher plan: error: unrecognized arguments: --sourse src; did you mean --source?"),
    (["readiness", "--kubeconfg=kc"], {},
     "scheduler-patcher readiness: error: unrecognized arguments: --kubeconfg=kc; did you mean --kubeconfig?"),
    (["restore", "--annotation-prefx", "x", "--stat-dir", "/s"], {},
     "unrecognized arguments: --annotation-prefx x --stat-dir /s; --annotation-prefx: did you mean "
     "--annotation-prefix?; --stat-dir: did you mean --state-dir?"),
    (["--verison"], {}, "scheduler-patcher: error: unrecognized arguments: --verison; did you mean --version?"),
])
def test_usage_errors_exit_64_with_the_commands_usage(node: Path, argv: list[str], env: dict[str, str],
                                                      message: str) -> None:
    node_flags = cli_args(node)[:2] if argv[0] in ("plan", "apply", "restore") else []
    proc = run_cli(*argv, *node_flags, extra_env=env)
    assert proc.returncode == 64, proc.stderr
    assert message in proc.stderr and proc.stdout == ""
    command = argv[0] if not argv[0].startswith("-") else ""
    if command:
        assert proc.stderr.startswith(f"usage: scheduler-patcher {command} ")  # its own usage, not the top level's


def test_a_bad_variable_is_the_concern_of_the_command_that_reads_it(node: Path) -> None:
    proc = run_cli("run", "--no-api", "--host-root", str(node / "node"), "--source", str(node / "src"), "--help",
                   extra_env={"PATCHER_OUTPUT": "xml"})  # run has no --output
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("plan", *cli_args(node)[:2], "--source", str(node / "src"), extra_env={"PATCHER_LOG_FORMAT": "yaml"})
    assert proc.returncode == 2, proc.stderr  # plan has no --log-format: changes pending, as without it


def test_restore_help_lists_only_what_restore_reads(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = help_of("restore")
    for flag in ("--source", "--on-foreign-config", "--kube-version", "--check-extenders"):
        assert flag not in text
    assert "--annotation-prefix" in text and "--state-dir" in text
    # still accepted (one flag set serves apply and restore in a script), and ignored
    assert main(cli_args(node, "apply")) == 0
    assert main(cli_args(node, "restore", "--on-foreign-config", "fail")) == 0
    assert "wrote /etc/kubernetes/manifests/kube-scheduler.yaml" in capsys.readouterr().out.splitlines()


def test_yaml_output_prints_diffs_as_block_text(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ruamel.yaml import YAML

    assert main(cli_args(node, "plan", "-o", "json")) == 2
    as_json = json.loads(capsys.readouterr().out)
    assert main(cli_args(node, "plan", "-o", "yaml")) == 2
    text = capsys.readouterr().out
    assert YAML(typ="safe", pure=True).load(text) == as_json  # the same document
    assert text.count("  diff: |") == len(as_json["changes"]) == 2  # literal blocks, not escaped strings
    assert "\\n" not in text and "+    - --config=/etc/kubernetes/scheduler-patcher/config-" in text
