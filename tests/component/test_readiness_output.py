"""``scheduler-patcher readiness -o yaml``: the same document as ``-o json``, through the real CLI parser."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from patcher.commands import readiness
from patcher.commands.cli import build_parser
from tests.component.test_readiness import ready_cluster
from tests.harness.emu.kubeemu_ext import KubeEmulatorExt


@pytest.fixture
def emu() -> Iterator[KubeEmulatorExt]:
    with KubeEmulatorExt() as e:
        yield e


def run(kubeconfig: Path, *argv: str) -> tuple[int, str]:
    args = build_parser(load=["readiness"]).parse_args(["readiness", "--kubeconfig", str(kubeconfig), *argv])
    out, err = io.StringIO(), io.StringIO()
    code = readiness.main(args, out=out, err=err)
    return code, out.getvalue()


def test_yaml_and_json_carry_the_same_verdict(emu: KubeEmulatorExt, kubeconfig: Path) -> None:
    ready_cluster(emu)
    code_json, as_json = run(kubeconfig, "-o", "json")
    code_yaml, as_yaml = run(kubeconfig, "--output", "yaml")
    assert code_json == code_yaml == 0
    assert YAML(typ="safe", pure=True).load(as_yaml) == json.loads(as_json)
    assert not as_yaml.lstrip().startswith("{")  # block style, for people
