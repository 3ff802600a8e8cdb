"""The monitoring objects on the real API server.

The Prometheus Operator's CRDs (tests/harness/real/promcrds.py, from the Go module proxy) are installed into a real
kube-apiserver, then what `helm template` renders with every monitoring switch on and the kustomize overlay
manifests/overlays/monitoring are applied: the server validates each PodMonitor and PrometheusRule against the
CRDs' structural schemas itself (unknown fields pruned or refused), which the offline check only imitates.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.deploy.test_deploy_manifests import MANIFESTS
from tests.harness.real.controlplane import ControlPlane, built_releases, control_plane, missing_reason
from tests.harness.real.helmtool import CHART, MONITORING_VALUES, NAMESPACE, RELEASE, find_helm, run_helm
from tests.harness.real.promcrds import crd_folder, crd_paths

pytestmark = pytest.mark.real_cluster


def apply(cp: ControlPlane, *args: str, stdin: str | None = None) -> str:
    # --validate=strict: a field the CRD's schema does not know is an error, not silently pruned.
    proc = cp.kubectl("apply", "--server-side", "--validate=strict", *args, input=stdin)
    assert proc.returncode == 0, f"kubectl apply {' '.join(args)}:\n{proc.stderr}"
    return proc.stdout


def test_podmonitors_rules_and_dashboard_are_accepted_with_the_operators_crds(tmp_path: Path) -> None:
    if (why := missing_reason()) is not None:
        pytest.skip(why)
    folder, why_not = crd_folder()
    if folder is None:
        pytest.skip(why_not)
    helm, why_no_helm = find_helm()
    if helm is None:
        pytest.skip(f"real helm unavailable ({why_no_helm})")
    with control_plane(built_releases()[0], tmp_path / "cp") as cp:
        for crd in crd_paths():
            apply(cp, "-f", str(crd))
        proc = cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                          "crd/podmonitors.monitoring.coreos.com", "crd/prometheusrules.monitoring.coreos.com")
        assert proc.returncode == 0, proc.stderr
        cp.ensure_namespace(NAMESPACE)
        render = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, values=MONITORING_VALUES,
                          tmp=tmp_path)
        assert render.returncode == 0, render.stderr
        out = apply(cp, "-f", "-", stdin=render.stdout)
        assert "podmonitor.monitoring.coreos.com/" in out and "prometheusrule.monitoring.coreos.com/" in out, out
        out = apply(cp, "-k", str(MANIFESTS / "overlays/monitoring"), "--force-conflicts")
        assert "podmonitor.monitoring.coreos.com/" in out, out
        stored = json.loads(cp.kubectl("get", "podmonitors,prometheusrules", "-A", "-o", "json").stdout)["items"]
        rules = [r for o in stored if o["kind"] == "PrometheusRule" for g in o["spec"]["groups"] for r in g["rules"]]
        assert rules and all("alert" in r and r["expr"] for r in rules), rules
        dashboards = cp.ok("GET", f"/api/v1/namespaces/{NAMESPACE}/configmaps?labelSelector=grafana_dashboard%3D1")
        assert dashboards["items"], "the dashboard ConfigMap is missing"
