"""The agent's API path loads the official client's transport only (``kube.lightimport``,
``kube.transport``), and the light packages complete themselves for everyone else.

Each case runs in a fresh interpreter: which modules a process loads depends on what it imported before, and
pytest's own process has imported the whole client long ago.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from patcher.core.status import NodeState
from tests.harness.emu.kubeemu import KubeEmulator, make_mirror_pod, tls_available, wait_until
from tests.harness.helpers import NODE, P

ROOT = Path(__file__).resolve().parents[2]

#: What the agent's API path must never load: the generated client (pydantic, the APIs and models), the
#: kubeconfig loader and what it pulls in, and the rest of the package.
HEAVY = ("pydantic", "kubernetes.client.api_client", "kubernetes.client.models", "kubernetes.client.api",
         "kubernetes.config.kube_config", "kubernetes.dynamic", "kubernetes.watch", "kubernetes.stream",
         "kubernetes_validate", "jsonschema", "yaml", "oauthlib", "requests", "google.auth")

HEAVY_LOADED = """
def heavy_loaded():
    import sys
    return sorted(m for m in sys.modules for h in HEAVY if m == h or m.startswith(h + "."))
"""


def run_child(code: str, *args: str, env: dict[str, str] | None = None) -> Any:
    """Run ``code`` in a fresh interpreter; its last stdout line, decoded from JSON."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    full_env.pop("KUBECONFIG", None)
    prelude = f"HEAVY = {HEAVY!r}\n{HEAVY_LOADED}\n"
    proc = subprocess.run([sys.executable, "-c", prelude + code, *args], env=full_env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


LIGHT_THEN_FULL = """
import json, sys
import patcher.adapters.kube.client  # installs the light packages
from patcher.adapters.kube import lightimport
light = [lightimport.is_light(m) for m in lightimport.PACKAGES]
before = heavy_loaded()

import kubernetes
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from patcher.adapters.kube import errors
same_classes = k8s.Configuration is k8s.configuration.Configuration and errors.ApiException is ApiException
api_class = k8s.CoreV1Api.__name__                      # completes kubernetes.client
model = k8s.V1Pod(metadata=k8s.V1ObjectMeta(name="p")).metadata.name
from kubernetes.client import V1Node                    # `from` import of a name the light module lacked
loader = kubernetes.config.load_kube_config.__name__    # completes kubernetes.config
watch = kubernetes.watch.Watch.__name__                 # completes kubernetes (its __init__ imports the rest)
from kubernetes.dynamic import DynamicClient
from kubernetes.utils import create_from_yaml           # completes kubernetes.utils
import importlib.metadata
print(json.dumps({"light": light, "before": before, "same": same_classes, "api": api_class, "model": model,
                  "node": V1Node.__name__, "loader": loader, "watch": watch, "dynamic": DynamicClient.__name__,
                  "utils": create_from_yaml.__name__,
                  "version": kubernetes.__version__ == importlib.metadata.version("kubernetes"),
                  "still_light": [lightimport.is_light(m) for m in lightimport.PACKAGES],
                  "after": "kubernetes.client.api_client" in sys.modules}))
"""


def test_the_light_packages_complete_themselves_on_the_first_missing_name() -> None:
    out = run_child(LIGHT_THEN_FULL)
    assert out["light"] == [True, True, True, True] and out["before"] == []
    assert out["same"] is True
    assert (out["api"], out["model"], out["node"]) == ("CoreV1Api", "p", "V1Node")
    assert (out["loader"], out["watch"], out["dynamic"], out["utils"]) == (
        "load_kube_config", "Watch", "DynamicClient", "create_from_yaml")
    assert out["version"] is True
    assert out["still_light"] == [False, False, False, False] and out["after"] is True


FULL_FIRST = """
import json
import kubernetes  # a process that imported the client normally first: install() leaves it alone
from patcher.adapters.kube import lightimport
import patcher.adapters.kube.client
print(json.dumps({"installed": lightimport.install(), "light": [lightimport.is_light(m) for m in lightimport.PACKAGES],
                  "api": "kubernetes.client.api_client" in __import__("sys").modules}))
"""


def test_a_client_imported_normally_first_is_left_as_it_is() -> None:
    assert run_child(FULL_FIRST) == {"installed": False, "light": [False] * 4, "api": True}


AGENT_API_PATH = """
import json, sys, time
from patcher.adapters.kube.client import ClientSettings, build_api_client, server_version
from patcher.adapters.kube.mirrorpod import MirrorPodWatcher, mirror_pod_name
from patcher.adapters.kube.owner import OwnerWatcher
from patcher.services.rollout import RolloutLease
from patcher.adapters.kube.publish import NodeReporter, StatusPublisher, StatusTarget
from patcher.core.status import NodeState, NodeStatus

token, ca, node = sys.argv[1:4]
env = {k: v for k, v in __import__("os").environ.items() if k.startswith("KUBERNETES_SERVICE_")}
api = build_api_client(ClientSettings(token_file=token, ca_file=ca, timeout=(2.0, 5.0)), env)
version = server_version(api)
reporter = NodeReporter(api, node, prefix="scheduler-patcher.io/")
reporter.start()
reporter.publish(NodeStatus(NodeState.READY))
delivered = reporter.flush(30)
pods = MirrorPodWatcher(api, "kube-system", mirror_pod_name("kube-scheduler", node))
pods.start()
synced = pods.wait_synced(30)
end = time.monotonic() + 30
while not pods.fresh and time.monotonic() < end:  # listed, and the watch from that list is open
    time.sleep(0.01)
lease = RolloutLease(api, "scheduler-patcher", "scheduler-patcher-rollout", node)
lease.acquire()
held = lease.settle(30)
StatusPublisher(api, StatusTarget(namespace="scheduler-patcher", prefix="scheduler-patcher.io/",
                                  static_pod_name="kube-scheduler", mirror_namespace="kube-system",
                                  compat_csi_baremetal=False, compat_namespace=None)).publish_once()
result = {"version": version, "delivered": delivered, "synced": synced, "fresh": pods.fresh,
          "pod": (pods.latest() or {}).get("metadata", {}).get("name"), "held": held, "heavy": heavy_loaded(),
          "kubeconfig_loader": "kubernetes.config.kube_config" in sys.modules}
lease.close(5)
pods.stop()
reporter.close()
api.close()
print(json.dumps(result))
"""


@pytest.mark.skipif(not tls_available(), reason="the openssl tool is needed to make certificates")
def test_the_agents_api_path_in_cluster_loads_no_generated_client(tmp_path: Path) -> None:
    # What the DaemonSet runs: the in-cluster service account, a Node patch and an Event, the mirror pod's list
    # and watch, the rollout Lease, the status ConfigMap, /version; none of it may load the heavy modules.
    with KubeEmulator(tls=True, token="t0ken", git_version="v1.31.2") as emu:
        emu.add_node(NODE)
        emu.set_pod(make_mirror_pod(node_name=NODE))
        env, token, ca = emu.incluster_files(tmp_path)
        out = run_child(AGENT_API_PATH, str(token), str(ca), NODE, env=env)
        node = emu.get("nodes", NODE)
        assert node is not None
        assert node["metadata"]["annotations"][f"{P}state"] == NodeState.READY.value
        assert emu.list_objects("events") and emu.get("configmaps", "scheduler-patcher-status", "scheduler-patcher")
        assert {r.headers["authorization"].lower() for r in emu.requests()} == {"bearer t0ken"}
        wait_until(lambda: emu.open_watches == 0, 10)  # the child closed its watch on the way out
    assert out["heavy"] == [] and out["kubeconfig_loader"] is False
    assert (out["version"], out["delivered"], out["synced"], out["fresh"], out["held"]) == (
        "v1.31.2", True, True, True, True)
    assert out["pod"] == f"kube-scheduler-{NODE}"
