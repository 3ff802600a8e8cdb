"""The way a user's cluster gets the agent: its image and chart from a registry, the controllers placing it.

One node `kubeadm init` made (tests/harness/real/kubeadm_node.py) of the newest built release, and a local registry
(tests/harness/real/registry.py: Debian's docker-registry, TLS with its own CA, auth on) in the node's network. The
project's image is pushed there with podman, the chart with `helm push`; `helm install oci://...` installs it, the
node's containerd pulls the image (it trusts the registry's CA through its hosts folder; the credentials come only
from the pod's imagePullSecret), kubeadm's kube-controller-manager (the DaemonSet controller) and kube-scheduler place
the agent, the agent patches kubeadm's manifest (the newest release's `kubeadm init` manifest: the bytes of
tests/fixtures/kubeadm/, as tests/real/test_real_kubeadm.py holds the older releases to) and the kubelet restarts the
scheduler with `--config`. `helm uninstall` runs the chart's hooks as a user's cluster does (their Jobs' pods on the
node's pod network, their image pulled from the registry): the pre-delete `stop-agents`, then the post-delete
`restore-nodes`; it gives kubeadm its bytes back, and the garbage collector takes the agent's pod.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from tests.harness.real.agent_image import agent_image, podman_missing
from tests.harness.real.controlplane import Binaries, wait_until
from tests.harness.real.helmtool import CHART, find_helm
from tests.harness.real.kubeadm_node import ADDRESS, MANIFESTS, KubeadmNode, kubeadm_node, releases_with_kubeadm
from tests.harness.real.registry import Registry, net_prefix, registry_missing, serving
from tests.real.test_real_kubeadm import (
    CONFIG_DIR,
    command_of,
    extenders_of,
    kubeadms_manifest,
    replaced,
    require_kubeadm,
)

pytestmark = pytest.mark.real_kubeadm

NAMESPACE = "scheduler-patcher"
RELEASE = "scheduler-patcher"
SECRET = "registry-credentials"
PREFIX = "scheduler-patcher.io/"
#: Ignorable and unserved: the agent's pre-flight calls it and goes on; the scheduler loads it (its /configz shows
#: it) and calls it only to schedule a pod, which nothing here asks of it.
EXTENDER = "http://127.0.0.1:8889"
T = TypeVar("T")


def require(why: str | None) -> None:
    """Skips with `why`, or fails under CI=true (where nothing may skip)."""
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the registry test cannot run under CI=true: {why}")
        pytest.skip(why)


def newest() -> Binaries:
    releases = releases_with_kubeadm()
    return require_kubeadm(releases[0].version) if releases else require_kubeadm("none")


#: No kube-proxy runs on the node (kubeadm's was disabled: no image of it is built here), so nothing routes the
#: `kubernetes` Service's ClusterIP: the agent and the hook Jobs are told the API server's address as any variable
#: is set (a container's own variables win over the kubelet's KUBERNETES_SERVICE_*). The hooks' pods, on the node's
#: pod network (`pod_addresses`), reach that address: it is the node's own.
API_ENV = [{"name": "KUBERNETES_SERVICE_HOST", "value": ADDRESS}, {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}]


def install_values(reg: Registry, tag: str) -> dict[str, Any]:
    """What a user of a private registry sets, and the API server's address this node needs (`API_ENV`)."""
    return {
        "image": {"repository": f"{reg.host}/scheduler-patcher", "tag": tag, "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": SECRET}],
        "extenders": [{"urlPrefix": EXTENDER, "filterVerb": "filter", "weight": 1, "ignorable": True}],
        "extraEnv": API_ENV,
        "stopAgentsJob": {"extraEnv": API_ENV},
        "restoreJob": {"extraEnv": API_ENV},
    }


def hook_job(node: KubeadmNode, name: str) -> tuple[dict[str, Any], str]:
    """A hook's Job (kept after it finished, for its logs) and its pod's log."""
    job = node.get(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/{name}")
    assert job is not None, f"the hook Job {name} is not there"
    logs = node.kubectl("logs", f"job/{name}", "-n", NAMESPACE)
    return job, logs.stdout + logs.stderr


def waiting_pod(image: str, node: KubeadmNode) -> dict[str, Any]:
    """A pod of the agent's image without the imagePullSecret, on the node (no scheduler involved)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "no-pull-secret", "namespace": NAMESPACE},
            "spec": {"nodeName": node.name, "hostNetwork": True, "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "agent", "image": image, "imagePullPolicy": "Always",
                                     "args": ["--version"]}]}}


def pull_error(node: KubeadmNode) -> tuple[str, str] | None:
    """(reason, message) of the secretless pod's waiting container once its pull failed."""
    pod = node.get(f"/api/v1/namespaces/{NAMESPACE}/pods/no-pull-secret")
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
    waiting = statuses[0].get("state", {}).get("waiting", {}) if statuses else {}
    if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff"):
        return waiting["reason"], waiting.get("message", "")
    return None


def agent_pods(node: KubeadmNode) -> list[dict[str, Any]]:
    found = node.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=app.kubernetes.io/component%3Dagent")
    return list((found or {}).get("items") or [])


def node_annotations(node: KubeadmNode) -> dict[str, str]:
    got = node.get(f"/api/v1/nodes/{node.name}") or {}
    return {k[len(PREFIX):]: v for k, v in (got["metadata"].get("annotations") or {}).items() if k.startswith(PREFIX)}


def images(node: KubeadmNode) -> set[str]:
    return set(node.ctr("images", "ls", "-q").split())


def kubectl_ok(node: KubeadmNode, *args: str) -> str:
    proc = node.kubectl(*args)
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
    return proc.stdout


@pytest.mark.timeout(1500)
def test_helm_installs_the_agent_from_the_registry_and_uninstalls_to_kubeadms_bytes(tmp_path: Path) -> None:
    """Registry up (401 without credentials); image and chart pushed; the image not in the node's containerd; a pod
    without the pull secret -> ErrImagePull/ImagePullBackOff for want of authorization, the image still absent;
    `helm install oci://...` (image pull policy Always, the pull secret) -> the DaemonSet controller's pod on the
    node, the image pulled into containerd (the kubelet's Pulled event), kubeadm's manifest patched, the scheduler
    restarted with `--config` and the extender, the node's `state` annotation Ready, the pod Ready. `helm
    uninstall` (both hook Jobs run and succeed) -> kubeadm's bytes, kubeadm's scheduler under its first hash, the
    agent's pod gone."""
    binaries = newest()
    require(registry_missing())
    require(podman_missing())
    helm, why = find_helm()
    require(None if helm else why)
    assert helm is not None
    times: dict[str, float] = {}

    def timed(step: str, action: Callable[[], T]) -> T:
        started = time.monotonic()
        result = action()
        times[step] = time.monotonic() - started
        return result

    image = timed("agent image (podman build/save when missing)", agent_image)
    tag = image.name.rsplit(":", 1)[1]
    reg = Registry(tmp_path / "registry", ADDRESS, ()).prepare()
    hosts = reg.hosts_dir(tmp_path / "containerd-hosts")
    with kubeadm_node(binaries, tmp_path / "kubeadm", registry_config=hosts, pod_addresses=True) as node:
        times["node runtime and images"], times["kubeadm init"] = node.runtime_in, node.init_in
        reg.netns = net_prefix(node.init_pid)
        with serving(reg):
            times["registry start"] = reg.started_in
            ref = timed("podman push", lambda: reg.push_image(image.name, "scheduler-patcher", tag))
            chart = timed("helm package + login + push", lambda: reg.push_chart(helm, CHART))
            manifest = node.host(f"{MANIFESTS}/kube-scheduler.yaml")
            written = manifest.read_bytes()
            # what tests/unit/test_kubeadm_written.py patches (the per-release test holds the older releases to it)
            assert written == kubeadms_manifest(binaries.version), written.decode()
            first_id, first_pod = wait_until(node.running, 300, lambda: f"kubeadm's scheduler\n{node.log('kubelet')}")
            first_hash = first_pod["metadata"]["annotations"]["kubernetes.io/config.hash"]
            assert ref not in images(node)

            kubectl_ok(node, "create", "namespace", NAMESPACE)
            pod_file = tmp_path / "no-pull-secret.json"
            pod_file.write_text(json.dumps(waiting_pod(ref, node)))
            kubectl_ok(node, "create", "-f", str(pod_file))
            reason, message = timed("pull refused without the secret", lambda: wait_until(
                lambda: pull_error(node), 300, f"the secretless pull refused\n{node.log('kubelet')}"))
            assert "authoriz" in message.lower() or "401" in message, (reason, message)
            print(f"\nwithout the pull secret: {reason}: {message}")
            assert ref not in images(node)
            kubectl_ok(node, "delete", "pod", "no-pull-secret", "-n", NAMESPACE, "--wait=false")

            secret = tmp_path / "dockerconfig.json"
            secret.write_text(reg.docker_config_json())
            kubectl_ok(node, "create", "secret", "generic", SECRET, "-n", NAMESPACE,
                       "--type=kubernetes.io/dockerconfigjson", f"--from-file=.dockerconfigjson={secret}")
            values = tmp_path / "values.json"
            values.write_text(json.dumps(install_values(reg, tag)))
            version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
            admin = str(node.host("/etc/kubernetes/admin.conf"))
            installed_at = time.monotonic()
            proc = reg.helm(helm, "install", RELEASE, chart, "--version", version, "--ca-file", str(reg.ca),
                            "--namespace", NAMESPACE, "--kubeconfig", admin, "-f", str(values))
            assert proc.returncode == 0, f"helm install {chart}: {proc.stderr}"
            times["helm install (command)"] = time.monotonic() - installed_at

            def placed() -> dict[str, Any] | None:
                pods = [p for p in agent_pods(node) if p["spec"].get("nodeName")]
                return pods[0] if pods else None
            pod = wait_until(placed, 300, lambda: f"the DaemonSet's pod bound\n{node.log('kube-controller-manager')}")
            times["install -> agent pod bound"] = time.monotonic() - installed_at
            (owner,) = pod["metadata"]["ownerReferences"]
            assert owner["kind"] == "DaemonSet" and pod["spec"]["nodeName"] == node.name, pod["metadata"]
            wait_until(lambda: ref in images(node), 600, lambda: f"the image pulled\n{node.log('kubelet')}")
            times["install -> image in containerd"] = time.monotonic() - installed_at
            events = node.get(f"/api/v1/namespaces/{NAMESPACE}/events?fieldSelector=involvedObject.name%3D"
                              f"{pod['metadata']['name']}") or {}
            assert "Pulled" in {e["reason"] for e in events.get("items", [])}, events

            wait_until(lambda: manifest.read_bytes() != written, 300,
                       lambda: f"the agent's write\n{node.log('kubelet')}")
            times["install -> manifest patched"] = time.monotonic() - installed_at
            second_id, second_pod = replaced(node, first_id)
            times["install -> scheduler restarted with --config"] = time.monotonic() - installed_at
            configs = [w for w in command_of(second_pod) if w.startswith("--config=")]
            assert len(configs) == 1 and configs[0].startswith(f"--config={CONFIG_DIR}/"), command_of(second_pod)
            wait_until(lambda: node_annotations(node).get("state") == "Ready", 300,
                       lambda: f"the agent Ready: {node_annotations(node)}\n{node.log('kubelet')}")
            times["install -> node annotation Ready"] = time.monotonic() - installed_at

            def pod_ready() -> bool:
                now = next(iter(agent_pods(node)), {})
                conditions = (now.get("status") or {}).get("conditions") or []
                return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            wait_until(pod_ready, 300, "the agent's pod Ready (/readyz)")
            times["install -> agent pod Ready"] = time.monotonic() - installed_at
            assert extenders_of(node) == [EXTENDER]

            uninstalled_at = time.monotonic()
            proc = reg.helm(helm, "uninstall", RELEASE, "--namespace", NAMESPACE, "--kubeconfig", admin)
            assert proc.returncode == 0, f"helm uninstall: {proc.stderr}\n{node.log('kubelet')}"
            times["helm uninstall (command, both hooks)"] = time.monotonic() - uninstalled_at
            # helm waited for each hook's Job: the pre-delete one ended with the agents' pods, the post-delete one
            # with every control-plane node restored (here by the agent already: its pod's `restore` wrote nothing)
            stop_job, stop_log = hook_job(node, "scheduler-patcher-stop-agents")
            assert (stop_job.get("status") or {}).get("succeeded") == 1, stop_job.get("status")
            assert "and its pods are gone" in stop_log, stop_log
            restore_job, restore_log = hook_job(node, "scheduler-patcher-restore")
            assert (restore_job.get("status") or {}).get("succeeded") == 1, restore_job.get("status")
            assert node.name in restore_log, restore_log
            print(f"\nhook stop-agents: {stop_log.strip()}\nhook restore-nodes: {restore_log.strip()}")
            wait_until(lambda: manifest.read_bytes() == written, 300,
                       lambda: f"kubeadm's bytes back\n{node.log('kubelet')}")
            times["uninstall -> kubeadm's bytes"] = time.monotonic() - uninstalled_at
            _, third_pod = replaced(node, second_id)
            assert third_pod["metadata"]["annotations"]["kubernetes.io/config.hash"] == first_hash
            times["uninstall -> kubeadm's scheduler running"] = time.monotonic() - uninstalled_at
            wait_until(lambda: not agent_pods(node), 300, "the agent's pod gone (the garbage collector)")
            times["uninstall -> agent pod gone"] = time.monotonic() - uninstalled_at
            assert node.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/scheduler-patcher") is None
            assert manifest.read_bytes() == written
    print(f"\nregistry journey on kubeadm v{binaries.version} ({image.size / 2**20:.0f} MiB image):")
    for step, seconds in times.items():
        print(f"  {step}: {seconds:.1f} s")
