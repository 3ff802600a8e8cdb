"""``stop-agents``, the uninstall's pre-delete hook: the agents' DaemonSet deleted in the foreground, done when the
API server removed it (only once every one of its pods is gone).

Against the API emulator, which does the foreground deletion as kube-apiserver and its garbage collector do (the
DaemonSet marked and kept, its pods deleted gracefully); the test plays each node's kubelet ending its pod.
"""

from __future__ import annotations

import argparse
import io
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from patcher.adapters.kube.transport import Api
from patcher.commands.cli import build_parser
from patcher.commands.stopagents import Result, describe, main, stop_agents
from tests.harness.emu.kubeemu import wait_until
from tests.harness.emu.kubeemu_ext import KubeEmulatorExt

NS, DS = "scheduler-patcher", "scheduler-patcher"
NODES = ("cp-1", "cp-2", "cp-3")
SELECTOR = {"app.kubernetes.io/name": "scheduler-patcher", "app.kubernetes.io/component": "agent"}


@pytest.fixture
def emu() -> Iterator[KubeEmulatorExt]:
    with KubeEmulatorExt() as e:
        ds = e.create({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": DS, "namespace": NS},
                       "spec": {"selector": {"matchLabels": SELECTOR}}})
        owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": DS, "uid": ds["metadata"]["uid"],
                 "controller": True, "blockOwnerDeletion": True}
        for node in NODES:
            e.create({"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"name": f"agent-{node}", "namespace": NS, "labels": SELECTOR,
                                   "ownerReferences": [owner]},
                      "spec": {"nodeName": node, "terminationGracePeriodSeconds": 90,
                               "containers": [{"name": "agent", "image": "scheduler-patcher"}]}})
        e.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "other", "namespace": NS},
                  "spec": {"containers": [{"name": "c", "image": "x"}]}})
        yield e


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def start(api: Api, results: list[Result], lines: list[str], clock: Clock | None = None,
          timeout: float = 60.0) -> threading.Thread:
    t = threading.Thread(target=lambda: results.append(stop_agents(
        api, namespace=NS, name=DS, timeout=timeout, say=lines.append, clock=clock or Clock())), daemon=True)
    t.start()
    return t


def marked(emu: KubeEmulatorExt, name: str) -> bool:
    pod = emu.get("pods", name, NS)
    return pod is not None and bool(pod["metadata"].get("deletionTimestamp"))


def test_it_waits_until_every_agent_pod_ended_and_the_daemonset_is_gone(emu: KubeEmulatorExt, api: Api) -> None:
    results: list[Result] = []
    lines: list[str] = []
    t = start(api, results, lines)
    assert wait_until(lambda: all(marked(emu, f"agent-{n}") for n in NODES), 10)
    ds = emu.get("daemonsets", DS, NS, group="apps")
    assert ds is not None and ds["metadata"]["finalizers"] == ["foregroundDeletion"]
    pod = emu.get("pods", f"agent-{NODES[0]}", NS)
    assert pod is not None and pod["metadata"]["deletionGracePeriodSeconds"] == 90
    deletes = emu.requests("DELETE", f"/apis/apps/v1/namespaces/{NS}/daemonsets/{DS}")
    assert [json.loads(r.body)["propagationPolicy"] for r in deletes] == ["Foreground"]
    for node in NODES:  # each kubelet ends its agent's pod, one after the other (each restored its node)
        t.join(0.2)
        assert not results, f"done while agent pods are left ({node} and after)"
        emu.delete("pods", f"agent-{node}", NS)
    t.join(10)
    assert results == [Result(gone=True)]
    assert emu.get("daemonsets", DS, NS, group="apps") is None
    assert emu.get("pods", "other", NS) is not None  # only what the DaemonSet owns
    assert lines[-1] == f"DaemonSet {NS}/{DS} and its pods are gone"
    watches = [r.query for r in emu.requests("GET", f"/apis/apps/v1/namespaces/{NS}/daemonsets")
               if r.query.get("watch")]
    assert watches and all(q.get("fieldSelector") == f"metadata.name={DS}" for q in watches)  # RBAC: that one name


def test_no_daemonset_is_nothing_to_wait_for(emu: KubeEmulatorExt, api: Api) -> None:
    emu.delete("daemonsets", DS, NS, group="apps")
    results: list[Result] = []
    lines: list[str] = []
    start(api, results, lines).join(10)
    assert results == [Result(gone=True)] and "does not exist" in lines[0]


def test_the_deadline_names_what_is_left(emu: KubeEmulatorExt, api: Api) -> None:
    clock = Clock()
    results: list[Result] = []
    lines: list[str] = []
    t = start(api, results, lines, clock, timeout=240.0)
    assert wait_until(lambda: all(marked(emu, f"agent-{n}") for n in NODES), 10)
    emu.delete("pods", "agent-cp-1", NS)
    clock.now = 241.0
    emu.mutate("daemonsets", DS, lambda d: None, NS, group="apps")  # any change wakes the wait up
    t.join(10)
    [result] = results
    assert not result.gone and result.left is not None and lines[0].startswith(f"deleting DaemonSet {NS}/{DS} ")
    line = describe(NS, DS, result, 240.0)
    assert line.startswith(f"DaemonSet {NS}/{DS} is still there after 240s: being deleted since ")
    assert "(finalizers: foregroundDeletion)" in line
    assert "kubectl -n scheduler-patcher get pods -l app.kubernetes.io/component=agent," in line


def args_for(emu: KubeEmulatorExt, tmp: Any, *extra: str) -> argparse.Namespace:
    return build_parser(load=["stop-agents"]).parse_args(
        ["stop-agents", "--kubeconfig", str(emu.write_kubeconfig(tmp / "kc")), "--namespace", NS, *extra])


def test_the_command_exits_0_when_the_pods_are_gone_and_1_with_one_line_when_not(emu: KubeEmulatorExt,
                                                                                  tmp_path: Any) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert main(args_for(emu, tmp_path, "--timeout", "0s"), out=out, err=err) == 1
    assert err.getvalue().count("\n") == 1 and "is still there after 0s: being deleted since" in err.getvalue()
    for node in NODES:
        emu.delete("pods", f"agent-{node}", NS)
    assert emu.get("daemonsets", DS, NS, group="apps") is None
    out, err = io.StringIO(), io.StringIO()
    assert main(args_for(emu, tmp_path), out=out, err=err) == 0
    assert "does not exist" in out.getvalue() and not err.getvalue()
