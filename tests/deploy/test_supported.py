"""One statement of the supported Kubernetes minors: the code's constant, the README, the chart's kubeVersion and
the ``--kube-version`` check agree, and each end has the evidence the README gives for it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from patcher.core.schedconfig import schema
from patcher.core.schedconfig.version import SUPPORTED_MINORS, SUPPORTED_TEXT, supported_version

ROOT = Path(__file__).resolve().parents[2]
(FIRST_MAJOR, FIRST), (LAST_MAJOR, LAST) = SUPPORTED_MINORS


def test_the_readme_states_the_constant_and_the_charts_kube_version() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    section = readme.split("## Supported Kubernetes versions\n", 1)[1].split("\n## ", 1)[0]
    assert f"kube-scheduler **{FIRST_MAJOR}.{FIRST} to {LAST_MAJOR}.{LAST}**" in section
    assert f"**{LAST_MAJOR}.{LAST}, the newest**" in section and f"**{FIRST_MAJOR}.{FIRST}, the oldest**" in section
    chart = yaml.safe_load((ROOT / "charts/scheduler-patcher/Chart.yaml").read_text("utf-8"))
    expected = f">={FIRST_MAJOR}.{FIRST}.0-0 <{LAST_MAJOR}.{LAST + 1}.0-0"
    assert chart["kubeVersion"] == expected
    assert f"`kubeVersion` is `{expected}`" in section
    assert f"supported: {FIRST_MAJOR}.{FIRST} to {LAST_MAJOR}.{LAST}" == SUPPORTED_TEXT


def test_each_end_has_its_evidence() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    # the newest end: the newest release whose real binaries tools/realk8s pins (and the README names it)
    pins = sorted((tuple(int(n) for n in p.name[1:].split(".")) for p in (ROOT / "tools/realk8s").glob("v1.*")),
                  reverse=True)
    assert pins[0][:2] == (LAST_MAJOR, LAST)
    assert f"`tools/realk8s/v{'.'.join(map(str, pins[0]))}`" in readme
    # the oldest end: the oldest minor with generated config types (the README names its file)
    generated = sorted(schema.generated())
    assert generated[0] == (FIRST_MAJOR, FIRST)
    assert f"schemas/kube-scheduler-{FIRST_MAJOR}.{FIRST}.json" in readme


@pytest.mark.parametrize("text", [f"{FIRST_MAJOR}.{FIRST}", f"v{LAST_MAJOR}.{LAST}.9", "1.31.2-rke2r1"])
def test_the_kube_version_check_accepts_the_range(text: str) -> None:
    assert supported_version(text) == text


@pytest.mark.parametrize(("text", "message"), [
    (f"{FIRST_MAJOR}.{FIRST - 1}", "outside the supported range"),
    (f"v{LAST_MAJOR}.{LAST + 1}.0", "outside the supported range"),
    ("2.0", "not a Kubernetes version"),
    ("banana", "not a Kubernetes version"),
])
def test_the_kube_version_check_refuses_the_rest(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        supported_version(text)
