"""``patcher.core.placement.selects``: the part of the DaemonSet controller's decision a stop needs."""

from __future__ import annotations

from typing import Any

import pytest

from patcher.core.placement import selects

NODE: dict[str, Any] = {"metadata": {"name": "cp-1", "labels": {"node-role.kubernetes.io/control-plane": "",
                                                                "zone": "a", "gen": "5"}},
                        "spec": {"taints": [{"key": "node-role.kubernetes.io/control-plane",
                                             "effect": "NoSchedule"}]}}
TOLERATE_CP = [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]


def ds(**spec: Any) -> dict[str, Any]:
    return {"spec": {"template": {"spec": {"tolerations": TOLERATE_CP, **spec}}}}


def terms(*items: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(items)}}}


@pytest.mark.parametrize("spec, fits", [
    ({}, True),
    ({"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}, True),
    ({"nodeSelector": {"zone": "b"}}, False),
    ({"affinity": terms({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]})}, True),
    ({"affinity": terms({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]})}, False),
    ({"affinity": terms({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
                        {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["4"]}]})}, True),  # ORed
    ({"affinity": terms({"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["4"]}]})}, False),
    ({"affinity": terms({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}],
                         "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["cp-1"]}]})}, True),
    ({"affinity": terms({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["cp-2"]}]})}, False),
    ({"affinity": terms({})}, False),  # an empty term matches nothing
    ({"tolerations": []}, False),  # the control-plane taint is not tolerated
    ({"tolerations": [{"operator": "Exists"}]}, True),  # tolerates everything
])
def test_what_is_evaluated(spec: dict[str, Any], fits: bool) -> None:
    assert selects(ds(**spec), NODE)[0] == fits


def test_the_daemon_controllers_own_tolerations_count() -> None:
    """A NotReady or cordoned node keeps its daemon pod: the controller adds these tolerations itself."""
    node = {**NODE, "spec": {"unschedulable": True, "taints": [
        {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
        {"key": "other", "effect": "PreferNoSchedule"}]}}
    assert selects(ds(tolerations=[]), node) == (True, "")
    unavailable = {**NODE, "spec": {"taints": [{"key": "node.kubernetes.io/network-unavailable",
                                                "effect": "NoSchedule"}]}}
    assert not selects(ds(tolerations=[]), unavailable)[0]
    assert selects(ds(tolerations=[], hostNetwork=True), unavailable)[0]


def test_the_reason_names_what_excludes_the_node() -> None:
    assert selects(ds(nodeSelector={"zone": "b"}), NODE) == (
        False, "nodeSelector zone=b does not match the node's labels")
    assert selects(ds(tolerations=[{"key": "x", "operator": "Equal", "value": "1"}]), NODE) == (
        False, "the node's taint node-role.kubernetes.io/control-plane:NoSchedule is not tolerated")
