"""The one ``--config`` rule (pflag's), and the three readers that use it agreeing on every flag list."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from patcher.adapters import proc
from patcher.core import manifestedit
from patcher.core import yamltext as yt
from patcher.core.schedconfig.flags import ConfigFlag, config_flag, config_flags, parse_flags


@pytest.mark.parametrize(("items", "expected"), [
    (["--config=/a"], ConfigFlag("/a", 0)),
    (["--v=2", "--config", "/b"], ConfigFlag("/b", 1)),
    (["--config=/a", "--config", "/b", "--v=2"], ConfigFlag("/b", 1)),  # the last one wins
    (["--config", "/a", "--config=/b"], ConfigFlag("/b", 2)),
    (["--config", "--v=2"], ConfigFlag("--v=2", 0)),  # pflag takes the next item, dash or not
    (["--config", "--config=/a"], ConfigFlag("--config=/a", 0)),  # ... even this one
    (["--config="], ConfigFlag("", 0)),  # an empty value is a value (kube-scheduler refuses it)
    (["--config"], None),  # no value: pflag refuses the command line
    (["--", "--config=/a"], None),  # after -- nothing is a flag
    (["--config", "--", "--config=/b"], ConfigFlag("/b", 2)),  # a -- taken as a value ends nothing
    (["-config=/a"], None),  # pflag reads -config as the shorthands -c -o -n ...
    (["---config=/a"], None),
    (["--configuration=/a", "--kubeconfig=/k", "--config-x", "/a"], None),
    (["--config", 7, "--config=/a"], ConfigFlag("/a", 2)),  # a YAML number is no value or flag
    (["--config", 7], None),
])
def test_the_config_flag_rule(items: list[object], expected: ConfigFlag | None) -> None:
    assert config_flag(items) == expected


def test_every_occurrence_in_order() -> None:
    assert [f.value for f in config_flags(["--config=/a", "--v", "2", "--config", "/b", "--", "--config=/c"])] \
        == ["/a", "/b"]


ITEMS = st.sampled_from([
    "--config", "--config=/a.yaml", "--config=/b.yaml", "--config=", "/a.yaml", "/b.yaml", "/etc/kube-scheduler",
    "--", "-config=/c.yaml", "---config=/c.yaml", "--v=2", "--v", "--kubeconfig=/k.conf", "--configs=/d.yaml",
    "--config=/with space.yaml", "--config=a=b",
])


def manifest_config(args: list[str]) -> str | None:
    """What the manifest patcher reads as the scheduler's --config (no marker: every --config is foreign)."""
    text = ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: kube-scheduler\n  namespace: kube-system\nspec:\n"
            "  containers:\n  - name: kube-scheduler\n    image: registry.k8s.io/kube-scheduler:v1.31.2\n"
            f"    command: {json.dumps(['kube-scheduler', *args])}\n")
    return manifestedit.inspect(yt.parse(text), "m.yaml", prefix="scheduler-patcher.io").foreign_config


@given(st.lists(ITEMS, max_size=8))
def test_the_manifest_the_process_check_and_the_carried_flags_agree(args: list[str]) -> None:
    found = config_flag(args)
    expected = found.value if found else None
    assert proc.config_flag(args) == expected
    assert parse_flags(["kube-scheduler", *args]).get("config") == expected
    assert manifest_config(args) == expected
