"""Each setting of the node commands is declared once (``patcher.core.settings``): one field, one default, one
flag. Before this module the agent's settings lived in ``AgentOptions``, ``engine.Options``,
``lifecycle.Options`` and ``services/config.py``, ``restart_timeout`` (and six more) twice, and
``check_extenders`` had a default of ``false`` in the dataclasses and ``true`` on the command line."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from patcher.commands.cli import SECTIONS, _files, build_parser, run_settings
from patcher.core import lifecycle, settings
from patcher.core.settings import Files, Lifecycle, Settings, groups
from tests.component.test_cli import RUN_FLAG_VALUES
from tests.harness.settings import build_settings, owner_of

ROOT = Path(__file__).resolve().parents[2] / "patcher"
#: Fields elsewhere that share a setting's name and carry a default of their own, and why that is not a second
#: declaration of the setting. A new one fails the test below: take the value from the settings instead, or say
#: here why it is something else.
ELSEWHERE = {
    ("core/manifestedit.py", "PatchSpec", "prefix"): "the manifest edit's own parameter (tests patch without it)",
    ("core/manifestedit.py", "PatchSpec", "container_name"): "idem",
    ("core/manifestedit.py", "PatchSpec", "on_foreign"): "idem; its default is the strict one, nodefiles passes ours",
    ("core/schedconfig/__init__.py", "ConfigRequest", "kube_version"): "what a render was asked for",
    ("core/schedconfig/__init__.py", "RenderedConfig", "kube_version"): "what a render was done for",
    ("core/schedconfig/version.py", "KubeVersion", "source"): "where a version came from, not a folder",
    ("adapters/fsio.py", "Write", "mode"): "a file mode, not the rollout mode",
    ("adapters/kube/client.py", "ClientSettings", "kubeconfig"): "the client adapter's, shared by every command",
    ("adapters/kube/client.py", "ClientSettings", "timeout"): "idem",
    ("adapters/kube/client.py", "ClientSettings", "context"): "idem",
}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``PATCHER_*`` nor downward-API variable: the flags' defaults are the built-in ones."""
    for name in [k for k in os.environ if k.startswith("PATCHER_")] + ["NODE_NAME", "KUBECONFIG", "POD_NAMESPACE",
                                                                          "POD_NAME"]:
        monkeypatch.delenv(name, raising=False)


def run_parser() -> argparse.ArgumentParser:
    commands = next(a for a in build_parser(load=[])._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = commands.choices["run"]
    return parser


def flat(s: Settings) -> dict[tuple[str, str], Any]:
    """Every setting as (group, field) -> value; a group that is None (``api`` with ``--no-api``) as one entry."""
    out: dict[tuple[str, str], Any] = {}
    for g in dataclasses.fields(s):
        value = getattr(s, g.name)
        if value is None:
            out[(g.name, "")] = None
            continue
        for f in dataclasses.fields(value):
            out[(g.name, f.name)] = getattr(value, f.name)
    return out


def flagged() -> dict[str, tuple[str, str]]:
    """Flag -> the (group, field) whose metadata names it (``("api", "")`` for ``--no-api``)."""
    out: dict[str, tuple[str, str]] = {}
    for g in dataclasses.fields(Settings):
        if (name := g.metadata.get(settings.FLAG)) is not None:
            out[name] = (g.name, "")
        for f in dataclasses.fields(groups()[g.name]):
            if (name := f.metadata.get(settings.FLAG)) is not None:
                assert name not in out, f"{name} names two settings: {out[name]} and {(g.name, f.name)}"
                out[name] = (g.name, f.name)
    return out


def test_a_setting_name_belongs_to_one_group() -> None:
    seen: dict[str, str] = {}
    for group, kind in groups().items():
        for f in dataclasses.fields(kind):
            assert f.name not in seen, f"{f.name} is declared by {seen[f.name]} and {group}"
            assert f.name not in groups(), f"{group}.{f.name} is also the name of a group"
            seen[f.name] = group
    assert owner_of("restart_timeout") == "lifecycle"
    with pytest.raises(TypeError, match="0 groups declare 'restart_timout'"):
        build_settings(restart_timout=1.0)


def test_every_run_flag_is_one_setting_and_every_flagged_setting_a_run_flag(clean_env: None) -> None:
    flags = {o for a in run_parser()._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
    assert set(flagged()) == flags


def test_run_help_lists_each_flag_under_the_group_it_sets(clean_env: None) -> None:
    """``run --help`` has one section per group of ``Settings``, so an operator reads the flags as the code
    groups them."""
    assert set(SECTIONS) == set(groups())
    titles = {title: group for group, title in SECTIONS.items()}
    placed: dict[str, str] = {}
    for section in run_parser()._action_groups:
        for action in section._group_actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help":
                    placed[option] = titles.get(section.title or "", f"not a settings section: {section.title}")
    assert placed == {flag: group for flag, (group, _) in flagged().items()}


def test_build_refuses_what_it_cannot_route() -> None:
    with pytest.raises(TypeError, match="run without an API"):
        build_settings(no_api=True, kubeconfig="/kc")
    with pytest.raises(TypeError, match="both the group 'files' and fields of it"):
        build_settings(files=Files(), state_dir="/x")
    built = build_settings(files=Files(state_dir="/s"), node_name="cp-1", rollback_on_failure=False, no_api=True)
    assert (built.files.state_dir, built.pod.node_name, built.lifecycle.rollback_on_failure, built.api) == (
        "/s", "cp-1", False, None)


@pytest.mark.parametrize("flag", sorted(RUN_FLAG_VALUES))
def test_a_flag_changes_exactly_the_setting_that_names_it(clean_env: None, flag: str) -> None:
    base = flat(run_settings(run_parser().parse_args(["--node-name", "cp-1"])))
    changed = flat(run_settings(run_parser().parse_args(["--node-name", "cp-1", flag, RUN_FLAG_VALUES[flag]])))
    group, name = flagged()[flag]
    if name == "":  # --no-api: the API group is gone, and nothing else changes
        assert changed.pop((group, "")) is None
        assert {k: v for k, v in base.items() if k[0] != group} == changed
        return
    if flag == "--node-name":
        base[(group, name)] = "cp-1"  # the value every other case passes
    diff = {k for k in base.keys() | changed.keys() if base.get(k) != changed.get(k)}
    assert diff == {(group, name)}, f"{flag} {RUN_FLAG_VALUES[flag]} changed {sorted(diff)}"


def test_the_flags_defaults_are_the_settings_defaults(clean_env: None) -> None:
    from_flags = run_settings(run_parser().parse_args(["--node-name", "cp-1"]))
    assert from_flags == build_settings(node_name="cp-1", kubelet_healthz="http://127.0.0.1:10248/healthz")
    assert build_settings().loop.kubelet_healthz == ""  # a test's agent does not ask this machine's port 10248
    assert from_flags.lifecycle.check_extenders  # once `false` in the dataclasses and `true` on the command line
    for name in ("plan", "apply", "restore", "status"):  # the shared flags mean the same Files everywhere
        args = build_parser(load=[]).parse_args([name])
        assert _files(args) == Files()


def test_the_lifecycle_reads_the_settings_group() -> None:
    """``lifecycle.step`` takes the ``Lifecycle`` group itself: no copy of it to fall out of step."""
    assert not hasattr(lifecycle, "Options")
    node, _ = lifecycle.step(lifecycle.Node(), lifecycle.Resumed(now=0.0), Lifecycle())
    assert node.record.phase == ""


def test_no_other_class_declares_a_setting_again() -> None:
    names = {f.name for kind in groups().values() for f in dataclasses.fields(kind)}
    found: dict[tuple[str, str, str], int] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "core/settings.py":
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            for stmt in node.body:
                if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                        and stmt.target.id in names and stmt.value is not None):
                    found[(rel, node.name, stmt.target.id)] = stmt.lineno
    unexplained = sorted(f"{rel}:{line} {cls}.{name}" for (rel, cls, name), line in found.items()
                         if (rel, cls, name) not in ELSEWHERE)
    assert not unexplained, "declared again, with a default of its own: " + ", ".join(unexplained)
    assert not set(ELSEWHERE) - set(found), "ELSEWHERE names a field that is gone: drop it"
