"""``restore-nodes``, the uninstall's restore: one pod bound to each control-plane node, done when all succeeded.

The pure parts (the pod built for a node, the verdict over pods) with plain pytest; the command against the API
emulator, with the test playing the kubelet (it sets each pod's phase as a kubelet would).
"""

from __future__ import annotations

import argparse
import io
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from patcher.adapters.kube.transport import Api
from patcher.commands.cli import build_parser
from patcher.commands.restorenodes import Result, main, restore_nodes
from patcher.core import restorepods
from patcher.core.restorepods import NODE_ANNOTATION, RUN_LABEL, Outcome
from tests.harness.emu.kubeemu import wait_until
from tests.harness.emu.kubeemu_ext import KubeEmulatorExt

NS = "scheduler-patcher"
CP, MASTER = "node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"
SELECTORS = [CP, MASTER]
PREFIX = "scheduler-patcher.io"


def template() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "scheduler-patcher-restore",
                                                                    "namespace": NS},
            "template": {"metadata": {"labels": {"app.kubernetes.io/component": "restore"}},
                         "spec": {"restartPolicy": "OnFailure", "tolerations": [{"operator": "Exists"}],
                                  "affinity": {"nodeAffinity": {}},
                                  "containers": [{"name": "restore", "image": "scheduler-patcher",
                                                  "args": ["restore"]}]}}}


def test_the_pod_is_bound_to_its_node_and_labelled_with_the_run() -> None:
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u", "blockOwnerDeletion": False}
    pod = restorepods.restore_pod(template(), "cp-1", "r1", NS, owner)
    assert pod["spec"]["nodeName"] == "cp-1" and "affinity" not in pod["spec"]
    assert pod["metadata"]["labels"] == {"app.kubernetes.io/component": "restore", RUN_LABEL: "r1"}
    assert pod["metadata"]["annotations"] == {NODE_ANNOTATION: "cp-1"}
    assert pod["metadata"]["ownerReferences"] == [owner] and pod["metadata"]["namespace"] == NS
    assert template()["template"]["spec"].get("nodeName") is None  # the template is not touched
    with pytest.raises(ValueError, match=r"no template\.spec"):
        restorepods.restore_pod({"template": {}}, "cp-1", "r1", NS)


def test_the_job_owner_is_taken_from_the_pod_and_never_as_controller() -> None:
    pod = {"metadata": {"ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u",
                                             "controller": True}]}}
    assert restorepods.job_owner(pod) == {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u",
                                          "blockOwnerDeletion": False}
    assert restorepods.job_owner({"metadata": {}}) is None


@pytest.mark.parametrize(("status", "outcome", "detail"), [
    ({"phase": "Succeeded"}, Outcome.RESTORED, "pod p"),
    ({"phase": "Failed", "reason": "NodeAffinity"}, Outcome.FAILED, "NodeAffinity"),
    ({"phase": "Running"}, Outcome.RUNNING, "pod p"),
    ({"phase": "Pending", "containerStatuses": [{"name": "restore", "state": {"waiting": {
        "reason": "ImagePullBackOff", "message": "not found"}}}]}, Outcome.WAITING,
     "restore: ImagePullBackOff: not found"),
    ({"phase": "Running", "containerStatuses": [{"name": "restore", "restartCount": 2, "lastState": {
        "terminated": {"exitCode": 1}}}]}, Outcome.RUNNING, "restore exited 1, restarts 2"),
])
def test_a_node_outcome_says_what_its_pod_shows(status: dict[str, Any], outcome: Outcome, detail: str) -> None:
    o = restorepods.node_outcome("cp-1", {"metadata": {"name": "p"}, "status": status})
    assert o.outcome is outcome and detail in o.detail
    assert restorepods.node_outcome("cp-1", None).outcome is Outcome.WAITING


def test_done_means_every_node_restored_or_failed_for_good() -> None:
    ok = restorepods.NodeRestore("a", Outcome.RESTORED)
    assert restorepods.finished([ok, restorepods.NodeRestore("b", Outcome.FAILED)])
    assert not restorepods.finished([ok, restorepods.NodeRestore("b", Outcome.RUNNING)])
    assert Result([ok]).ok and not Result([ok, restorepods.NodeRestore("b", Outcome.FAILED)]).ok
    lines = restorepods.describe([ok, restorepods.NodeRestore("b", Outcome.WAITING, "no pod yet")], ["b"])
    assert lines == ["node b: waiting (no pod yet); the node is not Ready: its kubelet runs the pod when it is back"]


# -- against the emulator ---------------------------------------------------------------------------------


@pytest.fixture
def emu() -> Iterator[KubeEmulatorExt]:
    with KubeEmulatorExt() as e:
        e.add_node("cp-1", labels={CP: ""}, annotations={f"{PREFIX}/state": "Ready",
                                                       f"{PREFIX}/config-hash": "a" * 64})
        e.add_node("cp-2", labels={MASTER: ""})
        e.add_node("worker-1", labels={})
        e.create(template())
        yield e


def run_pods(emu: KubeEmulatorExt) -> dict[str, dict[str, Any]]:
    return restorepods.pods_by_node(emu.list_objects("pods", NS))


def kubelet_finishes(emu: KubeEmulatorExt, node: str, phase: str = "Succeeded", **status: Any) -> None:
    name = run_pods(emu)[node]["metadata"]["name"]
    emu.mutate("pods", name, lambda p: p.update(status={"phase": phase, **status}), NS)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def start(api: Api, clock: Clock, lines: list[str], results: list[Result], timeout: float = 60.0) -> threading.Thread:
    t = threading.Thread(target=lambda: results.append(restore_nodes(
        api, namespace=NS, template_name="scheduler-patcher-restore", run="r1", selectors=SELECTORS, prefix=PREFIX,
        timeout=timeout, say=lines.append, clock=clock)), daemon=True)
    t.start()
    return t


def test_one_pod_per_control_plane_node_and_done_when_each_succeeded(emu: KubeEmulatorExt, api: Api) -> None:
    lines: list[str] = []
    results: list[Result] = []
    t = start(api, Clock(), lines, results)
    assert wait_until(lambda: len(run_pods(emu)) == 2, 10)
    pods = run_pods(emu)
    assert sorted(pods) == ["cp-1", "cp-2"]  # the worker gets none; the master-only node does
    assert all(p["spec"]["nodeName"] == n and p["metadata"]["labels"][RUN_LABEL] == "r1" for n, p in pods.items())
    kubelet_finishes(emu, "cp-1")
    assert wait_until(lambda: "node cp-1: restored (pod " in " ".join(lines), 10), lines
    assert t.is_alive()  # cp-2 is not done yet
    assert emu.node_annotations("cp-1") == {f"{PREFIX}/state": "Restored"}  # as a restore on exit leaves it
    kubelet_finishes(emu, "cp-2")
    t.join(10)
    assert not t.is_alive() and results[0].ok
    assert [o.node for o in results[0].outcomes] == ["cp-1", "cp-2"]
    watches = [r.query for r in emu.requests("GET", f"/api/v1/namespaces/{NS}/pods") if r.query.get("watch")]
    assert watches and all(q.get("labelSelector") == f"{RUN_LABEL}=r1" for q in watches)  # this run's pods only


def test_a_node_whose_annotations_cannot_be_updated_is_restored_and_says_so(emu: KubeEmulatorExt,
                                                                           api: Api) -> None:
    emu.fail("PATCH", "/api/v1/nodes/cp-1", 403, times=5)
    lines: list[str] = []
    results: list[Result] = []
    t = start(api, Clock(), lines, results)
    assert wait_until(lambda: len(run_pods(emu)) == 2, 10)
    kubelet_finishes(emu, "cp-1")
    kubelet_finishes(emu, "cp-2")
    t.join(10)
    assert not t.is_alive() and results[0].ok  # the files are restored: a stale annotation does not fail the run
    said = [line for line in lines if line.startswith("node cp-1: restored (pod ")]
    assert len(said) == 1 and "; its annotations were not updated: " in said[0], lines
    assert emu.node_annotations("cp-1")[f"{PREFIX}/state"] == "Ready"
    assert emu.node_annotations("cp-2") == {f"{PREFIX}/state": "Restored"}


def test_the_deadline_names_each_node_not_restored_and_what_its_pod_shows(emu: KubeEmulatorExt, api: Api) -> None:
    lines: list[str] = []
    results: list[Result] = []
    clock = Clock()
    t = start(api, clock, lines, results)
    assert wait_until(lambda: len(run_pods(emu)) == 2, 10)
    kubelet_finishes(emu, "cp-1")
    assert wait_until(lambda: any("cp-1: restored" in line for line in lines), 10), lines
    kubelet_finishes(emu, "cp-2", "Pending", containerStatuses=[
        {"name": "restore", "state": {"waiting": {"reason": "ImagePullBackOff"}}}])
    # said as it happens, not only at the deadline; and only once seen can the deadline describe it
    assert wait_until(lambda: any("restore: ImagePullBackOff" in line for line in lines), 10), lines
    clock.now = 1000.0  # past the deadline; the next change wakes the loop
    kubelet_finishes(emu, "cp-2", "Pending", containerStatuses=[
        {"name": "restore", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "back-off"}}}])
    t.join(10)
    assert not t.is_alive()
    result = results[0]
    assert not result.ok
    assert restorepods.describe(result.outcomes)[0].startswith("node cp-2: waiting (pod scheduler-patcher-restore-")
    assert "restore: ImagePullBackOff" in restorepods.describe(result.outcomes)[0]


def args_for(emu: KubeEmulatorExt, tmp: Any, *extra: str) -> argparse.Namespace:
    return build_parser(load=["restore-nodes"]).parse_args(
        ["restore-nodes", "--kubeconfig", str(emu.write_kubeconfig(tmp / "kc")), "--namespace", NS, *extra])


def test_the_command_exits_0_once_every_node_is_restored(emu: KubeEmulatorExt, tmp_path: Any) -> None:
    out, err = io.StringIO(), io.StringIO()
    codes: list[int] = []
    t = threading.Thread(target=lambda: codes.append(main(args_for(emu, tmp_path), out=out, err=err)), daemon=True)
    t.start()
    assert wait_until(lambda: len(run_pods(emu)) == 2, 10)
    for node in ("cp-1", "cp-2"):
        kubelet_finishes(emu, node)
    t.join(10)
    assert codes == [0], err.getvalue()
    assert out.getvalue().splitlines()[0] == "restoring 2 control-plane node(s): cp-1, cp-2"
    assert out.getvalue().splitlines()[-1] == "every control-plane node is restored (2)"


def test_the_command_refuses_when_it_finds_no_control_plane_node(emu: KubeEmulatorExt, tmp_path: Any) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = main(args_for(emu, tmp_path, "--node-selector", "example.com/none", "--legacy-master-label", "false"),
                out=out, err=err)
    assert code == 1 and "no control-plane node found (example.com/none): nothing restored" in err.getvalue()
    assert not emu.list_objects("pods", NS)


def test_a_missing_pod_template_is_one_line(emu: KubeEmulatorExt, tmp_path: Any) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = main(args_for(emu, tmp_path, "--pod-template", "nope"), out=out, err=err)
    assert code == 1 and err.getvalue().count("\n") == 1 and "podtemplate scheduler-patcher/nope" in err.getvalue()
