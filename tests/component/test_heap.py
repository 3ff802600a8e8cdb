"""The collector settling (``adapters/heap``): in child interpreters, so this worker's own collector is left alone.

What is checked is what the agent relies on: after ``settle``, a full collection no longer walks what was alive
(the figure that made the ConfigMap swap's p99, issue 12), garbage from before was collected rather than kept
forever, and garbage made afterwards is still collected.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import write_configmap
from tests.harness.childproc import ROOT, Child
from tests.harness.emu.kubeemu import KubeEmulator

SETTLE = """
import gc, json, weakref
import ruamel.yaml, watchdog.observers  # a heap of the agent's size: modules, classes, functions
from patcher.adapters import heap

class Node:
    pass

before_garbage = Node(); before_garbage.me = before_garbage  # a cycle: only the collector frees it
dead_before = weakref.ref(before_garbage); del before_garbage
walked_before = len(gc.get_objects())
frozen = heap.settle("test")
walked_after = len(gc.get_objects())

after_garbage = Node(); after_garbage.me = after_garbage
dead_after = weakref.ref(after_garbage); del after_garbage
gc.collect()
print(json.dumps({"frozen": frozen, "walked_before": walked_before, "walked_after": walked_after,
                  "before_collected": dead_before() is None, "after_collected": dead_after() is None,
                  "again": heap.settle("test again")}))
"""


def _settle_in_child() -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", SETTLE], env=env, capture_output=True, text=True, check=True,
                         timeout=60).stdout
    result: dict[str, object] = json.loads(out)
    return result


def test_settle_takes_the_living_heap_out_of_every_later_walk() -> None:
    r = _settle_in_child()
    walked_before, walked_after, frozen = r["walked_before"], r["walked_after"], r["frozen"]
    assert isinstance(walked_before, int) and isinstance(walked_after, int) and isinstance(frozen, int)
    assert walked_before > 10_000 and frozen > 10_000
    assert walked_after < walked_before // 20  # what a full collection still walks: a few objects, not the heap


def test_garbage_from_before_is_collected_not_frozen_and_garbage_made_after_is_still_collected() -> None:
    r = _settle_in_child()
    assert r["before_collected"] is True  # settle collects first: nothing dead is kept forever
    assert r["after_collected"] is True  # freezing is not disabling
    again = r["again"]
    assert isinstance(again, int) and again < 1_000  # a second settle freezes only what came since


def test_the_agent_settles_its_heap_at_start_up_and_once_the_api_client_is_built(tmp_path: Path) -> None:
    root = tmp_path / "node"
    (root / "etc/kubernetes/manifests").mkdir(parents=True)
    (root / "etc/kubernetes/manifests/kube-scheduler.yaml").write_bytes(
        (ROOT / "tests/fixtures/manifests/kubeadm.yaml").read_bytes())
    src = tmp_path / "src"
    src.mkdir()
    write_configmap(src, {"extenders.yaml": "extenders:\n- urlPrefix: http://127.0.0.1:8889\n  weight: 1\n"})
    with KubeEmulator() as emu:
        emu.add_node("cp-1")
        child = Child("run", "--host-root", str(root), "--source", str(src), "--listen", "127.0.0.1:0",
                      "--rollout", "independent", "--log-level", "debug",
                      env={"NODE_NAME": "cp-1", "KUBECONFIG": str(emu.write_kubeconfig(tmp_path / "kc"))})
        try:
            start_up = int(child.wait_line(r"heap settled after start-up: (\d+) objects").group(1))
            client = int(child.wait_line(r"heap settled after API client built: (\d+) objects").group(1))
        finally:
            assert child.terminate() == 0, child.output
    assert start_up > 10_000
    assert client > 20_000  # the Kubernetes client's model classes: the bulk of the agent's heap
