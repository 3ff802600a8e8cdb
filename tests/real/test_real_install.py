"""Install for real: every kustomize overlay and the Helm chart applied to the real kube-apiserver.

The offline tests validate the rendered objects against OpenAPI schemas; only the server runs its own validation,
defaulting, admission and the admission policy's CEL compilation. Each release's control plane gets every
kustomization applied as a user applies it (`kubectl apply -k --server-side`), and a fresh control plane gets
`helm install` with the defaults, then with every value set, then `helm upgrade`: helm's `lookup` (the webhook's
generated CA, kept across upgrades) meets a real server too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.test_chart_values import ALL_VALUES
from tests.deploy.test_deploy_manifests import COMPAT, GATE_WEBHOOK, INSTALL, MANIFESTS, UNINSTALL
from tests.harness.real.controlplane import ControlPlane, built_releases, control_plane, missing_reason
from tests.harness.real.gomodfiles import cert_manager_crds
from tests.harness.real.helmtool import CHART, find_helm, run_helm
from tests.harness.real.promcrds import crd_folder, crd_paths

pytestmark = pytest.mark.real_cluster

#: The admission-policy overlays, by the admissionregistration version their MutatingAdmissionPolicy uses.
ADMISSION_OVERLAYS = {"v1": "overlays/gatekeeper-admission", "v1beta1": "overlays/gatekeeper-admission-v1beta1"}
#: The one warning a folder is meant to draw: master-label exists for clusters whose control-plane nodes carry
#: only the label the server calls deprecated, and the restore Job also reaches such nodes (its second term).
MASTER_TERM = ("spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution."
               "nodeSelectorTerms[1].matchExpressions[0].key: node-role.kubernetes.io/master is use "
               '"node-role.kubernetes.io/control-plane" instead')
EXPECTED_WARNINGS = {"overlays/master-label": ['spec.template.spec.nodeSelector[node-role.kubernetes.io/master]: '
                                               'use "node-role.kubernetes.io/control-plane" instead'],
                     **{folder: [MASTER_TERM] for folder in UNINSTALL}}


def served(cp: ControlPlane, group_version: str, kind: str) -> bool:
    status, out = cp.request("GET", f"/apis/{group_version}")
    return status == 200 and any(r["kind"] == kind for r in out["resources"])


def apply_k(cp: ControlPlane, folder: str) -> str:
    proc = cp.kubectl("apply", "-k", str(MANIFESTS / folder), "--server-side", "--force-conflicts")
    assert proc.returncode == 0, f"kubectl apply -k manifests/{folder}:\n{proc.stderr}"
    warnings = [line.removeprefix("Warning: ") for line in proc.stderr.splitlines() if line.startswith("Warning")]
    # A subset: the server warns when it stores a change, and an earlier folder may have stored the same object.
    unexpected = set(warnings) - set(EXPECTED_WARNINGS.get(folder, []))
    assert not unexpected, f"manifests/{folder}: the server warned:\n{proc.stderr}"
    return proc.stdout


def install_cert_manager_crds(cp: ControlPlane) -> None:
    for crd in cert_manager_crds():
        proc = cp.kubectl("apply", "--server-side", "-f", str(crd))
        assert proc.returncode == 0, proc.stderr
    proc = cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/certificates.cert-manager.io",
                      "crd/issuers.cert-manager.io")
    assert proc.returncode == 0, proc.stderr


def install_prometheus_crds(cp: ControlPlane) -> None:
    folder, why = crd_folder()
    if folder is None:
        pytest.skip(why)
    for crd in crd_paths():
        proc = cp.kubectl("apply", "--server-side", "-f", str(crd))
        assert proc.returncode == 0, proc.stderr
    proc = cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                      "crd/podmonitors.monitoring.coreos.com", "crd/prometheusrules.monitoring.coreos.com")
    assert proc.returncode == 0, proc.stderr


def test_every_kustomization_is_accepted_by_the_real_server(real_release: ControlPlane) -> None:
    cp = real_release
    install_cert_manager_crds(cp)
    install_prometheus_crds(cp)
    folders = [*INSTALL, *COMPAT, "gatekeeper", *GATE_WEBHOOK[1:], "overlays/monitoring", *UNINSTALL]
    for version, overlay in ADMISSION_OVERLAYS.items():
        if served(cp, f"admissionregistration.k8s.io/{version}", "MutatingAdmissionPolicy"):
            folders.append(overlay)
    assert any(f in folders for f in ADMISSION_OVERLAYS.values()), "no admission policy API served"
    for folder in folders:
        out = apply_k(cp, folder)
        assert "serverside-applied" in out, out
        if folder in UNINSTALL:  # one restore Job a cluster: its pod template is immutable, so the next folder's
            proc = cp.kubectl("delete", "job", "scheduler-patcher-restore", "-n", "scheduler-patcher")  # is new
            assert proc.returncode == 0, proc.stderr
    # What the server stored is what it accepted: the policy's CEL compiled (a compile error is a 422 on create).
    kinds = json.loads(cp.kubectl("get", "mutatingadmissionpolicies,mutatingadmissionpolicybindings,daemonsets,"
                                  "deployments,roles,clusterroles,issuers,certificates", "-A", "-o", "json").stdout)
    names = {(o["kind"], o["metadata"]["name"]) for o in kinds["items"]}
    assert ("DaemonSet", "scheduler-patcher") in names and ("Deployment", "scheduler-patcher-gatekeeper") in names
    assert any(kind == "MutatingAdmissionPolicy" for kind, _ in names), names


# -- helm -----------------------------------------------------------------------------------------------------


def helm_or_skip() -> str:
    helm, why = find_helm()
    if helm is None:
        pytest.skip(f"real helm unavailable ({why})")
    return helm


def helm(cp: ControlPlane, helm_bin: str, tmp: Path, *args: str, values: dict[str, Any] | None = None) -> str:
    proc = run_helm(helm_bin, *args, "--kubeconfig", str(cp.kubeconfig), values=values, tmp=tmp)
    assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stderr}"
    return proc.stdout


def helm_objects(cp: ControlPlane, helm_bin: str, tmp: Path, release: str, namespace: str) -> list[dict[str, Any]]:
    manifest = helm(cp, helm_bin, tmp, "get", "manifest", release, "--namespace", namespace)
    return [d for d in yaml.safe_load_all(manifest) if isinstance(d, dict)]


def every_switch_on(minor: int) -> dict[str, Any]:
    """ALL_VALUES (every leaf of the schema set) with the admission policy at the API version this minor serves."""
    values: dict[str, Any] = json.loads(json.dumps(ALL_VALUES))
    values["gatekeeper"].setdefault("admission", {})["apiVersion"] = "v1" if minor >= 36 else "v1beta1"
    return values


@pytest.mark.parametrize("version", [b.version for b in built_releases()[:1]] or ["none"])
def test_helm_install_then_upgrade_on_the_real_server(version: str, tmp_path: Path) -> None:
    """Defaults first, then every value set (`helm upgrade`), then the defaults again: each step is accepted, and
    the webhook's generated CA, looked up from the server, survives the upgrade."""
    if (why := missing_reason()) is not None:
        pytest.skip(why)
    helm_bin = helm_or_skip()
    binaries = next(b for b in built_releases() if b.version == version)
    with control_plane(binaries, tmp_path / "cp") as cp:
        cp.ensure_namespace("scheduler-patcher")
        cp.ensure_namespace("csi")  # csi-baremetal's namespace, which ALL_VALUES points the agents' Role at
        cp.ensure_namespace("monitoring")  # where ALL_VALUES puts the dashboard (the Grafana sidecar watches it)
        install_prometheus_crds(cp)  # ALL_VALUES turns the PodMonitors and the PrometheusRule on
        values = every_switch_on(binaries.minor)
        helm(cp, helm_bin, tmp_path, "install", "sp", str(CHART), "--namespace", "scheduler-patcher", "--wait=false")
        first = {(o["kind"], o["metadata"]["name"]) for o in helm_objects(cp, helm_bin, tmp_path, "sp",
                                                                             "scheduler-patcher")}
        assert ("DaemonSet", "scheduler-patcher") in first
        values["namespace"]["create"] = False  # the release namespace exists: helm would not adopt it
        helm(cp, helm_bin, tmp_path, "upgrade", "sp", str(CHART), "--namespace", "scheduler-patcher", values=values)
        secret = cp.ok("GET", "/api/v1/namespaces/scheduler-patcher/secrets/scheduler-patcher-gatekeeper-webhook-tls")
        helm(cp, helm_bin, tmp_path, "upgrade", "sp", str(CHART), "--namespace", "scheduler-patcher", values=values)
        again = cp.ok("GET", "/api/v1/namespaces/scheduler-patcher/secrets/scheduler-patcher-gatekeeper-webhook-tls")
        assert again["data"] == secret["data"], "helm upgrade replaced the webhook's certificate"
        webhook = cp.ok("GET", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
                               "scheduler-patcher-gate")
        assert webhook["webhooks"][0]["clientConfig"]["caBundle"]
        kinds = {(o["kind"], o["metadata"]["name"]) for o in helm_objects(cp, helm_bin, tmp_path, "sp",
                                                                             "scheduler-patcher")}
        assert {"MutatingAdmissionPolicy", "MutatingWebhookConfiguration"} <= {k for k, _ in kinds}
        helm(cp, helm_bin, tmp_path, "upgrade", "sp", str(CHART), "--namespace", "scheduler-patcher")
